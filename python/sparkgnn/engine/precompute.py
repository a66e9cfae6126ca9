"""`sparkgnn.precompute`: offline per-layer embeddings (PEs) with their aggregation states, plus
workload metrics, into a PE store (docs/ARCHITECTURE.md "PE store"; OMEGA/Reforge PEs, Quiver metrics).

It is batch inference with a hook, through the exchange and prepared layout the batch job takes on
the same graph: the tasks of every step that completes a layer write its rows (h and states) into a
staged attempt of the store themselves, and the store then commits the layer atomically. A rerun
resumes after the last committed layer (the executor starts from the stored h^(l) instead of x);
force recomputes.
States are stored in the layer's raw message space (no transform-then-propagate for a store with
states), so a node can later be recomputed from its stored state plus its changed in-edges with the
plain layer contract: state' = merge(state, partial(new messages)); h = update(h_prev, finalize(state')).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sparkgnn.engine import phases
from sparkgnn.engine.api import _exchange_for, _usable_exchange, load_job_inputs, plan_for, resolve_work_dir
from sparkgnn.engine.exchange import EXCHANGES
from sparkgnn.engine.executor import execute
from sparkgnn.engine.materialise import materialise_kind
from sparkgnn.engine.pushdown import shuffle_partitions
from sparkgnn.engine.result import StoreResult, legacy_positional
from sparkgnn.layers.generic import require_states
from sparkgnn.runners import check_workers, workers_for
from sparkgnn.stat_keys import stat_keys

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sparkgnn.engine.api import GraphSource, ModelSource
    from sparkgnn.messenger.local import LocalCluster

log = logging.getLogger(__name__)


def _widths(model, plan, layer: int) -> tuple[int, int]:
    """(h width, state width) of PE layer `layer` (1-based: the output of the first `layer` convs)."""
    width = model.conv(layer).in_dim if layer < model.num_rounds else model.out_dim
    conv = model.conv(layer - 1)
    return width, conv.state_width(plan.layers[layer - 1].pre_transform)


def _contiguous(done: list[int]) -> int:
    count = 0
    while count + 1 in set(done):
        count += 1
    return count


#: precompute's options in the previous release's positional order (legacy_positional maps them).
PRECOMPUTE_LEGACY_ORDER = (
    "store", "states", "metrics", "workers", "force", "strategy", "partitions", "work_dir", "fanouts",
    "hops", "validate", "log", "on_layer_committed", "materialise",
)  # fmt: skip


@legacy_positional(PRECOMPUTE_LEGACY_ORDER)
def precompute(
    spark: SparkSession,
    graph: GraphSource,
    model: ModelSource,
    *,
    store: str | os.PathLike[str],
    states: bool = True,
    metrics: bool = True,
    workers: str | LocalCluster = "inprocess",
    force: bool = False,
    strategy: str = "auto",
    partitions: int | None = None,
    work_dir: str | None = None,
    fanouts: Sequence[int] = (25, 10),
    hops: int | None = None,
    validate: bool = True,
    on_layer_committed: Callable[[int], None] | None = None,
    materialise: str = "auto",
    _legacy: bool = False,
) -> StoreResult:
    """Compute and store h^(1..k) (and merged states) of every vertex, plus workload metrics, in
    the PE store at `store`. Returns a StoreResult (engine.result): the opened PEStore, the
    engine's RunReport and the plan it ran (both None when every layer was already committed).
    `states`: keep each vertex's merged aggregation state (a refresh and the srpe/exact serving
    modes need them). `force`: recompute layers already committed. `fanouts`/`hops`: the workload
    metrics' sampling (hops defaults to the model's rounds). `on_layer_committed(layer)` is called
    after each layer commits. `materialise`: how each step is kept between steps, as in `infer`
    (engine.materialise; "auto": Parquet in the work dir on a cluster). `workers`, `strategy`,
    `partitions`, `work_dir`, `validate`: as in `infer`. Options after `model` are keyword-only;
    the previous release's positional form still works with a DeprecationWarning and returns the
    PEStore, as it did."""
    store = os.fspath(store)
    from sparkgnn.engine.typed import is_typed_source

    if is_typed_source(graph) or is_typed_source(model):  # a typed store per node type (pe/typed.py)
        from sparkgnn.engine.precompute_typed import precompute_typed

        if states or metrics:
            log.info("sparkgnn precompute: a typed store keeps embeddings per node type only (no states, no metrics)")
        return precompute_typed(
            spark, graph, model, store=store, force=force, strategy=strategy, partitions=partitions,
            workers=workers, work_dir=work_dir, validate=validate, materialise=materialise,
        )  # fmt: skip
    report = plan = None
    from sparkgnn.dl.model_store import register
    from sparkgnn.pe import PEStore, PEWriter

    with phases.phase("input checks"):
        check_workers(workers)  # a typo fails in a second, not after preparing the graph
    graph, model = load_job_inputs(spark, graph, model, validate=validate)
    require_states(model, "the PE precompute")
    # convs reading edge features run as in infer (load_job_inputs checked the graph's edge_attr);
    # refresh and serving refuse such a store's model (their edge rows carry no attributes yet)
    with phases.phase("store: open the writer"):
        writer = PEWriter(store, graph, model, with_states=states, force=force)
    start = _contiguous(writer.completed_layers())
    num_layers = model.num_rounds
    if start:
        log.info(f"sparkgnn precompute: layers 1..{start} already committed in {store}; resuming")
    if start < num_layers:
        root = resolve_work_dir(spark, None, work_dir)
        # the exchange and prepared layout the batch job takes on this graph (engine.api.infer)
        kind = _exchange_for(spark, "auto", strategy, root)
        mapped = kind == "files" and workers == "inprocess"
        prepared, plan = plan_for(
            spark, graph, model, strategy, partitions, work_dir=root, exchange=kind, keep_states=states,
            mapped_payloads=mapped,
        )  # fmt: skip
        usable = _usable_exchange(kind, "auto", plan, root)
        if usable != kind and mapped:  # P was chosen for payloads in files: plan again for the shuffle
            prepared, plan = plan_for(
                spark, graph, model, strategy, partitions, work_dir=root, exchange=usable, keep_states=states
            )
        kind = usable
        if states:
            for layer in plan.layers:  # canonical raw-space states (module doc)
                layer.pre_transform = False
        model_store = os.path.join(root, "models")
        with phases.phase("model store"):
            fingerprint = register(model, model_store)
        needs_dst = [bool(info["needs_dst_in_message"]) for info in model.plan_info()]
        resume = (start, writer.layer_frame(spark, start)) if start else None

        def commit(layer: int, _rows) -> None:
            """The step's tasks wrote the layer's rows into its staged attempt: record and commit it."""
            started = time.perf_counter()
            width, state_width = _widths(model, plan, layer)
            with phases.phase("layer commits", quiet=True):
                writer.commit_staged_layer(layer, width, state_width if states else None)
            log.info(
                f"sparkgnn precompute: committed layer {layer}/{num_layers} ({time.perf_counter() - started:.1f} s)"
            )
            if on_layer_committed is not None:
                on_layer_committed(layer)

        with phases.phase("workers start"):
            runners = workers_for(workers, model_store)
        # through the shuffle on a cluster each step is kept as Parquet in the work dir (a lost
        # executor costs only its tasks); a rerun resumes from the store's committed layers, so the
        # steps are never kept
        route = EXCHANGES[kind](root, plan.partitions, plan.concurrent_tasks, materialise_kind(spark, materialise))
        try:
            with shuffle_partitions(spark, plan), phases.phase("steps: driver between steps"):
                _rows, report, *_ = execute(
                    spark,
                    prepared,
                    plan,
                    fingerprint,
                    graph,
                    runners.spec,
                    with_pred=False,
                    needs_dst=needs_dst,
                    on_layer=commit,
                    resume=resume,
                    exchange=route,
                    stats=stat_keys(model.conv_list()),
                    stage_layer=writer.stage_layer,
                )
        finally:
            with phases.phase("cleanup (exchange files, workers)"):
                route.close(keep=False)
                runners.close()
    if metrics and not writer.has_metrics():
        from sparkgnn.pe.metrics import one_pass_metrics

        started = time.perf_counter()
        with phases.phase("workload metrics", quiet=True):
            writer.commit_metrics(one_pass_metrics(graph, list(fanouts), hops or num_layers))
        log.info(f"sparkgnn precompute: workload metrics in {time.perf_counter() - started:.1f} s")
    with phases.phase("store: finish and verify"):
        writer.finish()
        opened = PEStore.open(store, model=model, graph=graph)
    return opened if _legacy else StoreResult(opened, report, plan)  # type: ignore[return-value]
