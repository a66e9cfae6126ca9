"""The parse pool takes at most threads + queue jobs, refuses the next at once (None, never a
wait), frees a slot when a job ends (failed ones too), refuses bad sizes, and takes nothing
once shut down."""

from __future__ import annotations

import threading

import pytest

from sparkgnn.serving.online.parsing import ParsePool


def test_beyond_threads_plus_queue_a_job_is_refused_at_once_and_slots_come_back():
    pool = ParsePool(1, 2)
    gate = threading.Event()
    try:
        held = [pool.try_submit(gate.wait, 10) for _ in range(3)]  # one running, two waiting
        assert all(f is not None for f in held)
        assert pool.try_submit(lambda: "late") is None
        gate.set()
        assert all(f.result(10) for f in held)
        failing = pool.try_submit(lambda: 1 / 0)
        assert failing is not None and isinstance(failing.exception(10), ZeroDivisionError)
        answers = [pool.try_submit(lambda i=i: i) for i in range(3)]  # every slot free again
        assert [f.result(10) for f in answers] == [0, 1, 2]
    finally:
        gate.set()
        pool.shutdown()


@pytest.mark.parametrize(
    "threads, queue, words",
    [(0, 1, "threads must be an integer >= 1"), (1, -1, "queue must be an integer >= 0"), (True, 1, "threads")],
)
def test_bad_sizes_are_refused_naming_them(threads, queue, words):
    with pytest.raises(ValueError, match=words):
        ParsePool(threads, queue)


def test_a_shut_down_pool_takes_nothing():
    pool = ParsePool(1, 0)
    pool.shutdown()
    assert pool.try_submit(lambda: 1) is None
