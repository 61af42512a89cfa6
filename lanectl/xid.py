"""NVIDIA Xid kernel lines: parsing one line into an `XidEvent`, and judging whose fault it is.

The driver prints (open-gpu-kernel-modules, src/nvidia/src/kernel/gpu/rc/kernel_rc.c, krcReportXid):

    NVRM: Xid (PCI:%04x:%02x:%02x[ GPU-I:%02u[ GPU-CI:%02u]]): %d, pid=%s, name=%s, <message>
    NVRM: Xid (PCI:%04x:%02x:%02x): %d, <message>          (no channel and no RM API call in progress)

Older drivers print `NVRM: Xid (0000:01:00): 79, ...` (no `PCI:`) and `pid='<unknown>', name=<unknown>`
when no process is attributable. Whatever precedes `NVRM:` (a dmesg timestamp, a syslog header,
`kernel:`) is ignored, so lines from /dev/kmsg, dmesg, journalctl and kern.log all parse the same.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

DEFAULT_APPLICATION_CODES: frozenset[int] = frozenset({13, 31, 43, 45, 109})
DEFAULT_HARDWARE_CODES: frozenset[int] = frozenset({48, 64, 74, 79, 95, 119, 120})

XID_DESCRIPTIONS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    48: "double-bit ECC error",
    63: "ECC page retirement",
    64: "ECC page retirement/row remap failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}

# The attribution inside the parentheses is matched loosely, then picked apart, so that a future
# driver adding a field there still yields the code rather than no event at all.
_XID_LINE = re.compile(r"NVRM: Xid \((?P<attribution>[^)]*)\): (?P<code>\d+)(?:,\s?(?P<rest>.*))?$")
_PCI = re.compile(r"^(?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\b")
_GPU_INSTANCE = re.compile(r"\bGPU-I:(?P<id>\d+)\b")
_COMPUTE_INSTANCE = re.compile(r"\bGPU-CI:(?P<id>\d+)\b")
_PROCESS = re.compile(r"^pid=(?P<pid>'?<unknown>'?|\d+), name=(?P<name>[^,]*)(?:,\s?(?P<message>.*))?$")
_UNKNOWN = {"<unknown>", "'<unknown>'", ""}


@dataclass(frozen=True)
class XidEvent:
    code: int
    pci: str | None  # "0000:01:00" (domain:bus:device), as the driver printed it
    gpu_instance: int | None  # MIG GPU instance (GPU-I)
    compute_instance: int | None  # MIG compute instance (GPU-CI)
    pid: int | None
    process: str | None
    message: str  # what follows the code, pid and name
    line: str  # the whole line as read
    cursor: str  # where the kernel log source found it; opaque

    @property
    def description(self) -> str:
        return XID_DESCRIPTIONS.get(self.code, "unlisted Xid")


class XidClass(StrEnum):
    APPLICATION = "application"
    HARDWARE = "hardware"
    UNKNOWN = "unknown"


def parse_xid(line: str, cursor: str = "") -> XidEvent | None:
    """The Xid event on `line`, or None when the line is not an NVIDIA Xid report."""
    found = _XID_LINE.search(line.rstrip("\r\n"))
    if found is None:
        return None
    attribution = found["attribution"].strip()
    pci = _PCI.search(attribution)
    gpu_instance = _GPU_INSTANCE.search(attribution)
    compute_instance = _COMPUTE_INSTANCE.search(attribution)
    rest = (found["rest"] or "").rstrip()
    pid: int | None = None
    process: str | None = None
    message = rest
    attributed = _PROCESS.match(rest)
    if attributed is not None:
        pid = None if attributed["pid"] in _UNKNOWN else int(attributed["pid"])
        name = attributed["name"].strip()
        process = None if name in _UNKNOWN else name
        message = (attributed["message"] or "").strip()
    return XidEvent(
        code=int(found["code"]),
        pci=pci["pci"] if pci else None,
        gpu_instance=int(gpu_instance["id"]) if gpu_instance else None,
        compute_instance=int(compute_instance["id"]) if compute_instance else None,
        pid=pid,
        process=process,
        message=message,
        line=line.rstrip("\r\n"),
        cursor=cursor,
    )


def classify(
    event: XidEvent,
    application_codes: Collection[int] = DEFAULT_APPLICATION_CODES,
    hardware_codes: Collection[int] = DEFAULT_HARDWARE_CODES,
) -> XidClass:
    # Hardware is checked first: should a code be listed as both, restarting onto a broken GPU loops,
    # while stopping a lane whose application crashed only costs a manual start.
    if event.code in hardware_codes:
        return XidClass.HARDWARE
    if event.code in application_codes:
        return XidClass.APPLICATION
    return XidClass.UNKNOWN
