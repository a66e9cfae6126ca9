"""The batch deadline of the online service: a batch whose pool call runs past `timeout_s` has its
requests answered "timeout" while the call goes on.

WHY a watchdog thread instead of a caller thread per slot: the dispatch thread runs the pool call
itself, so a batch costs no hand-off to another thread and back (an executor submit, a future's
wake-up: about a tenth of the service's CPU per single-query request); one thread watches every
running batch. Batches begin in order and share one timeout, so their deadlines are in order too:
the watchdog only ever waits for the oldest running batch's deadline. It never needs waking: idle,
it waits `timeout_s` at most, and a batch that begins meanwhile has a later deadline than that
wake-up. A call that never returns holds its slot (its thread), never a growing number of threads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

RUNNING, DONE, LATE = "running", "done", "late"


class Running:
    """One batch in its pool call: its deadline, what it answers, and whether it ended in time."""

    __slots__ = ("deadline", "payload", "state")

    def __init__(self, deadline: float, payload: Any):
        self.deadline = deadline
        self.payload = payload
        self.state = RUNNING


class BatchWatch:
    """Watches running batches; `on_late(payload)` answers a batch past `timeout_s` (called on the
    watchdog's thread, outside its lock)."""

    def __init__(self, timeout_s: float, on_late: Callable[[Any], None]):
        if not timeout_s > 0:
            raise ValueError(f"a batch timeout must be > 0 s, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._on_late = on_late
        self._cond = threading.Condition()
        self._running: deque[Running] = deque()
        self._closed = False

    def begin(self, payload: Any) -> Running:
        """A batch's call starts now (its deadline: now + timeout_s)."""
        with self._cond:
            entry = Running(time.monotonic() + self.timeout_s, payload)
            self._running.append(entry)
        return entry

    def end(self, entry: Running) -> bool:
        """The batch's call returned: True when in time (the caller answers it), False when the
        watchdog answered it "timeout" already."""
        with self._cond:
            if entry.state == LATE:
                return False
            entry.state = DONE
            self._drop_done()
            return True

    def _drop_done(self) -> None:
        while self._running and self._running[0].state == DONE:
            self._running.popleft()

    def run(self) -> None:
        """The watchdog loop (its own thread), until `close`."""
        while True:
            late = None
            with self._cond:
                while late is None and not self._closed:
                    self._drop_done()
                    if not self._running:
                        self._cond.wait(self.timeout_s)
                        continue
                    head = self._running[0]
                    left = head.deadline - time.monotonic()
                    if left > 0:
                        self._cond.wait(left)
                        continue
                    head.state = LATE
                    late = self._running.popleft()
                if late is None:
                    return
            self._on_late(late.payload)

    def close(self) -> None:
        """End the watchdog loop (batches still running are left to their calls)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
