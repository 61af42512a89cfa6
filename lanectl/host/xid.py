"""NVIDIA Xid kernel lines: parsing one line into an `XidEvent`, and judging whose fault it is.

The driver prints (open-gpu-kernel-modules, src/nvidia/src/kernel/gpu/rc/kernel_rc.c, krcReportXid):

    NVRM: Xid (PCI:%04x:%02x:%02x[ GPU-I:%02u[ GPU-CI:%02u]]): %d, pid=%s, name=%s, <message>
    NVRM: Xid (PCI:%04x:%02x:%02x): %d, <message>          (no channel and no RM API call in progress)

Older drivers print `NVRM: Xid (0000:01:00): 79, ...` (no `PCI:`) and `pid='<unknown>', name=<unknown>`
when no process is attributable.

The line must *start* the kernel message: only the framing a kernel log adds may come before it
(dmesg --raw's `<6>`, a printk time `[ 123.456789]`, a syslog header ending in `kernel: `), so a
container's log line that merely quotes "NVRM: Xid" is not an Xid. And only records of the kernel
facility are believed (`believed_xid`): anyone who can write /dev/kmsg can print an NVRM line, but
the kernel files it under `user`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING

from lanectl.records import frozen

if TYPE_CHECKING:
    from lanectl.host.kernel_log import KernelLogLine

KERNEL_FACILITY = 0  # syslog facility `kern`: what the kernel itself logs under

# NVIDIA's Xid catalog for Ampere and newer GPUs, "Analyzing Xid Errors with the Xid Catalog"
# (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): each code that applies to an A100, H100,
# B100 or GB200, with its description and its "Resolution Bucket (Immediate Action)". Unused codes are left out.
XID_CATALOG: dict[int, tuple[str, str]] = {
    8: ("GPU stopped processing", "RESTART_APP"),
    11: ("invalid or corrupted push buffer stream", "RESTART_APP"),
    13: ("graphics engine exception", "RESTART_APP"),
    25: ("invalid or illegal push buffer stream", "RESTART_APP"),
    31: ("GPU memory page fault", "RESTART_APP"),
    32: ("invalid or corrupted push buffer stream", "RESTART_APP"),
    37: ("driver firmware error", "IGNORE"),
    38: ("driver firmware error", "IGNORE"),
    **{code: ("copy engine exception", "RESTART_APP") for code in (39, 40, 41, 70, 71, 72, 75, 76, 77, 85)},
    43: ("GPU stopped processing", "IGNORE"),
    44: ("graphics engine fault during context switch", "IGNORE"),
    45: ("preemptive cleanup, due to previous errors", "WORKFLOW_XID_45"),
    46: ("GPU stopped processing", "RESET_GPU"),
    48: ("double-bit ECC error", "WORKFLOW_XID_48"),
    54: ("auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS"),
    60: ("video processor exception", "RESTART_APP"),
    62: ("internal micro-controller halt", "RESET_GPU"),
    63: ("GPU memory remapping event", "IGNORE"),
    64: ("GPU memory remapping failure", "RESET_GPU"),
    66: ("illegal access by driver", "IGNORE"),
    67: ("illegal access by driver", "IGNORE"),
    **{code: ("video decoder or JPEG engine error", "RESTART_APP")
       for code in (68, 82, 83, 84, 88, 89, *range(96, 106))},
    69: ("graphics engine class error", "RESTART_APP"),
    74: ("NVLink error", "WORKFLOW_NVLINK_ERR"),
    78: ("vGPU start error", "UPDATE_SWFW"),
    79: ("GPU has fallen off the bus", "RESTART_BM"),
    80: ("corrupted data sent to GPU", "RESTART_APP"),
    86: ("optical flow engine exception", "RESTART_APP"),
    92: ("high single-bit ECC error rate", "IGNORE"),
    93: ("non-fatal violation of the provisioned InfoROM wear limit", "IGNORE"),
    94: ("contained memory error", "RESTART_APP"),
    95: ("uncontained memory error", "RESET_GPU"),
    106: ("SMBPBI test message", "IGNORE"),
    107: ("SMBPBI test message (silent)", "IGNORE"),
    109: ("context switch timeout", "RESET_GPU"),
    110: ("security fault", "RESET_GPU"),
    119: ("GSP RPC timeout", "RESET_GPU"),
    120: ("GSP error", "RESET_GPU"),
    121: ("C2C link corrected error", "IGNORE"),
    **{code: ("copy engine exception", "RESTART_APP") for code in range(126, 136)},
    136: ("NVLink training failed", "RESET_GPU"),
    137: ("NVLink privilege error", "IGNORE"),
    139: ("optical flow engine exception", "RESTART_APP"),
    140: ("uncorrectable ECC error escaped containment", "RESET_GPU"),
    141: ("CUDA fast path error", "IGNORE"),
    143: ("GPU initialization error", "RESET_GPU"),
    **{code: ("NVLink 5 error", "WORKFLOW_NVLINK5_ERR") for code in range(144, 151)},
    151: ("key rotation error", "RESTART_VM"),
    154: ("GPU recovery action changed", "XID_154"),
    155: ("NVLink software-defined error", "RESET_GPU"),
    156: ("resource retirement event", "RESET_GPU"),
    157: ("resource retirement failure", "IGNORE"),
    158: ("GPU fatal timeout", "RESET_GPU"),
    159: ("CHI non-data error", "CHECK_UVM"),
    160: ("channel retirement event", "IGNORE"),
    161: ("channel retirement failure", "IGNORE"),
}
# The application's fault: a restart of the lane is the catalog's remedy (RESTART_APP). So are 43 (the catalog:
# "a user application hits a software induced fault and must terminate; the GPU remains in a healthy state") and
# 45 (the driver tore the application down, after another error or a kill): the engine's process is gone.
APPLICATION_ACTIONS = frozenset({"RESTART_APP"})
# The GPU needs attention (a reset, a reboot, a technician); restarting the lane onto it loops.
HARDWARE_ACTIONS = frozenset({"RESET_GPU", "RESTART_BM", "RESTART_VM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR",
                              "WORKFLOW_NVLINK5_ERR", "CHECK_MECHANICALS", "UPDATE_SWFW", "XID_154"})
DEFAULT_APPLICATION_CODES: frozenset[int] = frozenset(
    {code for code, (_, action) in XID_CATALOG.items() if action in APPLICATION_ACTIONS} | {43, 45})
DEFAULT_HARDWARE_CODES: frozenset[int] = frozenset(
    code for code, (_, action) in XID_CATALOG.items() if action in HARDWARE_ACTIONS)
XID_DESCRIPTIONS: dict[int, str] = {code: description for code, (description, _) in XID_CATALOG.items()}
# Xid 154 summarises what the other Xids require: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot
# Required)" (the catalog; the actions are None, Drain P2P, Drain and Reset, GPU Reset Required, Node Reboot
# Required). It is a hardware fault unless the action it names is None.
GPU_RECOVERY_ACTION_XID = 154
_RECOVERY_ACTION = re.compile(r"recovery action changed from .*? to 0x[0-9a-fA-F]+ \((?P<action>[^)]*)\)")


# The attribution inside the parentheses is matched loosely, then picked apart, so that a future
# driver adding a field there still yields the code rather than no event at all.
_XID_LINE = re.compile(r"NVRM: Xid \((?P<attribution>[^)]*)\): (?P<code>\d{1,6})(?:,\s?(?P<rest>.*))?$")
# What a kernel log may put before the message: dmesg --raw's priority, a syslog header whose tag is
# `kernel:` (traditional or RFC 3339 time, then the host), and the printk time (or dmesg -T's date).
_FRAMING = re.compile(
    r"^(?:<\d{1,3}>)?"
    r"(?:(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)) \S+ kernel: )?"
    r"(?:kernel: )?"
    r"(?:\[\s*\d+\.\d+\]\s?|\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\] )?"
)
_PCI = re.compile(r"^(?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\b")
_GPU_INSTANCE = re.compile(r"\bGPU-I:(?P<id>\d+)\b")
_COMPUTE_INSTANCE = re.compile(r"\bGPU-CI:(?P<id>\d+)\b")
_PROCESS = re.compile(r"^pid=(?P<pid>'?<unknown>'?|\d+), name=(?P<name>[^,]*)(?:,\s?(?P<message>.*))?$")
_UNKNOWN = {"<unknown>", "'<unknown>'", ""}


@frozen
class XidEvent:
    """An NVIDIA Xid error as the kernel log reported it."""

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
    """The Xid event on `line`, or None when the line is not an NVIDIA Xid report starting its message."""
    text = line.rstrip("\r\n")
    framing = _FRAMING.match(text)
    found = _XID_LINE.match(text, framing.end() if framing else 0)
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


def recovery_action(event: XidEvent) -> str | None:
    """The action an Xid 154 says the GPU now needs (`None`, `GPU Reset Required`, ...); None when unreadable."""
    found = _RECOVERY_ACTION.search(event.message)
    return found["action"].strip() if found else None


def classify(
    event: XidEvent,
    application_codes: Collection[int] = DEFAULT_APPLICATION_CODES,
    hardware_codes: Collection[int] = DEFAULT_HARDWARE_CODES,
) -> XidClass:
    # Hardware is checked first: should a code be listed as both, restarting onto a broken GPU loops,
    # while stopping a lane whose application crashed only costs a manual start.
    if event.code == GPU_RECOVERY_ACTION_XID and recovery_action(event) == "None":
        return XidClass.UNKNOWN  # nothing to do: recorded like any code in neither list
    if event.code in hardware_codes:
        return XidClass.HARDWARE
    if event.code in application_codes:
        return XidClass.APPLICATION
    return XidClass.UNKNOWN


def believed_xid(line: KernelLogLine) -> XidEvent | None:
    """The Xid on a kernel log line, only when the kernel itself logged it (facility `kern`).

    A line whose source cannot say its facility (a plain file, plain `dmesg`) is not believed:
    root, or a container with /dev/kmsg, can print any NVRM line, and the facility is what tells.
    """
    if line.facility != KERNEL_FACILITY:
        return None
    return parse_xid(line.text, line.cursor)


# --- which GPU an Xid is on ------------------------------------------------------------------------


@frozen
class Gpu:
    """One GPU as nvidia-smi lists it."""

    index: str
    pci: str  # normalised, as an Xid line prints it: "0000:01:00"
    uuid: str


@frozen
class LaneGpus:
    """The GPUs a lane's containers ask for: device ids (indices or UUIDs), the first `count`, or all."""

    device_ids: tuple[str, ...] = ()
    count: int = 0
    all: bool = False


