"""A typed round's relation jobs submitted side by side from driver threads (engine.typed).

WHY: every relation of a typed round is its own homogeneous job (engine.typed), and a relation
job on a graph of a few hundred thousand edges is mostly fixed driver latency: planning, Spark's
scheduling, Parquet commits, one or two short steps with the cores idle in between. The jobs of
one round are independent (each reads the round's input values and its own relation's layout and
writes its own run folder), so they are submitted together from up to MAX_CONCURRENT driver
threads and Spark runs their stages side by side; their outputs come back in the relation order,
so the round's merge reads them in the same order as when they ran one after another.

What makes that safe: each thread runs its job under its own fork of the caller's phase clock
(engine.phases; the forks are absorbed into the round's "relation jobs" phase), a Spark job tag of
its own (the others' jobs are cancelled when one fails) and, like every job, a thread-local job
description. The session-wide settings a job touches are taken in turn: a pushdown plan's
spark.sql.shuffle.partitions (engine.pushdown.shuffle_partitions) and the work dir's calibration
file (engine.calibration.record). The scheduler mode is left as the session has it: under FIFO
(Spark's default) the earlier job's tasks are offered free cores first, and the others' driver
work still overlaps them.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

from sparkgnn.engine import phases
from sparkgnn.engine.spark_compat import has_jvm

log = logging.getLogger(__name__)

#: At most this many relation jobs of a round run at once.
MAX_CONCURRENT = 4

T = TypeVar("T")


def run_relation_jobs(spark, jobs: Sequence[tuple[str, Callable[[], T]]], index: int, *, concurrent: bool) -> list[T]:
    """Run round `index`'s relation jobs ((key, job) pairs, the key naming the relation) and
    return their results in the order given. `concurrent`: on min(len(jobs), MAX_CONCURRENT)
    driver threads (module doc), else one after another on this thread. The phase
    "typed round R: relation jobs" covers them either way. When a job fails, the jobs not
    started are dropped, the running ones' Spark jobs cancelled, and the failure raised once
    every thread has ended (the first to fail, when several did)."""
    name = f"typed round {index}: relation jobs"
    with phases.phase(name):
        if not concurrent or len(jobs) < 2:
            return [job() for _, job in jobs]
        return _side_by_side(spark, jobs, name)


def _side_by_side(spark, jobs: Sequence[tuple[str, Callable[[], T]]], name: str) -> list[T]:
    clock = phases.active()
    forks: list[phases.PhaseClock] = []
    run = uuid.uuid4().hex[:12]
    tags = [f"sparkgnn-typed-{run}-{i}" for i in range(len(jobs))]
    failed: list[BaseException] = []
    lock = threading.Lock()

    def one(i: int) -> T:
        with lock:
            if failed:  # another relation failed already: do not start this one
                raise RuntimeError("cancelled: another relation job of the round failed")
        fork = clock.fork() if clock is not None else None
        _tag(spark, tags[i], add=True)
        try:
            if fork is None:
                return jobs[i][1]()
            with phases.activate(fork):
                return jobs[i][1]()
        except BaseException as exc:
            with lock:
                first = not failed
                failed.append(exc)
            if first:
                log.warning(f"sparkgnn: relation job {jobs[i][0]} failed; cancelling the round's other relation jobs")
                for j, tag in enumerate(tags):
                    if j != i:
                        _cancel(spark, tag)
            raise
        finally:
            _tag(spark, tags[i], add=False)
            if fork is not None:
                with lock:
                    forks.append(fork)

    pool = ThreadPoolExecutor(max_workers=min(len(jobs), MAX_CONCURRENT), thread_name_prefix="sg-relation")
    try:
        futures = [pool.submit(one, i) for i in range(len(jobs))]
        wait(futures)
    finally:
        pool.shutdown(wait=True)
        if clock is not None:
            clock.absorb(name, forks)
    if failed:
        raise failed[0]
    log.info(f"sparkgnn: {name}: {len(jobs)} relation jobs ran side by side")
    return [future.result() for future in futures]


def _tag(spark, tag: str, *, add: bool) -> None:
    """Tag (or stop tagging) this thread's Spark jobs with `tag`: sparkContext's job tags on a
    classic session, the session's tags on Spark Connect (both thread-local)."""
    try:
        if has_jvm(spark):
            sc = spark.sparkContext
            sc.addJobTag(tag) if add else sc.removeJobTag(tag)
        else:
            spark.addTag(tag) if add else spark.removeTag(tag)
    except Exception:  # noqa: BLE001 - a tag only serves cancelling; never fail a job over it
        log.debug(f"sparkgnn: could not {'set' if add else 'clear'} job tag {tag}", exc_info=True)


def _cancel(spark, tag: str) -> None:
    """Cancel the Spark jobs running under `tag` (a failed round's other relation jobs)."""
    try:
        if has_jvm(spark):
            spark.sparkContext.cancelJobsWithTag(tag)
        else:
            spark.interruptTag(tag)
    except Exception:  # noqa: BLE001 - cancelling is best effort: their jobs end on their own
        log.debug(f"sparkgnn: could not cancel the jobs tagged {tag}", exc_info=True)


__all__ = ["MAX_CONCURRENT", "run_relation_jobs"]
