"""Waiting for a crashed engine's GPU memory to be released before relaunching onto the GPU.

On unified-memory boxes each crash/restart cycle can leak GPU memory until the box needs a
reset (eugr/spark-vllm-docker#257): relaunching while the old allocation is still held makes it
worse. Without nvidia-smi there is nothing to ask; the wait is skipped and the journal says so.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable

# What a GPU holds with no process on it (driver, display); above this, memory is still in use.
RELEASED_BELOW_MIB = 1024


def used_mib(device_ids: list[str] | None) -> dict[str, int] | None:
    """Used memory per GPU index, or None when nvidia-smi is not there to ask."""
    if shutil.which("nvidia-smi") is None:
        return None
    command = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
    if device_ids:
        command += ["-i", ",".join(device_ids)]
    answer = subprocess.run(command, capture_output=True, text=True, timeout=15)
    if answer.returncode != 0:
        return None
    usage = {}
    for line in answer.stdout.strip().splitlines():
        index, _, used = line.partition(",")
        usage[index.strip()] = int(float(used.strip()))
    return usage


MEMORY_QUERY = ["nvidia-smi", "--query-gpu=index,uuid,memory.total,memory.free", "--format=csv,noheader,nounits"]


def memory_mib() -> dict[str, tuple[int, int]] | None:
    """Every GPU's (total, free) memory in MiB, keyed by both its index and its UUID (recipes name either);
    None when there is no nvidia-smi to ask, or it fails or answers something unreadable."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        answer = subprocess.run(MEMORY_QUERY, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_memory(answer.stdout) if answer.returncode == 0 else None


def parse_memory(text: str) -> dict[str, tuple[int, int]] | None:
    """MEMORY_QUERY's answer, e.g. `0, GPU-3a527203-54df-61c1-0387-ab370efdd1bd, 143771, 143156` (an H200)."""
    memory: dict[str, tuple[int, int]] = {}
    for line in text.strip().splitlines():
        fields = [field.strip() for field in line.split(",")]
        try:
            index, uuid, total, free = fields[0], fields[1], int(float(fields[2])), int(float(fields[3]))
        except (IndexError, ValueError):
            return None  # half a table would be taken for a whole one
        memory[index] = memory[uuid] = (total, free)
    return memory or None


def wait_for_release(device_ids: list[str] | None, timeout_seconds: float, kept_mib: int = 0, *,
                     clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                     query: Callable[[list[str] | None], dict[str, int] | None] = used_mib) -> str:
    """Wait until every GPU of the lane holds less than RELEASED_BELOW_MIB beyond `kept_mib` (what a standby
    asleep on those GPUs said it still holds: it keeps that while the lane restarts beside it); returns what
    happened, for the journal."""
    if timeout_seconds <= 0:
        return "not waiting for GPU memory release (timeout 0 in the recipe)"
    beside = f", beside the {kept_mib} MiB a standby keeps asleep" if kept_mib else ""
    started = clock()
    while True:
        usage = query(device_ids)
        if usage is None:
            return "nvidia-smi not found: cannot tell whether GPU memory was released; not waiting"
        held = {gpu: mib for gpu, mib in usage.items() if mib >= RELEASED_BELOW_MIB + kept_mib}
        if not held:
            return f"GPU memory released after {clock() - started:.0f} s{beside}"
        if clock() - started >= timeout_seconds:
            return f"GPU memory still held after {timeout_seconds:.0f} s ({held} MiB{beside}); relaunching anyway"
        sleep(2.0)
