"""engine.typed_jobs: a typed round's relation jobs side by side on driver threads, results in order."""

import threading
import time

import pytest

from sparkgnn.engine import phases
from sparkgnn.engine.phases import PhaseClock
from sparkgnn.engine.typed_jobs import MAX_CONCURRENT, run_relation_jobs


class _Context:
    """sparkContext's job tags and cancellation, recorded per thread (no JVM needed)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tags: dict[int, set[str]] = {}
        self.cancelled: list[str] = []

    def addJobTag(self, tag: str) -> None:  # noqa: N802 - pyspark's name
        with self.lock:
            self.tags.setdefault(threading.get_ident(), set()).add(tag)

    def removeJobTag(self, tag: str) -> None:  # noqa: N802 - pyspark's name
        with self.lock:
            self.tags[threading.get_ident()].discard(tag)

    def cancelJobsWithTag(self, tag: str) -> None:  # noqa: N802 - pyspark's name
        with self.lock:
            self.cancelled.append(tag)


class _Spark:
    def __init__(self) -> None:
        self.sparkContext = _Context()


def test_jobs_run_side_by_side_and_come_back_in_the_relation_order():
    spark, running, peak, lock = _Spark(), [0], [0], threading.Lock()

    def job(i: int):
        def run():
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            with phases.phase("steps", quiet=True):
                time.sleep(0.05 * (6 - i))  # the first relation ends last
            with lock:
                running[0] -= 1
            return i, threading.current_thread().name

        return run

    clock = PhaseClock()
    with phases.activate(clock):
        results = run_relation_jobs(spark, [(f"r{i}", job(i)) for i in range(6)], 0, concurrent=True)
    assert [i for i, _ in results] == list(range(6))
    assert all(name.startswith("sg-relation") for _, name in results)
    assert peak[0] == MAX_CONCURRENT
    doc = clock.summary()
    assert [row["name"] for row in doc["phases"]] == ["typed round 0: relation jobs"]
    assert doc["inside"]["typed round 0: relation jobs"] == [
        {"name": "steps", "seconds": pytest.approx(0.05 * 21, abs=0.2), "calls": 6}
    ]
    # each job's Spark jobs carried a tag of its own, removed when it ended
    assert all(not tags for tags in spark.sparkContext.tags.values())


def test_a_failed_job_cancels_the_others_and_its_error_is_raised():
    spark = _Spark()
    started: list[int] = []

    def job(i: int):
        def run():
            started.append(i)
            if i == 1:
                time.sleep(0.05)  # the pool's other threads have taken their first jobs
                raise ValueError("relation 1 failed")
            time.sleep(0.2)
            return i

        return run

    with pytest.raises(ValueError, match="relation 1 failed"):
        run_relation_jobs(spark, [(f"r{i}", job(i)) for i in range(8)], 0, concurrent=True)
    # the jobs queued behind the running ones never started; the running ones' tags were cancelled
    assert len(started) == MAX_CONCURRENT
    assert len(spark.sparkContext.cancelled) == 7


def test_not_concurrent_runs_them_one_after_another_on_this_thread():
    names = run_relation_jobs(
        _Spark(), [(f"r{i}", lambda: threading.current_thread().name) for i in range(3)], 1, concurrent=False
    )
    assert names == [threading.current_thread().name] * 3
