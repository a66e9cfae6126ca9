"""The PE precompute of a typed model over a typed graph (`sparkgnn.precompute` with typed inputs):
the typed batch inference's rounds (engine/typed.py: one homogeneous engine run per relation, the
cross-relation merge and per-type node ops in Spark), every round computing every type it gives a
value, each type's value committed as that round's layer of the type's sub-store in the typed PE
store (pe/typed.py), the same rows `precompute_local` writes.

WHY through engine/typed.py's rounds and not a second typed executor: every relation then runs
the homogeneous engine (strategies, planner, exchange) whose exactness is tested, and the store's
values are exactly what typed batch inference computes. Resume: a round whose every type is
already committed is still recomputed when a later round needs it (its values are the next
round's input); only its commits are skipped.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sparkgnn.engine.result import StoreResult

log = logging.getLogger(__name__)


def precompute_typed(
    spark: SparkSession,
    graph: Any,
    model: Any,
    *,
    store: str,
    force: bool = False,
    strategy: str = "auto",
    partitions: int | None = None,
    workers: Any = "inprocess",
    work_dir: str | None = None,
    validate: bool = True,
    exchange: str = "auto",
    materialise: str = "auto",
) -> StoreResult:
    """Compute and store h^(1..k) per node type of a typed model over a typed graph in the typed
    PE store at `store` (pe/typed.py). Returns a StoreResult whose `store` is the opened
    TypedPEStore and whose `report` / `plan` map `<round>:<relation key>` to each relation run's
    (None when every layer was already committed). Options as in `sparkgnn.infer`."""
    from sparkgnn.engine.api import resolve_work_dir
    from sparkgnn.engine.result import StoreResult
    from sparkgnn.engine.session import configure
    from sparkgnn.engine.typed import RUN_FOLDER, _coerce, _inputs, _run_round
    from sparkgnn.layers.nodeops import NodeOpStack
    from sparkgnn.outputs import discard
    from sparkgnn.pe.typed import TypedPEStore, TypedPEWriter

    configure(spark)
    started = time.perf_counter()
    graph, model = _coerce(spark, graph, model, validate)
    writer = TypedPEWriter(store, graph, model, force=force)
    rounds = model.round_list()
    todo = [l for l in range(1, len(rounds) + 1) if any(l not in writer.done(t) for t in writer.types_at(l))]
    reports: dict[str, Any] = {}
    plans: dict[str, Any] = {}
    if todo:
        last = max(todo)
        root = resolve_work_dir(spark, None, work_dir)
        run_dir = f"{root.rstrip('/')}/{RUN_FOLDER}/{uuid.uuid4().hex}"
        common = dict(strategy=strategy, partitions=partitions, workers=workers, explain=False, work_dir=root)
        common.update(validate=False, model_store=None, exchange=exchange, materialise=materialise)
        try:
            values = _inputs(graph, model, set(model.in_dims), None)
            fingerprints = (graph.fingerprint, model.fingerprint())
            widths = {
                t: cast(NodeOpStack, model.pre_ops[t]).out_dim(w) if t in model.pre_ops else w
                for t, w in model.in_dims.items()
            }
            for index, rnd in enumerate(rounds[:last]):
                need = set(rnd.out_types)
                values = _run_round(
                    spark, graph, rnd, index, need, values, widths, run_dir, common, reports, plans,
                    fingerprints=fingerprints,
                )  # fmt: skip
                widths = rnd.out_dims(widths, index)
                for t in writer.types_at(index + 1):
                    if index + 1 not in writer.done(t):
                        writer.commit_frame(index + 1, t, values[t], widths[t])
                log.info(f"sparkgnn precompute: typed round {index + 1}/{len(rounds)} committed")
        finally:
            discard(run_dir)
    else:
        log.info(f"sparkgnn precompute: every typed layer already committed in {store}")
    writer.finish(time.perf_counter() - started)
    opened = TypedPEStore.open(store, model=model, graph=graph)
    return StoreResult(opened, reports or None, plans or None)  # type: ignore[arg-type]


__all__ = ["precompute_typed"]
