"""Which GPUs this host has, by index, PCI bus id and UUID: the map from an Xid line's bus id to a
lane's devices. Asked of nvidia-smi; None where there is no nvidia-smi (or it fails), and the
caller decides what an unknown map means (see `xid.xid_on_lane`)."""

from __future__ import annotations

import shutil
import subprocess

from lanectl.host.xid import Gpu, normalise_pci

QUERY = ["nvidia-smi", "--query-gpu=index,pci.bus_id,uuid", "--format=csv,noheader"]
TIMEOUT_SECONDS = 15


def query_gpus() -> list[Gpu] | None:
    """The GPUs nvidia-smi lists, or None when it is missing, fails or answers something unreadable."""
    if shutil.which(QUERY[0]) is None:
        return None
    try:
        answer = subprocess.run(QUERY, capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if answer.returncode != 0:
        return None
    gpus = []
    for line in answer.stdout.splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        pci = normalise_pci(fields[1]) if len(fields) == 3 else None
        if pci is None or not fields[0].isdigit():
            return None  # half a map would be taken for a whole one
        gpus.append(Gpu(index=fields[0], pci=pci, uuid=fields[2]))
    return gpus
