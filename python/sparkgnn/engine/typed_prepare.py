"""A typed round's relation layouts prepared concurrently, before its relation jobs run (engine.typed).

WHY: every relation of a typed round is its own homogeneous job, and each job's first step is the
prepare of its relation graph's layout (engine.prepare: ownership, edge layouts, statistics):
a handful of small Spark jobs whose cost is mostly fixed latency (planning, scheduling, Parquet
commits) with the cores idle in between. The relations' prepares are independent (each its own
graph fingerprint, hence its own folder under `<work dir>/prep/`), so the base layouts of all of
them are written by prepare's tasks in one pass (engine.prepare.prepare_many: two Spark jobs for
the round, where a relation graph's Spark SQL prepare is a score of jobs per relation), reading
the relation's own folders of the typed graph directory (engine.typed_relations.relation_row_files),
each for the partition count its job will ask for (engine.api.layout_for, plan_for's choice).
Then driver threads run exactly the planning a relation job runs (`plan_for` with the job's
strategy, partitions and exchange): it reuses the base layout and writes the combine layouts its
plan reads, Spark running those jobs side by side; a relation whose rows are only DataFrames is
prepared there whole. The relation jobs then find their layouts prepared and reuse them; should a
job still plan another count, it prepares that itself, as it would have without this step.

What the threads touch: prepare's Spark jobs (their own cached frames, temp views of their own
names and a thread-local job description) and the work dir's read-only calibration. The job's
phase clock is a context variable the threads do not see, so the whole step is one phase of the
caller's table ("typed round R: relation layouts, prepared concurrently"); a whole-graph relation
only: a pruned run's relation graphs depend on the request and their jobs may not prepare at all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from sparkgnn.engine.phases import phase

log = logging.getLogger(__name__)

#: At most this many relation prepares run at once: each caches its relation's edges while it runs.
MAX_CONCURRENT = 4


class Prepares:
    """Relation prepares running on driver threads (start_prepares); `wait` joins them."""

    def __init__(self, futures: list[Future], index: int) -> None:
        self._futures = futures
        self._index = index

    def __len__(self) -> int:
        return max(len(self._futures) - 1, 0)  # the first future writes the base layouts of all

    def wait(self) -> int:
        """Block until every prepare ended (the wait is the caller's phase "typed round R:
        relation layouts, prepared concurrently"); raises the first one's failure, as the
        relation's job would have. Returns how many ran."""
        with phase(f"typed round {self._index}: relation layouts, prepared concurrently"):
            for future in self._futures:
                future.result()
        if self._futures:
            log.info(f"sparkgnn: typed round {self._index}: {len(self)} relation layouts prepared concurrently")
        return len(self)

    def close(self) -> None:
        """Cancel the prepares not started and wait for the others, their failures ignored (the
        caller is failing already): no Spark job of theirs outlives the call that started them."""
        for future in self._futures:
            future.cancel()
        wait(self._futures)


def start_prepares(spark, relations: Sequence[tuple[Any, Any]], options: Mapping[str, Any], index: int) -> Prepares:
    """Start preparing, on driver threads, the layouts of `relations` ((relation graph, one-conv
    model) pairs of round `index`) that the work dir does not hold yet (module doc); `options`:
    the relation jobs' keyword options (strategy, partitions, workers, work_dir, exchange). A
    relation graph's vertices are read for their ids only, so its features need not be computed
    yet: the caller may compute them meanwhile. Fewer than two to prepare: none started (a
    relation prepares in its own job, nothing to overlap)."""
    from sparkgnn.engine.api import _exchange_for, layout_for, load_job_inputs, plan_for
    from sparkgnn.engine.exchange import files_reach_every_task
    from sparkgnn.engine.prepare import layout_writer, prepare_many

    root = options["work_dir"]
    strategy, partitions = options.get("strategy", "auto"), options.get("partitions")
    kind = _exchange_for(spark, options.get("exchange", "auto"), strategy, root)
    mapped = kind == "files" and options.get("workers", "inprocess") == "inprocess"
    todo = [(g, m) for g, m in relations if not _prepared_before(g, partitions, root)]
    if len(todo) < 2:
        return Prepares([], index)

    def one(pair: tuple[Any, Any]) -> None:
        graph, model = load_job_inputs(spark, pair[0], pair[1], validate=False, work_dir=root)
        plan_for(spark, graph, model, strategy, partitions, work_dir=root, exchange=kind, mapped_payloads=mapped)

    def base_layouts() -> None:
        """Every relation's base layout in one pass (prepare.prepare_many), for the partition count
        its job will ask for (layout_for, as plan_for chooses it); a relation whose layout the
        tasks would not write (prepare.layout_writer: rows that are not local files every task
        reaches) is left to its own prepare in `one`."""
        shared = files_reach_every_task(spark, root)
        loaded = [load_job_inputs(spark, g, m, validate=False, work_dir=root) for g, m in todo]
        loaded = [(g, m) for g, m in loaded if layout_writer(g, kind, shared_disk=shared) == "tasks"]
        counts = [
            layout_for(spark, g, m, partitions, work_dir=root, exchange=kind, mapped_payloads=mapped).partitions
            for g, m in loaded
        ]
        prepare_many(spark, [(g, p) for (g, _), p in zip(loaded, counts, strict=True)], root)

    pool = ThreadPoolExecutor(max_workers=min(len(todo), MAX_CONCURRENT), thread_name_prefix="sg-prepare")
    first = pool.submit(base_layouts)

    def after_base(pair: tuple[Any, Any]) -> None:
        first.result()  # the base layouts are written (or failed: raised here, as the job would have)
        one(pair)

    # the pool's first thread writes the base layouts; the others wait for them, then plan each
    # relation (the combine layouts a plan picks are written there, relation by relation)
    futures = [first] + [pool.submit(after_base, pair) for pair in todo]
    pool.shutdown(wait=False)  # the threads end with their last prepare
    return Prepares(futures, index)


def prepare_relations(spark, relations: Sequence[tuple[Any, Any]], options: Mapping[str, Any], index: int) -> int:
    """start_prepares, then wait for them: how many it prepared."""
    return start_prepares(spark, relations, options, index).wait()


def _prepared_before(graph, partitions: int | None, root: str) -> bool:
    """Whether an earlier round or job prepared the relation graph (for `partitions`, or for any
    count when the job leaves it to the planner): its job reuses that layout, nothing to overlap."""
    from sparkgnn import files
    from sparkgnn.engine.prepare import is_prepared

    fingerprint = graph.known_fingerprint
    if fingerprint is None:
        return False
    if partitions is not None:
        return is_prepared(graph, partitions, root)
    return files.exists(files.join(root, "prep", str(fingerprint)))


__all__ = ["MAX_CONCURRENT", "Prepares", "prepare_relations", "start_prepares"]
