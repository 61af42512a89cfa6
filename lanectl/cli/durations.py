"""Durations as people type them on the command line: 90, 90s, 10m, 2h, 1h30m."""

from __future__ import annotations

import math
import re

from lanectl.errors import BadInput

_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, *, option: str) -> float:
    text = text.strip().lower()
    position, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != position:
            break
        total += float(match.group(1)) * _SECONDS[match.group(2)]
        position = match.end()
    if not text or position != len(text):
        raise BadInput(f"{option} {text!r}: expected a duration like 90s, 10m, 2h or 1h30m")
    if not math.isfinite(total):  # 400 nines is float infinity: a wait that never ends, a `since` before time
        shown = text if len(text) <= 20 else f"{text[:17]}…"
        raise BadInput(f"{option} {shown!r}: not a finite duration; give one like 90s, 10m or 2h")
    return total
