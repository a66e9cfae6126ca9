"""The service's parse pool: where both fronts decode and validate requests.

WHY a pool of its own: decoding a request (an HTTP JSON body, or a ZeroMQ message's header and
Arrow tables) and validating it against the graph costs time in proportion to its size. Done on
a front's single intake thread (the HTTP front's event loop, the ZeroMQ front's socket thread),
one large request would stall every other client of that front. Both fronts hand that work to
the same `threads` threads instead, with at most `queue` requests waiting for them; one more is
refused at once (busy: retry later), so neither a flood nor a few huge requests queue without
bound: the bytes held by requests waiting to be parsed stay under (threads + queue) x the body
limit.

A small request skips the pool: a body of at most `INLINE_BYTES` is decoded and checked on the
intake thread itself, where it takes microseconds, less than the hand-off to a parse thread and
back (a thread wake-up each way); it cannot stall the other clients for longer than that.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

DEFAULT_THREADS = 2  # ServeConfig.parse_threads' default
DEFAULT_QUEUE = 64  # ServeConfig.parse_queue's default
INLINE_BYTES = 16 * 1024  # a request body this small is parsed on the intake thread (module doc)


class ParsePool:
    """`threads` parsing threads and at most `queue` jobs waiting for them (see the module)."""

    def __init__(self, threads: int = DEFAULT_THREADS, queue: int = DEFAULT_QUEUE) -> None:
        for name, value, least in (("threads", threads, 1), ("queue", queue, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"ParsePool: {name} must be an integer >= {least}, got {value!r}")
        self.threads, self.queue = threads, queue
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="sparkgnn-serve-parse")
        # a slot per job running or waiting; taken without blocking, released when the job ends
        self._slots = threading.BoundedSemaphore(threads + queue)

    def try_submit(self, fn: Callable[..., T], *args) -> Future[T] | None:
        """Run `fn(*args)` on a parsing thread: its Future, or None when `threads + queue` jobs
        are already running or waiting (or the pool is shut down): the caller refuses the
        request as busy. Never blocks."""
        if not self._slots.acquire(blocking=False):
            return None
        try:
            future = self._executor.submit(fn, *args)
        except RuntimeError:  # shut down: the service is stopping
            self._slots.release()
            return None
        future.add_done_callback(self._release)
        return future

    def _release(self, _future: Future) -> None:
        self._slots.release()

    def shutdown(self) -> None:
        """Stop taking jobs; jobs still waiting are cancelled, running ones finish on their own."""
        self._executor.shutdown(wait=False, cancel_futures=True)
