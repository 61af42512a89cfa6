"""The watchdog's wait for a crashed engine's GPU memory before a restart (`lanectl/host/gpu_memory.py`), on a clock
and an nvidia-smi answer of the test's own."""

from __future__ import annotations

import itertools

from lanectl.host.gpu_memory import wait_for_release


class Gpus:
    """nvidia-smi's memory.used per GPU, one answer per query, then the last one for ever."""

    def __init__(self, *answers: dict[str, int]):
        self.answers = list(answers)

    def __call__(self, device_ids: list[str] | None) -> dict[str, int]:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def waited(gpus: Gpus, kept_mib: int = 0, timeout: float = 120) -> str:
    clock = itertools.count(0, 2)  # each query two seconds after the last
    return wait_for_release(["0", "1"], timeout, kept_mib, clock=lambda: next(clock), sleep=lambda s: None,
                            query=gpus)


def test_the_wait_ends_once_every_gpu_has_released_the_crashed_engines_memory():
    assert waited(Gpus({"0": 70_000, "1": 70_000}, {"0": 60_000, "1": 300}, {"0": 500, "1": 300})) == \
        "GPU memory released after 6 s"


def test_beside_a_standby_the_wait_allows_what_it_said_it_keeps_asleep():
    """A restart beside a standby asleep on the same GPUs: the standby keeps ~4 GiB. Counted as held, the wait ran
    to its timeout every time; it ends once the crashed engine's memory alone is released."""
    asleep = {"0": 4_400, "1": 4_400}
    crashed = {"0": 74_000, "1": 74_000}
    assert waited(Gpus(crashed, asleep), kept_mib=4_096) == \
        "GPU memory released after 4 s, beside the 4096 MiB a standby keeps asleep"
    assert waited(Gpus(crashed, asleep), timeout=10) == \
        "GPU memory still held after 10 s ({'0': 4400, '1': 4400} MiB); relaunching anyway"


def test_the_memory_kept_beside_is_what_the_standbys_on_the_lanes_gpus_recorded():
    from lanectl.state.standby import StandbyRecord, StandbyState
    from lanectl.watchdog.runner import kept_asleep_mib
    from tests.switch_box import fingerprint, repo_catalog

    catalog = repo_catalog()
    record = StandbyRecord(lane="demo-h1", since="2026-12-01T00:00:00.000Z", fingerprint=fingerprint(),
                           resident_gib=4.25)
    assert kept_asleep_mib(catalog, StandbyState().with_standby(record), catalog.lanes["demo-h2"]) == 4352
    unmeasured = StandbyState().with_standby(StandbyRecord(lane="demo-h1", since="2026-12-01T00:00:00.000Z",
                                                           fingerprint=fingerprint()))
    assert kept_asleep_mib(catalog, unmeasured, catalog.lanes["demo-h2"]) == 0
