"""Xid lines as drivers print them (kernel_rc.c's format strings) and as they were reported in public issues."""

from __future__ import annotations

import pytest

from lanectl.host.xid import (
    DEFAULT_APPLICATION_CODES,
    DEFAULT_HARDWARE_CODES,
    XID_CATALOG,
    XID_DESCRIPTIONS,
    XidClass,
    XidEvent,
    classify,
    parse_xid,
)

MMU_FAULT = (
    "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. "
    "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE"
)


def event(line: str, **fields: object) -> XidEvent:
    values: dict[str, object] = dict(
        pci=None, gpu_instance=None, compute_instance=None, pid=None, process=None, line=line, cursor=""
    )
    values.update(fields)
    return XidEvent(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "line, expected",
    [
        pytest.param(
            "NVRM: Xid (PCI:0000:01:00): 31, pid=1234, name=python3, " + MMU_FAULT,
            dict(code=31, pci="0000:01:00", pid=1234, process="python3", message=MMU_FAULT),
            id="current driver, with process",
        ),
        pytest.param(
            "NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:00): 43, pid=2001, name=pt_main_thread, Ch 00000008",
            dict(
                code=43,
                pci="0000:01:00",
                gpu_instance=5,
                compute_instance=0,
                pid=2001,
                process="pt_main_thread",
                message="Ch 00000008",
            ),
            id="MIG: GPU and compute instance",
        ),
        pytest.param(
            "NVRM: Xid (PCI:0000:81:00 GPU-I:13): 31, pid=77, name=python3, Ch 00000001",
            dict(code=31, pci="0000:81:00", gpu_instance=13, pid=77, process="python3", message="Ch 00000001"),
            id="MIG: GPU instance only",
        ),
        pytest.param(
            "NVRM: Xid (0000:01:00): 79, GPU has fallen off the bus.",
            dict(code=79, pci="0000:01:00", message="GPU has fallen off the bus."),
            id="old driver: no PCI: and no process",
        ),
        pytest.param(
            "NVRM: Xid (PCI:0000:c1:00): 79, GPU has fallen off the bus.",
            dict(code=79, pci="0000:c1:00", message="GPU has fallen off the bus."),
            id="no process",
        ),
        pytest.param(
            "NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000000 intr 00004000",
            dict(code=32, pci="0000:01:00", message="Channel ID 00000000 intr 00004000"),
            id="Bumblebee#677 (2015)",
        ),
        pytest.param(
            "NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No",
            dict(code=94, pci="0000:00:08", message="Contained: SM (0x1). RST: No, D-RST: No"),
            id="unknown pid and name (akash-network/support#244)",
        ),
        pytest.param(
            "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
            dict(
                code=45,
                pci="0000:dc:00",
                pid=1818990,
                process="python3",
                message="Ch 00000001 caused by previous Xid 149",
            ),
            id="preemptive cleanup with root cause (open-gpu-kernel-modules#1150)",
        ),
        pytest.param(
            "NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, "
            "errorString CTX SWITCH TIMEOUT, Info 0x58005",
            dict(
                code=109,
                pci="0000:cb:00",
                pid=1797828,
                process="pt_main_thread",
                message="Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
            ),
            id="leptonai/gpud#46",
        ),
        pytest.param(
            "NVRM: Xid (PCI:0000:01:00): 13, pid=42, name=python3, ",
            dict(code=13, pci="0000:01:00", pid=42, process="python3", message=""),
            id="empty message",
        ),
        pytest.param(
            "NVRM: Xid (PCI:10000:01:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU.",
            dict(
                code=48, pci="10000:01:00", message="An uncorrectable double bit error (DBE) has been detected on GPU."
            ),
            id="five-digit PCI domain",
        ),
    ],
)
def test_parse_xid_forms(line: str, expected: dict[str, object]) -> None:
    assert parse_xid(line, "c1") == event(line, cursor="c1", **expected)


