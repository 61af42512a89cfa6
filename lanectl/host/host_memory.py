"""Host memory available for new allocations, as the kernel estimates it (`MemAvailable` in /proc/meminfo).

vLLM's level-1 sleep copies a lane's weights to host memory: a lane is left asleep only when that fits.
"""

from __future__ import annotations

from pathlib import Path

MEMINFO = Path("/proc/meminfo")


def available_gib(meminfo: Path = MEMINFO) -> float | None:
    """GiB the kernel says can be allocated without swapping; None when /proc/meminfo cannot tell."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            value, _, unit = rest.strip().partition(" ")
            if unit == "kB" and value.isdigit():
                return int(value) / 2**20
    return None
