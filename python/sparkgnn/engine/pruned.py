"""Inference for requested ids through their k-hop frontier (planner.pruning prices it).

`choose` finds the frontier (collected to the driver while it fits the local budget, one Spark job
per hop, else counted in Spark), prices the registered modes and picks one; `RUNS` then runs it:

  local     the subgraph's features (and per-vertex statistics, over ALL in-edges of its vertices:
            engine.vertex_stats) come to the driver and each layer runs in process over exactly
            what it needs: layer l reads the rows D_(k-l) and the in-edges of D_(k-1-l) and writes
            D_(k-1-l), which the frontier's order makes prefixes (engine.khop.CollectedFrontier).
            The same decomposed propagate as Model.forward (layers/base.py), so it is PyG-exact.
  subgraph  the engine runs on the graph (D_h, in-edges of D_(h-1)) with h = k, or k + 1 when a
            layer reads a per-vertex statistic (then every source of the first layer has all its
            in-edges and its statistic is the whole graph's): exact for the ids under every
            strategy and partitioning, since h^l is right on D_(k-l) by induction. Not offered to
            a model that reads a statistic over OUT-edges (ChebConv's): the subgraph lacks them.
            Cut from a graph whose fingerprint is known, it is not validated, fingerprinted or
            counted again (valid by construction; `subgraph_fingerprint` keys its layout). When
            the frontier fitted the driver, its sets are the collected ones (no Spark pass to
            find and count them again) and, with a local work dir, its rows are written there as
            Parquet files for prepare's tasks to read (engine.prepare_tasks.RowFiles: two Spark
            jobs where the SQL prepare of DataFrames runs a score), removed after the run.
  whole     the caller's normal path over the whole graph, the output filtered to the ids.

Why the driver may hold a local run: it is bounded (planner.pruning.LOCAL_BUDGET_BYTES, the
frontier collection stops at the edge budget), the same way Spark bounds a broadcast; nothing of it
runs in a Spark task, so no task depends on the driver's disk or memory.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkgnn import npsets
from sparkgnn.engine import khop
from sparkgnn.engine.executor import RunReport, StepReport
from sparkgnn.engine.routing import OUTPUT_PRED_SCHEMA_DDL, OUTPUT_SCHEMA_DDL
from sparkgnn.engine.vertex_stats import stats_of
from sparkgnn.errors import SparkGNNError
from sparkgnn.outputs import write_parquet_staged
from sparkgnn.parquet_read import read_parquet
from sparkgnn.planner.pruning import LOCAL, SUBGRAPH, WHOLE, PruningChoice, PruningInputs
from sparkgnn.registry import Registry
from sparkgnn.stat_keys import conv_stats, stat_keys

log = logging.getLogger(__name__)


@dataclass
class PruningContext:
    """What a pruned run needs: the request, the chosen plan's inputs and the frontier found."""

    spark: Any
    graph: Any
    model: Any
    ids: np.ndarray
    ids_df: Any
    choice: PruningChoice
    inputs: PruningInputs
    collected: khop.CollectedFrontier | None = None
    spark_frontier: khop.Frontier | None = None
    timings: list = field(default_factory=list)

    def local_frontier(self) -> khop.CollectedFrontier:
        if self.collected is None:
            raise SparkGNNError("a local pruned run needs the frontier collected to the driver")
        return self.collected

    def sets(self, hops: int) -> khop.Frontier:
        """The frontier's sets in Spark for `hops` hops: the subgraph was priced from the collected
        frontier when it fitted the driver (its counts are the same), so they may still be missing."""
        if self.spark_frontier is None or len(self.spark_frontier.sets) <= hops:
            if self.spark_frontier is not None:
                self.spark_frontier.unpersist()
            self.spark_frontier = khop.upstream(self.ids_df, self.graph.edges, hops)
        return self.spark_frontier


def _needs_stats(model) -> bool:
    return any(conv.required_stats for conv in model.conv_list())


def _reads_out_edge_stats(model) -> bool:
    """Whether a layer reads a statistic over its OUT-edges (layers.stats.OUT_EDGE_STATS), which a
    subgraph of in-edges cannot give (planner.pruning refuses that mode for it)."""
    from sparkgnn.layers.stats import OUT_EDGE_STATS

    return any(OUT_EDGE_STATS.intersection(conv.required_stats) for conv in model.conv_list())


