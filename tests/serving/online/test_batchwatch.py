"""sparkgnn.serving.online.batchwatch.BatchWatch: a batch ending in time is the caller's to answer;
one past the timeout is handed to on_late once (even when batches end out of order) and its late
end says so; close ends the watchdog at once."""

from __future__ import annotations

import threading
import time

import pytest

from sparkgnn.serving.online.batchwatch import BatchWatch


def started(timeout_s: float) -> tuple[BatchWatch, list, threading.Thread]:
    late: list = []
    watch = BatchWatch(timeout_s, late.append)
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    return watch, late, thread


def wait_for(cond, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_batch_in_time_is_the_callers_and_a_late_one_the_watchdogs():
    watch, late, thread = started(0.2)
    quick = watch.begin("quick")
    assert watch.end(quick) and late == []
    slow = watch.begin("slow")
    began = time.monotonic()
    wait_for(lambda: late)
    assert late == ["slow"] and time.monotonic() - began >= 0.19
    assert not watch.end(slow)  # answered "timeout" already: the caller drops its result
    watch.close()
    thread.join(5)
    assert not thread.is_alive()


def test_batches_ending_out_of_order_are_each_judged_on_their_own_deadline():
    watch, late, thread = started(0.3)
    first = watch.begin("first")
    time.sleep(0.1)
    second = watch.begin("second")
    assert watch.end(second)  # the younger one ends first, in time
    wait_for(lambda: late)
    assert late == ["first"] and not watch.end(first)
    third = watch.begin("third")
    assert watch.end(third)
    time.sleep(0.4)  # past every deadline: nothing else is late
    assert late == ["first"]
    watch.close()
    thread.join(5)


def test_an_idle_watchdog_closes_at_once_and_a_bad_timeout_is_refused():
    watch, _, thread = started(60.0)  # idle: waits a minute at most, never woken
    time.sleep(0.05)
    began = time.monotonic()
    watch.close()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - began < 2.0
    with pytest.raises(ValueError, match="batch timeout must be > 0"):
        BatchWatch(0.0, print)
