"""BackgroundJob: at most one piece of work at a time on a thread beside the caller's loop (the
refresh follower's compactions, pe/follow.py).

WHY: a follower's occasional heavy write -- a store layer or a whole graph directory written
again to bound a chain of deltas -- took its commit from tens of milliseconds to half a second,
and every update arriving meanwhile waited for it. Such a write changes no content (the chain's
rows or graph stay the same), so the follower starts it here, goes on publishing small deltas,
and uses its result at a later commit. Bounded: one job in flight (`start` refuses a second);
`join` waits for it with a timeout; a job that raised is logged and may be started again after
`retry_s` (its result is simply never used: the chain stays as it was, readable and bounded by
the caller's synchronous fallback).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class BackgroundJob:
    """One job at a time named `name` (module doc); a failed job may start again after `retry_s`."""

    def __init__(self, name: str, *, retry_s: float = 5.0):
        if retry_s < 0:
            raise ValueError(f"retry_s must be >= 0, got {retry_s}")
        self.name = name
        self.retry_s = float(retry_s)
        self.failures = 0
        self.done = 0
        self._thread: threading.Thread | None = None
        self._key: Any = None
        self._result: tuple[Any, Any] | None = None  # (key, value) of the last job that succeeded
        self._failed_at: float | None = None

    @property
    def busy(self) -> bool:
        """Whether a job is running."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def running_key(self) -> Any:
        """The key of the job running (None when none is)."""
        return self._key if self.busy else None

    def start(self, key: Any, work: Callable[[], Any]) -> bool:
        """Run `work()` on a daemon thread, its result to be taken with its `key` (`take`);
        False (nothing started) while a job runs, or within `retry_s` of a failure."""
        if self.busy:
            return False
        if self._failed_at is not None and time.monotonic() - self._failed_at < self.retry_s:
            return False

        def run() -> None:
            started = time.perf_counter()
            try:
                value = work()
            except Exception:  # noqa: BLE001 - logged; the caller's state never depends on it
                self.failures += 1
                self._failed_at = time.monotonic()
                log.exception(f"{self.name}: background job {key!r} failed (retried later)")
                return
            self._result = (key, value)
            self._failed_at = None
            self.done += 1
            log.info(f"{self.name}: background job {key!r} done in {time.perf_counter() - started:.3f}s")

        self._key = key
        self._thread = threading.Thread(target=run, name=f"{self.name}-background", daemon=True)
        self._thread.start()
        return True

    def take(self) -> tuple[Any, Any] | None:
        """(key, value) of the last job that finished successfully, once (None when there is none,
        or while its successor runs: the caller then uses neither)."""
        if self.busy or self._result is None:
            return None
        out, self._result = self._result, None
        return out

    def join(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the job running; whether none is running afterwards."""
        if self._thread is not None:
            self._thread.join(timeout=max(float(timeout_s), 0.0))
        return not self.busy
