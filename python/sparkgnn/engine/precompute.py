"""`sparkgnn.precompute`: offline per-layer embeddings (PEs) with their aggregation states, plus
workload metrics, into a PE store (docs/ARCHITECTURE.md "PE store"; OMEGA/Reforge PEs, Quiver metrics).

It is batch inference with a hook: every step that completes a layer hands its materialised rows to
the store, which commits the layer atomically. A rerun resumes after the last committed layer (the
executor starts from the stored h^(l) instead of x); force recomputes.
States are stored in the layer's raw message space (no transform-then-propagate for a store with
states), so a node can later be recomputed from its stored state plus its changed in-edges with the
plain layer contract: state' = merge(state, partial(new messages)); h = update(h_prev, finalize(state')).
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkgnn.arrowvec import to_list, to_numpy_matrix
from sparkgnn.engine.api import _work_dir, check_model_fits, coerce_graph, coerce_model, plan_for
from sparkgnn.engine.exchange import ShuffleExchange
from sparkgnn.engine.executor import execute
from sparkgnn.engine.materialise import materialise_kind
from sparkgnn.engine.pushdown import shuffle_partitions
from sparkgnn.engine.routing import OWN, PE_STATE
from sparkgnn.engine.session import configure
from sparkgnn.runners import check_workers, workers_for

PE_SCHEMA = "id long, h array<float>"
PE_STATE_SCHEMA = "id long, h array<float>, state array<float>"


def _pair_rows(batches, with_states: bool):
    """Own rows (h) and state rows of the same vertices sit in the same partition (the task that
    computed them emitted both): pair them by id without a shuffle."""
    batches = [b for b in batches if b.num_rows]
    if not batches:
        return
    rows = pa.Table.from_batches(batches)
    kinds = rows.column("kind")
    own = rows.filter(pc.equal(kinds, OWN))
    ids = own.column("id").to_numpy()
    order = np.argsort(ids, kind="stable")
    columns = {"id": pa.array(ids[order]), "h": to_list(to_numpy_matrix(own.column("v"))[order])}
    if with_states:
        states = rows.filter(pc.equal(kinds, PE_STATE))
        state_ids = states.column("id").to_numpy()
        state_order = np.argsort(state_ids, kind="stable")
        if not np.array_equal(state_ids[state_order], columns["id"].to_numpy()):
            raise ValueError(f"state rows do not match own rows in a partition ({len(state_ids)} vs {len(ids)})")
        columns["state"] = to_list(to_numpy_matrix(states.column("v"))[state_order])
    yield pa.RecordBatch.from_pydict(columns)


def pe_frame(rows, with_states: bool):
    """Materialised step rows -> DataFrame(id, h[, state]) with float lists."""
    kinds = f"({OWN}, {PE_STATE})" if with_states else f"({OWN})"
    return rows.where(f"kind in {kinds}").mapInArrow(
        functools.partial(_pair_rows, with_states=with_states), PE_STATE_SCHEMA if with_states else PE_SCHEMA
    )


def _widths(model, plan, layer: int) -> tuple[int, int]:
    """(h width, state width) of PE layer `layer` (1-based: the output of the first `layer` convs)."""
    width = model.conv(layer).in_dim if layer < model.num_layers else model.out_dim
    conv = model.conv(layer - 1)
    return width, conv.state_width(plan.layers[layer - 1].pre_transform)


def _contiguous(done: list[int]) -> int:
    count = 0
    while count + 1 in set(done):
        count += 1
    return count


def precompute(
    spark,
    graph,
    model,
    store: str,
    states: bool = True,
    metrics: bool = True,
    workers="inprocess",
    force: bool = False,
    strategy: str = "auto",
    partitions: int | None = None,
    work_dir: str | None = None,
    fanouts=(25, 10),
    hops: int | None = None,
    validate: bool = True,
    log=print,
    on_layer_committed=None,
    materialise: str = "auto",
):
    """Compute and store h^(1..k) (and merged states) of every vertex, plus workload metrics.
    Returns the opened PEStore. `materialise`: how each step is kept between steps, as in `infer`
    (engine.materialise; "auto": Parquet in the work dir on a cluster)."""
    from sparkgnn.dl.model_store import register
    from sparkgnn.pe import PEStore, PEWriter

    check_workers(workers)  # a typo fails in a second, not after preparing the graph
    configure(spark)
    graph = coerce_graph(spark, graph)
    model = coerce_model(model)
    if validate:
        graph.validate()
    check_model_fits(graph, model)
    writer = PEWriter(store, graph, model, with_states=states, force=force, log=log)
    start = _contiguous(writer.completed_layers())
    num_layers = model.num_layers
    if start:
        log(f"sparkgnn precompute: layers 1..{start} already committed in {store}; resuming")
    if start < num_layers:
        root = _work_dir(spark, None, work_dir)
        prepared, plan = plan_for(spark, graph, model, strategy, partitions, work_dir=root, log=log, keep_states=states)
        if states:
            for layer in plan.layers:  # canonical raw-space states (module doc)
                layer.pre_transform = False
        model_store = os.path.join(root, "models")
        fingerprint = register(model, model_store)
        needs_dst = [bool(info["needs_dst_in_message"]) for info in model.plan_info()]
        resume = (start, writer.layer_frame(spark, start)) if start else None

        def commit(layer: int, rows) -> None:
            started = time.perf_counter()
            width, state_width = _widths(model, plan, layer)
            writer.commit_layer(layer, pe_frame(rows, states), width, state_width if states else None)
            log(f"sparkgnn precompute: committed layer {layer}/{num_layers} ({time.perf_counter() - started:.1f} s)")
            if on_layer_committed is not None:
                on_layer_committed(layer)

        runners = workers_for(workers, model_store)
        # on a cluster each step is kept as Parquet in the work dir (a lost executor costs only its
        # tasks); a rerun resumes from the store's committed layers, so the steps are never kept
        route = ShuffleExchange(root, plan.partitions, materialise=materialise_kind(spark, materialise))
        try:
            with shuffle_partitions(spark, plan):
                execute(
                    spark,
                    prepared,
                    plan,
                    fingerprint,
                    graph,
                    runners.spec,
                    with_pred=False,
                    needs_dst=needs_dst,
                    log=log,
                    on_layer=commit,
                    resume=resume,
                    exchange=route,
                )
        finally:
            route.close(keep=False)
            runners.close()
    if metrics and not writer.has_metrics():
        from sparkgnn.pe.metrics import compute_metrics

        started = time.perf_counter()
        writer.commit_metrics(compute_metrics(graph, list(fanouts), hops or num_layers))
        log(f"sparkgnn precompute: workload metrics in {time.perf_counter() - started:.1f} s")
    writer.finish()
    return PEStore.open(store, model=model, graph=graph)