@pytest.mark.parametrize(
    "prefix",
    [
        pytest.param("", id="bare (/dev/kmsg)"),
        pytest.param("[12345.678901] ", id="dmesg"),
        pytest.param("[Mon Aug  5 03:54:13 2024] ", id="dmesg -T"),
        pytest.param("kernel: ", id="kernel:"),
        pytest.param("Apr 29 19:24:11 gpu-1 kernel: [ 1843.308145] ", id="syslog kern.log"),
        pytest.param("2024-08-05T03:54:13.123456+00:00 gpu-1 kernel: ", id="rsyslog ISO timestamp"),
    ],
)
def test_parse_xid_ignores_log_prefixes(prefix: str) -> None:
    line = prefix + "NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, " + MMU_FAULT
    assert parse_xid(line + "\n") == event(
        line, code=31, pci="0000:00:07", pid=2512125, process="python3.10", message=MMU_FAULT
    )


@pytest.mark.parametrize(
    "line",
    [
        "",
        "NVRM: GPU at PCI:0000:00:05: GPU-efbdfde9-5798-a6e7-4c46-12518fa15375",
        "NVRM: GPU Board Serial Number: 1650423013443",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024",
        "NVRM: GPU at 0000:01:00.0 has fallen off the bus.",
        "NVRM: Xid (PCI:0000:01:00): thirty-one, pid=1, name=x, y",
        "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",
        "docker0: port 1(veth2d84eb1) entered disabled state",
        "NVRM Xid (PCI:0000:01:00): 31, pid=1, name=x, y",
    ],
)
def test_parse_xid_rejects_other_lines(line: str) -> None:
    assert parse_xid(line) is None


def test_default_classification_follows_nvidias_catalog() -> None:
    """The immediate action in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html):
    RESTART_APP is the application's, RESET_GPU / RESTART_BM / the ECC and NVLink workflows the hardware's, IGNORE
    neither (recorded, never acted on)."""
    def classes(codes: list[int]) -> list[XidClass]:
        return [classify(event("", code=code, message="")) for code in codes]

    # Catalog RESTART_APP (94: a contained ECC error, restart the application), and 43/45 (the application died).
    assert classes([8, 13, 31, 32, 43, 45, 94]) == [XidClass.APPLICATION] * 7
    # 109 (context-switch timeout) is RESET_GPU in the catalog, not the application's as lanectl had it.
    assert classes([46, 48, 62, 64, 74, 79, 95, 109, 119, 120, 136, 140, 143, 149, 155, 158]) == \
        [XidClass.HARDWARE] * 16
    # IGNORE: a row remapped (63), a high single-bit rate (92), a corrected C2C error (121); and codes not in it.
    assert classes([63, 92, 121, 137, 1, 999]) == [XidClass.UNKNOWN] * 6
    assert {94, 63, 154} <= set(XID_CATALOG), "the codes the issue named"
    assert DEFAULT_APPLICATION_CODES & DEFAULT_HARDWARE_CODES == set()
    assert {code for code, (_, action) in XID_CATALOG.items() if action == "RESTART_APP"} <= DEFAULT_APPLICATION_CODES


@pytest.mark.parametrize(("message", "expected"), [
    ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", XidClass.HARDWARE),
    ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", XidClass.HARDWARE),
    ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", XidClass.HARDWARE),
    ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", XidClass.UNKNOWN),
    ("something a newer driver says", XidClass.HARDWARE),
])
def test_xid_154_is_classified_by_the_recovery_action_it_names(message: str, expected: XidClass) -> None:
    """Xid 154 summarises what the other Xids need; only an action of None needs nothing (it is recorded). An action
    lanectl cannot read is taken as one: stopping a lane costs a manual start, restarting onto a failing GPU loops."""
    line = f"NVRM: Xid (PCI:0000:01:00): 154, {message}"
    xid = parse_xid(line)
    assert xid is not None and xid.message == message
    assert classify(xid) == expected