def choose(spark, graph, model, ids_df, requested: str, layer_seconds, whole_prepared: bool, strategy: str = "auto"):
    """The frontier and the priced choice (planner.pruning.choose) for this request."""
    from sparkgnn.planner import pruning

    started = time.perf_counter()
    ids = ids_df.toArrow().column("id").to_numpy().astype(np.int64)
    k = model.num_rounds
    needs_stats = _needs_stats(model)
    stats = graph.stats()
    collected = None
    if requested in (LOCAL, SUBGRAPH, "auto"):
        # a local run needs k hops; a subgraph (the only engine mode left when it is asked for or
        # a strategy is forced) needs one more with statistics: collected while they fit the driver
        local_possible = requested == LOCAL or (requested == "auto" and strategy == "auto")
        hops = k if local_possible else k + (1 if needs_stats else 0)
        max_edges = pruning.LOCAL_BUDGET_BYTES // pruning.EDGE_BYTES
        collected = khop.collect_upstream(spark, ids, graph.edges, hops, max_edges)
    spark_frontier = None
    if collected is not None:
        frontier = pruning.Frontier(list(collected.sizes), list(collected.in_edges))
    elif requested == WHOLE:
        frontier = pruning.Frontier([len(ids)], [])
    else:
        spark_frontier = khop.upstream(ids_df, graph.edges, k + (1 if needs_stats else 0))
        frontier = pruning.Frontier(list(spark_frontier.sizes), list(spark_frontier.in_edges))
    inputs = pruning.PruningInputs(
        layers=model.plan_info(),
        num_vertices=int(stats["num_vertices"]),
        num_edges=int(stats["num_edges"]),
        feature_dim=int(stats["feature_dim"]),
        frontier=frontier,
        collected=collected is not None,
        layer_seconds=layer_seconds,
        whole_prepared=whole_prepared,
        needs_stats=needs_stats,
        out_edge_stats=_reads_out_edge_stats(model),
        strategy=strategy,
    )
    choice = pruning.choose(inputs, requested if requested != "off" else WHOLE)
    seconds = time.perf_counter() - started
    log.info(f"sparkgnn: frontier of {len(ids):,} ids over {k} hop(s) in {seconds:.1f} s: {choice.reason}")
    ctx = PruningContext(spark, graph, model, ids, ids_df, choice, inputs, collected, spark_frontier)
    ctx.timings.append(("frontier", seconds))
    if choice.mode != SUBGRAPH and spark_frontier is not None:
        spark_frontier.unpersist()
    return ctx


def _features(ctx: PruningContext) -> np.ndarray:
    """x of every frontier vertex, in the frontier's order (float32 [rows, d])."""
    order = ctx.local_frontier().order
    table = khop.semi_join_ids(ctx.spark, ctx.graph.vertices, order, on="id").select("id", "x").toArrow()
    if table.num_rows != len(order):
        raise SparkGNNError(
            f"graph {ctx.graph.name}: {len(order) - table.num_rows} of the frontier's {len(order)} vertices "
            "have no vertex row (edges name unknown vertices)"
        )
    column = table.column("x").combine_chunks()
    dim = int(ctx.inputs.feature_dim)
    values = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    x = np.empty((len(order), dim), dtype=np.float32)
    x[khop.positions(order)(table.column("id").to_numpy())] = values.reshape(-1, dim)
    return x


def run_layers(model, frontier: khop.CollectedFrontier, x: np.ndarray, stats: dict[str, np.ndarray], timings=None):
    """h^k of D_0 (rows in frontier order): layer l over rows [0, |D_(k-l)|) and the in-edges of
    D_(k-1-l), keeping rows [0, |D_(k-1-l)|) (every value it keeps is exact: all their in-edges
    and their sources' rows are present). `stats` are keyed by sparkgnn.stat_keys.stat_key."""
    import torch

    from sparkgnn.layers.base import propagate

    k = model.num_rounds
    weight = None if frontier.weight is None else torch.from_numpy(frontier.weight)
    src, dst = torch.from_numpy(frontier.src), torch.from_numpy(frontier.dst)
    all_stats = {name: torch.from_numpy(values) for name, values in stats.items()}
    with torch.no_grad():
        h = model.pre(torch.from_numpy(x))
        for l, conv in enumerate(model.conv_list()):
            started = time.perf_counter()
            rows, keep, edges = frontier.sizes[k - l], frontier.sizes[k - 1 - l], frontier.in_edges[k - 1 - l]
            h = propagate(
                conv,
                h[:rows],
                src[:edges],
                dst[:edges],
                None if weight is None else weight[:edges],
                stats={name: values[:rows] for name, values in conv_stats(conv, all_stats).items()},
                pre_transform=model.choose_pre_transform(conv),
            )[:keep]
            h = model.post(l, h)
            if timings is not None:
                timings.append((f"layer {l}", time.perf_counter() - started))
    return h


