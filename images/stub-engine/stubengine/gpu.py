"""The GPU a stub shares with other stubs: vLLM's start-up memory check, and what a sleeping engine keeps.

vLLM (0.26.0 `v1/worker/utils.py` `request_memory`) takes `--gpu-memory-utilization` x the GPU's memory at
start and refuses to start when less is free: "Free memory on device cuda:0 (F/T GiB) on startup is less than
desired GPU memory utilization (U, R GiB). Decrease GPU memory utilization or reduce GPU memory used by other
processes." A lane started beside a sleeping one meets exactly that check, so the stub models it.

With STUB_GPU_LEDGER=DIR (a folder every stub on that "GPU" mounts), each engine keeps DIR/<host>-<pid>.gib with
the GiB it holds: its share once loaded, STUB_RESIDENT_GIB while asleep at level >= 1. It holds an exclusive
flock on that file while it lives, so the entry of an engine that died (whatever way: os._exit, SIGKILL, a removed
container) is ignored by the next reader, which can take the lock. Without a ledger the stub is alone on its GPU.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from . import logs

log = logs.get("gpu_ledger")


class GpuLedger:
    def __init__(self, folder: str | None, total_gib: float) -> None:
        self.total_gib = total_gib
        self.folder = Path(folder) if folder else None
        self._file = None
        if self.folder is not None:
            self.path = self.folder / f"{socket.gethostname()}-{os.getpid()}.gib"

    def free_gib(self) -> float:
        """The GPU's memory less what every other live engine on it holds."""
        return max(0.0, self.total_gib - sum(self._others()))

    def _others(self) -> list[float]:
        if self.folder is None:
            return []
        held = []
        for entry in sorted(self.folder.glob("*.gib")):
            if entry == getattr(self, "path", None):
                continue
            try:
                with entry.open("r") as handle:
                    try:
                        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    except OSError:
                        held.append(float(handle.read().strip() or 0))  # locked: its engine lives
                        continue
            except (OSError, ValueError):
                continue
        return held

    def hold(self, gib: float) -> None:
        """What this engine holds from now on (kept in its own locked file)."""
        if self.folder is None:
            return
        if self._file is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w")
            fcntl.flock(self._file, fcntl.LOCK_EX)
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"{gib:.3f}\n")
        self._file.flush()


def request_memory(ledger: GpuLedger, utilization: float) -> str | None:
    """vLLM's check at start: None when the share is free, else its error message."""
    requested = utilization * ledger.total_gib
    free = ledger.free_gib()
    if free < requested:
        return (f"Free memory on device cuda:0 ({free:.2f}/{ledger.total_gib:.2f} GiB) on startup is less than "
                f"desired GPU memory utilization ({utilization}, {requested:.2f} GiB). Decrease GPU memory "
                "utilization or reduce GPU memory used by other processes.")
    return None


def log_startup_memory(ledger: GpuLedger, free_gib: float, utilization: float) -> None:
    """The line vLLM 0.26.0 prints once its memory was profiled (the check reads the GPU's size from it)."""
    log.info("Free memory on device (%.2f/%.2f GiB) on startup. Desired GPU memory utilization is (%s, %.2f GiB).",
             free_gib, ledger.total_gib, utilization, utilization * ledger.total_gib)
