"""Docker's size notation, read once for the recipe's check and the engine's request.

Kept apart from `engine_api`, so the recipe format can use it without importing an HTTP client.
"""

from __future__ import annotations

SIZE_UNITS = {"b": 1, "k": 2**10, "m": 2**20, "g": 2**30}


def size_in_bytes(size: str) -> int:
    """Docker's size notation ("16g", "512m", "1024"): binary units, b/k/m/g, as `docker run --shm-size`."""
    unit = size[-1].lower()
    if unit in SIZE_UNITS:
        return int(size[:-1]) * SIZE_UNITS[unit]
    return int(size)