_PCI_PARTS = re.compile(r"^(?:PCI:)?(?P<domain>[0-9a-fA-F]{1,8}):(?P<bus>[0-9a-fA-F]{1,2}):(?P<device>[0-9a-fA-F]{1,2})"
                        r"(?:\.[0-7])?$")


def normalise_pci(text: str) -> str | None:
    """ "00000000:01:00.0" (nvidia-smi) and "0000:01:00" (an Xid line) both become "0000:01:00"."""
    found = _PCI_PARTS.match(text.strip())
    if found is None:
        return None
    return f"{int(found['domain'], 16):04x}:{int(found['bus'], 16):02x}:{int(found['device'], 16):02x}"


def xid_on_lane(event: XidEvent, lane: LaneGpus, gpus: Sequence[Gpu] | None) -> tuple[bool, str]:
    """Whether the Xid is on one of the lane's GPUs, and a note when that is a guess.

    When it cannot be told (no nvidia-smi to map PCI bus ids to indices, an Xid line without a bus
    id, a bus id nvidia-smi does not list) the Xid is taken as on the lane's GPU: a wrong guess that
    way costs a restart (or a stop and an alert), the other way it leaves a lane on a failing GPU.
    """
    if gpus is None:
        return True, "GPU map unknown (no nvidia-smi): the Xid is taken as on the lane's GPU"
    pci = normalise_pci(event.pci) if event.pci else None
    if pci is None:
        return True, "the Xid line names no PCI bus id: taken as on the lane's GPU"
    if lane.all:
        return True, ""
    gpu = next((g for g in gpus if g.pci == pci), None)
    if gpu is None:
        return True, f"PCI {pci} is not among the GPUs nvidia-smi lists: the Xid is taken as on the lane's GPU"
    # `count: N` gets the first N GPUs: Docker hands the NVIDIA runtime the first N in index order.
    ordinal = int(gpu.index) if gpu.index.isdigit() else None
    if gpu.index in lane.device_ids or gpu.uuid in lane.device_ids or (ordinal is not None and ordinal < lane.count):
        return True, ""
    return False, f"Xid {event.code} is on GPU {gpu.index} (PCI {pci}), which the lane does not use"