def _output_frame(spark, model, ids: np.ndarray, h):
    import pyarrow as pa

    with_pred = model.output == "logits"
    values = h.contiguous().numpy().astype(np.float32, copy=False)
    columns = {
        "id": pa.array(ids, pa.int64()),
        "h": pa.ListArray.from_arrays(
            pa.array(np.arange(0, values.size + 1, values.shape[1], dtype=np.int32)), pa.array(values.reshape(-1))
        ),
    }
    if with_pred:
        columns["pred"] = pa.array(h.argmax(dim=-1).numpy().astype(np.int64), pa.int64())
    schema = OUTPUT_PRED_SCHEMA_DDL if with_pred else OUTPUT_SCHEMA_DDL
    return spark.createDataFrame(pa.table(columns)).selectExpr(*_ddl_columns(schema))


def _ddl_columns(ddl: str) -> list[str]:
    return [
        f"cast({name} as {kind}) as {name}" for name, kind in (part.strip().split(" ", 1) for part in ddl.split(","))
    ]


def _write(spark, frame, out: str | None):
    """`out` written (staged) and read back; without `out`, the frame itself: its rows came from
    the driver's Arrow table and are already held by Spark, so a checkpoint would only copy them."""
    if not out:
        return frame
    write_parquet_staged(frame, out)
    return read_parquet(spark, out)


RUNS: Registry = Registry("pruning mode", SparkGNNError)


@RUNS.register(LOCAL)
def run_local(ctx: PruningContext, out: str | None, **_):
    """The driver's run (module doc): features and statistics in, the layers, the output out."""
    from sparkgnn.planner import pruning

    frontier = ctx.local_frontier()
    started = time.perf_counter()
    x = _features(ctx)
    stats = stats_of(ctx.spark, ctx.graph.edges, frontier.order, stat_keys(ctx.model.conv_list()))
    ctx.timings.append(("gather", time.perf_counter() - started))
    h = run_layers(ctx.model, frontier, x, stats, ctx.timings)
    started = time.perf_counter()
    count = frontier.sizes[0]
    result = _write(ctx.spark, _output_frame(ctx.spark, ctx.model, frontier.order[:count], h), out)
    ctx.timings.append(("output", time.perf_counter() - started))
    report = RunReport(final_layer=ctx.model.num_rounds - 1, exchange="local")
    layer_of = {f"layer {l}": l for l in range(ctx.model.num_rounds)}
    for label, seconds in ctx.timings:
        layer = layer_of.get(label, ctx.model.num_rounds - 1 if label == "output" else -1)
        report.steps.append(StepReport(f"pruned {label}", seconds, None, layer=layer, estimated=label in layer_of))
        log.info(f"sparkgnn: pruned {label}: {seconds:.2f} s")
    report.labels = [step.label for step in report.steps]
    plan = pruning.local_plan(ctx.choice, ctx.inputs)
    return result, report, plan


SUBGRAPH_KEY = "sparkgnn pruned subgraph v1"  # changes with how run_subgraph selects its rows


