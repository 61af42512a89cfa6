"""Log output in the three formats a real vLLM container mixes on stdout.

lanectl's health gate and watchdog read these lines with regexes, so the formats are part of the
stub's interface (see the package docstring for the exact lines).
"""

from __future__ import annotations

import logging
import sys

# vLLM's own logger format (vllm/logger.py): "INFO 11-30 08:30:01 [module.py:123] message".
VLLM_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
VLLM_DATEFMT = "%m-%d %H:%M:%S"
# FlashInfer's autotuner logs through its own logger, with its own format.
FLASHINFER_FORMAT = "%(asctime)s - %(levelname)s - %(filename)s:%(lineno)d - flashinfer.jit: %(message)s"


class _UvicornFormatter(logging.Formatter):
    """Uvicorn pads the level so messages line up: "INFO:     Application startup complete."."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"{record.levelname}:".ljust(9)
        return f"{prefix} {record.getMessage()}"


def _logger(name: str, formatter: logging.Formatter) -> logging.Logger:
    log = logging.getLogger(name)
    log.handlers.clear()
    # StreamHandler flushes after every record, which a `docker logs -f` reader relies on.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(formatter)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    return log


def setup() -> None:
    try:
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        pass
    _logger("stubengine", logging.Formatter(VLLM_FORMAT, VLLM_DATEFMT))
    _logger("stubengine.flashinfer", logging.Formatter(FLASHINFER_FORMAT))
    _logger("stubengine.uvicorn", _UvicornFormatter())


def get(name: str) -> logging.Logger:
    """A vLLM-format logger; `name` is the module's short name."""
    return logging.getLogger(f"stubengine.{name}")


flashinfer = logging.getLogger("stubengine.flashinfer")
uvicorn = logging.getLogger("stubengine.uvicorn")


def raw(text: str) -> None:
    """Unformatted lines, such as the traceback that follows a vLLM ERROR line."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
