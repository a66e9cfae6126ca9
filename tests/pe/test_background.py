"""BackgroundJob (pe/background.py): one job in flight at a time, its result taken once, a
failed job logged and started again after its retry delay, join bounded by its timeout."""

import logging
import threading

from sparkgnn.pe.background import BackgroundJob


def test_one_job_in_flight_its_result_taken_once():
    gate = threading.Event()
    job = BackgroundJob("test", retry_s=0)
    assert job.start("a", lambda: gate.wait(10) and 1)
    assert job.busy and job.running_key == "a"
    assert not job.start("b", lambda: 2)  # refused while "a" runs
    assert job.take() is None and not job.join(0.01)  # still running: nothing to take, join times out
    gate.set()
    assert job.join(10) and not job.busy
    assert job.take() == ("a", 1) and job.take() is None
    assert job.done == 1


def test_a_failed_job_is_logged_and_retried_after_the_delay(caplog):
    job = BackgroundJob("test", retry_s=3600)

    def boom():
        raise RuntimeError("disk full")

    with caplog.at_level(logging.ERROR, logger="sparkgnn.pe.background"):
        assert job.start("x", boom) and job.join(10)
    assert job.failures == 1 and job.take() is None
    assert "background job 'x' failed" in caplog.text and "disk full" in caplog.text
    assert not job.start("x", lambda: 1)  # within retry_s of the failure
    job.retry_s = 0
    assert job.start("x", lambda: 1) and job.join(10) and job.take() == ("x", 1)
