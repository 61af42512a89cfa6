"""Which GPUs this host has: by index, PCI bus id and UUID, the map from an Xid line's bus id to a lane's
devices; by name, the kind of GPU a calibration of the arm noise was measured on. Asked of nvidia-smi; None
where it fails (or, for the map, is not there), and the caller decides what an unknown answer means (see
`xid.xid_on_lane`, `lanectl.bench.calibration_file.gpu_mismatch`)."""

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


NAMES_QUERY = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]


def gpu_names() -> list[str] | None:
    """Each GPU's name as nvidia-smi gives it (`NVIDIA H200`), in index order: [] on a host without nvidia-smi
    (no NVIDIA GPU to list), None when it fails or answers nothing."""
    if shutil.which(NAMES_QUERY[0]) is None:
        return []
    try:
        answer = subprocess.run(NAMES_QUERY, capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_gpu_names(answer.stdout) if answer.returncode == 0 else None


def parse_gpu_names(text: str) -> list[str] | None:
    """NAMES_QUERY's answer, one name a line (`NVIDIA H100 80GB HBM3`); None when it lists none."""
    names = [line.strip() for line in text.splitlines() if line.strip()]
    return names or None