def subgraph_fingerprint(parent: str, ids: np.ndarray, hops: int) -> str:
    """The fingerprint of the pruned subgraph of the graph fingerprinted `parent` around `ids` at
    `hops` hops: a hash of what determines its content (the parent's content, the set of ids, the
    hops, the selection's version), so its prepared layout is keyed and reused like a graph's
    without a pass over it. It is not the content hash Graph.fingerprint would compute for the
    same rows: a cache keyed by one never serves the other."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{SUBGRAPH_KEY}:{parent}:{int(hops)}:".encode())
    digest.update(npsets.unique(np.asarray(ids, dtype=np.int64)).astype("<i8").tobytes())
    return digest.hexdigest()


def _subgraph_rows(ctx: PruningContext, hops: int):
    """(vertices, edges, |D_hops|, |in-edges of D_(hops-1)|, the frontier to unpersist or None):
    the pruned subgraph's frames, from the collected sets when the frontier fitted the driver (no
    Spark pass to find and count them), else from Spark's (PruningContext.sets)."""
    collected = ctx.collected
    if collected is not None and collected.hops >= hops:
        rims = collected.order[: collected.sizes[hops]], collected.order[: collected.sizes[hops - 1]]
        vertices = khop.semi_join_ids(ctx.spark, ctx.graph.vertices, rims[0], on="id")
        edges = khop.semi_join_ids(ctx.spark, ctx.graph.edges, rims[1], on="dst")
        return vertices, edges, int(collected.sizes[hops]), int(collected.in_edges[hops - 1]), None
    frontier = ctx.sets(hops)
    vertices = khop.semi_join(
        ctx.graph.vertices.withColumnRenamed("id", "dst"), frontier.sets[hops], frontier.sizes[hops]
    ).withColumnRenamed("dst", "id")
    edges = khop.semi_join(ctx.graph.edges, frontier.sets[hops - 1], frontier.sizes[hops - 1])
    return vertices, edges, int(frontier.sizes[hops]), int(frontier.in_edges[hops - 1]), frontier


def _write_row_files(ctx: PruningContext, hops: int, work_dir: str | None):
    """The collected subgraph's rows as local Parquet files under `work_dir` (a fresh folder of
    its own), and their engine.prepare_tasks.RowFiles: prepare's tasks read them (two Spark jobs)
    where the SQL prepare of the subgraph's DataFrames would run a score of them. None where the
    tasks could not read them or would not be used: no collected frontier of `hops` hops, a work
    dir not on a local disk, edge attributes (the collected rows carry none)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkgnn import files
    from sparkgnn.engine.prepare_tasks import IdMap, RowFiles
    from sparkgnn.graph.layout import EDGE_ATTR, EDGES_DIR, VERTICES_DIR

    collected = ctx.collected
    if collected is None or collected.hops < hops or not work_dir or not files.is_local(work_dir):
        return None, None
    if EDGE_ATTR in ctx.graph.edges.columns:
        return None, None
    fs, root = files.filesystem(files.join(work_dir, "pruned-rows", uuid.uuid4().hex))
    for name, table in (
        (EDGES_DIR, pa.table(collected.edge_rows(hops))),
        (VERTICES_DIR, pa.table({"id": collected.order[: collected.sizes[hops]]})),
    ):
        fs.create_dir(files.join(root, name), recursive=True)
        pq.write_table(table, files.join(root, name, "part-0.parquet"))
    return RowFiles(files.join(root, EDGES_DIR), ((files.join(root, VERTICES_DIR), IdMap()),)), root


@RUNS.register(SUBGRAPH)
def run_subgraph(ctx: PruningContext, out: str | None, infer=None, infer_kwargs=None, **_):
    """The engine over the pruned subgraph (module doc), its output filtered to the ids."""
    import shutil

    from sparkgnn.graph import Graph

    hops = ctx.model.num_rounds + (1 if _needs_stats(ctx.model) else 0)
    vertices, edges, num_vertices, num_edges, frontier = _subgraph_rows(ctx, hops)
    sub = Graph(vertices, edges, name=f"{ctx.graph.name}[{len(ctx.ids)} ids, {hops} hops]")
    parent = ctx.graph.known_fingerprint
    rows_dir = None
    if parent is not None:  # no pass over the subgraph to validate, fingerprint or count it
        sub.vouch_derived(
            subgraph_fingerprint(parent, ctx.ids, hops),
            {"num_vertices": num_vertices, "num_edges": num_edges, "feature_dim": int(ctx.graph.feature_dim)},
        )
        sub.row_files, rows_dir = _write_row_files(ctx, hops, (infer_kwargs or {}).get("work_dir"))
    log.info(f"sparkgnn: running the pruned subgraph {sub.name}: {num_vertices:,} vertices, {num_edges:,} edges")
    try:
        result, report, plan = infer(
            ctx.spark,
            sub,
            ctx.model,
            out=out,
            ids=ctx.ids_df,
            prune="off",
            validate=False,
            **(infer_kwargs or {}),
        )
    finally:
        if frontier is not None:
            frontier.unpersist()
        if rows_dir is not None:  # prepare has read them: its layout is what later runs reuse
            shutil.rmtree(rows_dir, ignore_errors=True)
    plan.pruning = ctx.choice.summary()
    return result, report, plan