def test_custom_classification() -> None:
    xid_94 = event("", code=94, message="")
    xid_13 = event("", code=13, message="")
    assert classify(xid_94, [13], [94]) == XidClass.HARDWARE
    assert classify(xid_94, [94], [79]) == XidClass.APPLICATION
    assert classify(xid_13, [31], [79]) == XidClass.UNKNOWN
    assert classify(xid_13, [], []) == XidClass.UNKNOWN
    assert classify(xid_13, [13], [13]) == XidClass.HARDWARE


def test_descriptions() -> None:
    assert XID_DESCRIPTIONS[79] == "GPU has fallen off the bus"
    assert XID_DESCRIPTIONS[63] == "GPU memory remapping event"
    assert XID_DESCRIPTIONS[154] == "GPU recovery action changed"
    assert event("", code=119, message="").description == "GSP RPC timeout"
    assert event("", code=999, message="").description == "unlisted Xid"


# --- belief: the kernel's facility, the line's start, the lane's GPU ------------------------------

from lanectl.host.kernel_log import KernelLogLine  # noqa: E402
from lanectl.host.xid import Gpu, LaneGpus, believed_xid, normalise_pci, xid_on_lane  # noqa: E402

REAL = "NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


@pytest.mark.parametrize(("facility", "believed"), [(0, True), (1, False), (3, False), (None, False)])
def test_only_kernel_facility_lines_are_believed(facility: int | None, believed: bool) -> None:
    assert (believed_xid(KernelLogLine(REAL, "c", facility)) is not None) is believed


@pytest.mark.parametrize("line", [
    "worker: NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, y",
    "[core.py:700] NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, y",
    "Nov 30 12:00:00 host docker/abc[12]: NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, y",
    "Nov 30 12:00:00 host docker/abc[12]: kernel: NVRM: Xid (PCI:0000:01:00): 79",
    " NVRM: Xid (PCI:0000:01:00): 79",
    "NVRM: Xid (PCI:0000:01:00): 1234567, overflowing code",
])
def test_an_xid_quoted_anywhere_but_the_start_of_the_message_is_not_one(line: str) -> None:
    assert parse_xid(line) is None


GPUS = [Gpu("0", "0000:01:00", "GPU-aaaa"), Gpu("1", "0000:02:00", "GPU-bbbb")]


@pytest.mark.parametrize(("lane", "pci", "on_lane"), [
    (LaneGpus(device_ids=("0",)), "0000:01:00", True),
    (LaneGpus(device_ids=("0",)), "0000:02:00", False),
    (LaneGpus(device_ids=("GPU-bbbb",)), "0000:02:00", True),
    (LaneGpus(count=1), "0000:02:00", False),
    (LaneGpus(count=2), "0000:02:00", True),
    (LaneGpus(all=True), "0000:02:00", True),
    (LaneGpus(), "0000:01:00", False),
    (LaneGpus(device_ids=("0",)), "0000:09:00", True),  # not listed: fail safe
])
def test_an_xid_is_on_the_lane_when_its_bus_id_maps_to_the_lanes_gpu(lane: LaneGpus, pci: str,
                                                                      on_lane: bool) -> None:
    event = parse_xid(f"NVRM: Xid (PCI:{pci}): 79, pid=1, name=x, y")
    assert event is not None
    assert xid_on_lane(event, lane, GPUS)[0] is on_lane


def test_an_unknown_gpu_map_takes_the_xid_as_on_the_lane_and_says_so() -> None:
    event = parse_xid("NVRM: Xid (PCI:0000:02:00): 79, pid=1, name=x, y")
    assert event is not None
    assert xid_on_lane(event, LaneGpus(device_ids=("0",)), None) == (
        True, "GPU map unknown (no nvidia-smi): the Xid is taken as on the lane's GPU")


@pytest.mark.parametrize(("text", "expected"), [
    ("00000000:01:00.0", "0000:01:00"), ("0000:01:00", "0000:01:00"), ("PCI:0001:C1:00", "0001:c1:00"),
    ("01:00.0", None), ("zz", None),
])
def test_normalise_pci(text: str, expected: str | None) -> None:
    assert normalise_pci(text) == expected
