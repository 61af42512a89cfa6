"""Ctrl-C and SIGTERM during a switch: an outcome to handle, not an exit.

The first signal lets the step in progress finish (a Docker stop, a sleep request; a health gate stops waiting
at its next poll), then the switch takes its plan's way back, journals it and re-arms the watchdog. A second
signal stops at once, leaving an unfinished switch in the journal for the next command (or the watchdog) to
finish or undo, and says so.

A command `held` to its end also takes a signal that comes after its switch ended (while it releases the engine
lock and prints what it did) as one that came too late to undo anything: noted, not raised. Python's own handler
would raise KeyboardInterrupt there, and the command would exit 130 with nothing said about a switch that finished.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SwitchAborted(BaseException):
    """A second signal: stop now. A BaseException, so no step's error handling takes it for a failed step."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupt:
    def __init__(self) -> None:
        self.signum: int | None = None  # the first signal, once one came
        self._pending = threading.Event()  # set by the first signal until the way back takes it
        self._held: dict[int, Any] | None = None  # the handlers `held` puts back when the command ends

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    def pending(self) -> str | None:
        """The signal that asks for the way back and has not been acted on yet, by name."""
        return self.name if self._pending.is_set() else None

    def take(self) -> str | None:
        """Act on a pending signal: from here on (the way back) only a second signal counts."""
        taken = self.pending()
        self._pending.clear()
        return taken

    def sleep(self, seconds: float) -> None:
        """A wait that a first signal ends early."""
        self._pending.wait(max(0.0, seconds))

    def arrived(self, signum: int) -> None:
        if self.signum is not None:
            raise SwitchAborted(signum)
        self.signum = signum
        self._pending.set()

    @contextlib.contextmanager
    def catching(self) -> Iterator[Interrupt]:
        """Handle SIGINT and SIGTERM as above while the block runs (main thread only: Python delivers signals
        there); the previous handlers come back afterwards, or, while `held`, `_after`'s."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        for signum in STOP_SIGNALS:
            signal.signal(signum, lambda number, _frame: self.arrived(number))
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler if self._held is None else self._after)

    @contextlib.contextmanager
    def held(self) -> Iterator[Interrupt]:
        """Around a whole command, its output included: until a switch catches signals the command's own handlers
        answer them (a Ctrl-C while it waits for the lock ends it), and from then on to the block's end a signal
        is this object's (`pending()` names a first one that came once nothing was left to undo). Main thread only;
        the command's handlers come back afterwards."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._held = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        try:
            yield self
        finally:
            held, self._held = self._held, None
            for signum, handler in held.items():
                signal.signal(signum, handler)

    def _after(self, signum: int, _frame: FrameType | None) -> None:
        """A signal after the switch ended: a first one is noted; a second ends the command now, as it would
        have ended it without a switch."""
        if self.signum is None:
            self.arrived(signum)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            raise SystemExit(128 + signum)
