"""`sparkgnn.refresh`: incremental PE refresh on Spark, for graphs and stores that do not fit one
machine (pe/refresh.py is the single-machine path; both commit the same store versions).

The graph is split into P pieces by destination (partition.py says what a piece holds and why it
is enough). The driver routes nothing but statistics (Spark joins, for models that read them)
and holds nothing of the graph's size: the update's deleted vertex ids and per-partition
summaries are all it collects. Every round-0
task reads the whole update and every layer-l task layer l-1's recomputed rows: O(P x change).

    round 0   the old graph's pieces come from the pieces cache (pieces.py; built by Spark the
              first time a graph is refreshed). One task per piece reads the update whole and
              keeps the rows its piece concerns (routing.route_update: edge rows by
              destination, vertex rows to the owner and every holder), applies it (validating
              it: a rejected update raises GraphUpdateError naming every problem, nothing
              written), writes its owned vertices' statistics, its share of the updated graph
              and the updated graph's piece (kept for the next refresh). A foreign vertex's
              features are not shipped: a task reads the few it needs from the owner's
              features file (routing.owner_rows). Spark joins the statistics of foreign
              vertices to the pieces holding them (models that read statistics). The updated
              graph is fingerprinted from the tasks' partial sums (and written to --out-graph).
    layer l   one round of tasks plans and computes, each reading layer l-1's recomputed rows
              whole from the files the previous round wrote (partition.previous_rows) and,
              when every segment of the old store has a row file (pe/rowfile.py), the stored
              states of layer l and h^(l-1) before the update from the row files (the rows
              asked for, nothing else); else, as for a store Spark wrote: plan tasks write which
              values they read and Spark joins those ids with the stored layers (fetch);
              commit: the tasks' rows (recomputed rows, a tombstone per deleted vertex) moved
              into the store as a delta over the old version's layer (no Spark job; copied
              where the store lies on another filesystem than the work dir), or merged
              whole by Spark when versions.should_compact says so.

Run directory (<work dir>/refresh/<uuid>/, on a filesystem every executor reaches; deleted at
the end): run.json; in/extra_local/; stats/ foreign_stats/ (out_partials/ out_stats/
for a model reading an out-edge statistic);
next/ (the updated graph's pieces: its data, then adopted into the cache);
layer=<l>/{needs,values,out}/ (needs/ and values/ only when fetched). A crash leaves
the old version readable and the new one with its committed layers; a rerun recomputes in a
fresh run directory (cheap: the change only) and commits only the layers still missing, giving
the same store.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from sparkgnn import files
from sparkgnn.engine.refresh import partition, pieces, routing
from sparkgnn.engine.refresh.partition import (
    NEW_H,
    OLD_H,
    STATE,
    SUMMARY_SCHEMA,
)
from sparkgnn.engine.refresh.rundir import RunContext, layer_dir
from sparkgnn.engine.result import StoreResult, legacy_positional
from sparkgnn.engine.spark_compat import default_parallelism
from sparkgnn.errors import GraphUpdateError
from sparkgnn.graph.updates import KINDS
from sparkgnn.layers.generic import require_states
from sparkgnn.parquet_read import read_parquet
from sparkgnn.pe import versions
from sparkgnn.pe.refresh import RefreshError, RefreshReport, carried_metrics
from sparkgnn.pe.writer import layer_key

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sparkgnn.engine.api import GraphSource, ModelSource

log = logging.getLogger(__name__)

# A whole-layer commit broadcasts the replaced ids up to this many (8 bytes each), else shuffles.
BROADCAST_IDS = 1 << 22


def _uri(path: str) -> str:
    return files.spark_uri(path)


def check_update(path: str) -> str:
    """`path` as every task must see it (files.absolute), refused (GraphUpdateError) where it does
    not exist, holds no data file, or its first data file is not Parquet or has no `kind` column.
    The round-0 tasks read it whole (routing.route_update); a column it lacks is null there,
    and the tasks' validation names the kinds that need it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not files.exists(path):
        raise GraphUpdateError(f"graph update {path} does not exist")
    path = files.absolute(path)
    found = [path] if files.kind(path) == "file" else [files.join(path, f.rel) for f in files.data_files(path)]
    if not found:
        raise GraphUpdateError(f"graph update {path} holds no data files")
    fs, inner = files.filesystem(found[0])
    try:
        with fs.open_input_file(inner) as source:
            names = pq.ParquetFile(source).schema_arrow.names
    except pa.ArrowInvalid:
        raise GraphUpdateError(f"graph update {found[0]} is not a Parquet file") from None
    if "kind" not in names:
        raise GraphUpdateError(f"graph update {path}: no `kind` column (columns: {', '.join(names)})")
    return path


def _tasks(spark, partitions: int, fn, what: str) -> list[dict]:
    """One task per partition running `fn` (a partition.*_task); their summaries by part."""
    started = time.perf_counter()
    rows = spark.range(0, partitions, 1, partitions).mapInArrow(fn, SUMMARY_SCHEMA).collect()
    log.info(f"sparkgnn refresh: {what}: {partitions} tasks in {time.perf_counter() - started:.1f} s")
    return [json.loads(r.info) for r in sorted(rows, key=lambda r: r.part)]


def _read_parts(spark, folder: str):
    """A folder the tasks wrote as part=<p>/ files, read with the schema of a file's footer plus
    `part` (no schema-inference job: parquet_read), or as Spark infers it where the driver cannot
    read the files."""
    from pyspark.sql.types import IntegerType

    from sparkgnn.parquet_read import footer_schema

    schema = None
    if files.is_local(folder):
        parts = sorted(name for name in files.entries(folder) if name.startswith("part="))
        schema = footer_schema([files.join(folder, parts[0])]) if parts else None
    reader = spark.read if schema is None else spark.read.schema(schema.add("part", IntegerType()))
    return reader.parquet(_uri(folder))


def _read_ids(spark, folder: str):
    """(id, part) rows of a folder written with partitionBy("part") (empty: no rows, no error)."""
    return spark.read.schema("id long, part int").parquet(_uri(folder))


def _local(spark, ctx: RunContext):
    """(id, part): every id each piece holds (the old graph's pieces plus the sources of the
    update's inserted edges)."""
    cached = _read_ids(spark, files.join(ctx.pieces_dir, "local"))
    return cached.unionByName(_read_ids(spark, files.join(ctx.run_dir, "in", "extra_local")))


def _foreign_stats(spark, ctx: RunContext) -> None:
    """Statistics of every piece's foreign vertices, from their owners (partition.py)."""
    from pyspark.sql import functions as F

    from sparkgnn.engine.routing import partition_expr

    foreign = _local(spark, ctx).where(F.col("part") != F.expr(partition_expr("id", ctx.partitions)))
    stats = read_parquet(spark, _uri(files.join(ctx.run_dir, "stats")))
    foreign.join(stats, "id").write.partitionBy("part").parquet(_uri(files.join(ctx.run_dir, "foreign_stats")))


def _out_stats(spark, ctx: RunContext) -> None:
    """Out-edge statistics (partition.py): the pieces' partial sums added up by id, the totals
    routed to every piece that holds the vertex."""
    from pyspark.sql import functions as F

    partials = read_parquet(spark, _uri(files.join(ctx.run_dir, "out_partials")))
    names = [f"{k}_{side}" for k in partition.out_stat_keys(ctx.stat_keys) for side in ("old", "new")]
    totals = partials.groupBy("id").agg(*(F.sum(n).cast("float").alias(n) for n in names))
    (
        partials.select("id", "part")
        .join(totals, "id")
        .write.partitionBy("part")
        .parquet(_uri(files.join(ctx.run_dir, "out_stats")))
    )


def _new_graph(spark, run_dir: str, old, built: list[dict], out_graph: str | None):
    """The updated graph the pieces wrote, fingerprinted from the pieces' partial hash sums (no
    Spark pass: the pieces came out of a validated apply on a validated graph), and written to
    `out_graph` if given."""
    from sparkgnn.graph import Graph
    from sparkgnn.graph.fingerprint import FingerprintAccumulator

    acc = FingerprintAccumulator(old.feature_dim, old.has_weight, old.edge_attr_dim)
    for piece in built:
        acc.add_partial(piece["vertices"], int(piece["vertex_sum"]), piece["edges"], int(piece["edge_sum"]))
    meta = {
        "fingerprint": acc.hexdigest(),
        "validated": True,
        "num_vertices": _sum(built, "vertices"),
        "num_edges": _sum(built, "edges"),
        "feature_dim": old.feature_dim,
        "num_classes": old.stats()["num_classes"],
        **({"edge_attr_dim": old.edge_attr_dim} if old.edge_attr_dim else {}),
    }
    # the next pieces (partition.py) hold every vertex once as owned, and every edge once
    pieces_next = files.join(run_dir, "next")
    columns = ["id", "x", *(c for c in ("y", "split") if c in old.vertices.columns)]
    vertices = _read_parts(spark, files.join(pieces_next, "vertices")).where("owned").select(*columns)
    edges = _read_parts(spark, files.join(pieces_next, "edges")).drop("part")
    graph = Graph(vertices, edges, name=old.name, meta=meta)
    if out_graph is None:
        return graph
    graph.save(out_graph)
    log.info(f"sparkgnn refresh: updated graph written to {out_graph}")
    return Graph.load(spark, out_graph)


def _fetch_values(spark, ctx: RunContext, old_store, layer: int, previous: str | None) -> None:
    """The values the pieces' plans asked for (partition.NEW_H / OLD_H / STATE), each stored
    layer scanned once with the (small) needs broadcast; `previous`: the folder holding layer
    l-1's recomputed rows (tombstones, null h, left out)."""
    from pyspark.sql import functions as F

    needs = read_parquet(spark, _uri(layer_dir(ctx.run_dir, layer, "needs")))
    kind = F.col("kind")
    state = old_store.frame(spark, layer).select("id", F.col("state").alias("v"))
    parts = [state.join(F.broadcast(needs.where(kind == STATE)), "id")]
    if layer > 1:
        assert previous is not None, "layer > 1 reads the previous layer's rows"
        fresh = read_parquet(spark, _uri(previous)).where(F.col("h").isNotNull()).select("id", F.col("h").alias("v"))
        wanted_new = needs.where(kind == NEW_H)
        stored = wanted_new.join(fresh.select("id"), "id", "left_anti").unionByName(needs.where(kind == OLD_H))
        before = old_store.frame(spark, layer - 1).select("id", F.col("h").alias("v"))
        parts += [fresh.join(F.broadcast(wanted_new), "id"), before.join(F.broadcast(stored), "id")]
    merged = parts[0]
    for more in parts[1:]:
        merged = merged.unionByName(more)
    merged.select("id", "kind", "v", "part").write.partitionBy("part").parquet(
        _uri(layer_dir(ctx.run_dir, layer, "values"))
    )


def _commit(spark, writer, old_store, ctx: RunContext, layer: int, deleted: list, total: int, stats: dict) -> str:
    """Commit layer l from the rows its tasks wrote (recomputed rows and a tombstone per deleted
    vertex): as a delta over the old version's layer, their files moved into the staged attempt
    (no Spark job, no copy of the rows), or whole when versions.should_compact says so (Spark
    merges them with the old layer). Returns the folder the rows lie in afterwards."""
    from pyspark.sql import functions as F

    out_dir = layer_dir(ctx.run_dir, layer, "out")
    width, state_width = old_store.width(layer), old_store.state_width(layer)
    changed = stats["targets"] + len(deleted)
    if versions.should_compact(old_store.manifest, layer_key(layer), changed, total):
        out = read_parquet(spark, _uri(out_dir))
        gone = out.select("id")
        # few enough ids to broadcast: one scan of the old layer, no shuffle of it (nor AQE's jobs)
        kept = old_store.frame(spark, layer).join(
            F.broadcast(gone) if changed <= BROADCAST_IDS else gone, "id", "left_anti"
        )
        merged = kept.select("id", "h", "state").unionByName(out.where(F.col("h").isNotNull()))
        writer.commit_layer(layer, merged, width, state_width, rows=total)  # every vertex once: `total` rows
        stats["committed"] = f"whole ({total} rows)"
        return out_dir
    staged = writer.stage_layer(layer)
    _move_rows(out_dir, staged)
    writer.commit_staged_delta(layer, old_store, width, state_width, rows=total)
    stats["committed"] = f"as a delta ({stats['targets']} rows, {len(deleted)} tombstones)"
    return staged


def _move_rows(source: str, target: str) -> None:
    """Every data file of `source` into the folder `target`: renamed where both lie on one
    filesystem that renames (the work dir and the store on one disk), else copied (another disk,
    another filesystem, an object store)."""
    import pyarrow.fs as pafs

    for data in files.data_files(source):
        src_fs, src = files.filesystem(files.join(source, data.rel))
        dst_fs, dst = files.filesystem(files.join(target, data.rel))
        if type(src_fs) is type(dst_fs) and not files.is_object_store(target):
            try:
                src_fs.move(src, dst)
                continue
            except OSError:  # a rename across devices (EXDEV): copy instead
                pass
        files.makedirs(files.parent(files.join(target, data.rel)))
        pafs.copy_files(src, dst, source_filesystem=src_fs, destination_filesystem=dst_fs)


def _sum(summaries: list[dict], key: str) -> int:
    return int(sum(s.get(key, 0) for s in summaries))


def _kind_counts(built: list[dict]) -> dict:
    """The update's rows by kind, every kind in KINDS order (0 when absent) as GraphUpdate.counts
    gives them, from the round-0 tasks' counts (each row counted by one task: no Spark count)."""
    counts = dict.fromkeys(KINDS, 0)
    for summary in built:
        for kind, n in summary.get("kinds", {}).items():
            counts[kind] = counts.get(kind, 0) + int(n)
    return counts


def _store_rows(old_store) -> tuple:
    """RunContext.store_rows of `old_store`: every layer's segments, when each has a row file
    (pe/rowfile.py); () when one has none (a layer Spark wrote): the driver fetches values."""
    out = []
    for layer in old_store.layers:
        key = layer_key(layer)
        segments = versions.segments(old_store.base, old_store.manifest, key)
        if not all(segment.row_file for segment in segments):
            return ()
        out.append((layer, key, tuple(segments)))
    return tuple(out)


#: refresh's options in the previous release's positional order (legacy_positional maps them).
REFRESH_LEGACY_ORDER = ("store", "updates", "out_graph", "partitions", "work_dir", "log", "on_layer_committed")


def _result(store, report: RefreshReport, legacy: bool) -> StoreResult:
    """The StoreResult, or the previous release's (PEStore, RefreshReport) for its call form."""
    return (store, report) if legacy else StoreResult(store, report)  # type: ignore[return-value]


@legacy_positional(REFRESH_LEGACY_ORDER)
def refresh(
    spark: SparkSession,
    graph: GraphSource,
    model: ModelSource,
    *,
    store: str | os.PathLike[str],
    updates: str | os.PathLike[str],
    out_graph: str | None = None,
    partitions: int | None = None,
    work_dir: str | None = None,
    on_layer_committed: Callable[[int], None] | None = None,
    _legacy: bool = False,
) -> StoreResult:
    """Apply the graph update in `updates` (a Parquet folder, graph.updates format) to `graph` (a
    Graph or graph directory) and to the PE store at `store` computed for (graph, model), on Spark;
    commit the refreshed store as the updated graph's version under the same root. Returns a
    StoreResult (engine.result): `.store`, the PEStore opened against the updated graph, and
    `.report`, the RefreshReport. `out_graph`: write the updated graph there (a graph directory;
    serving needs it to open the new version). `on_layer_committed(layer)` is called after each
    layer commits. Options after `model` are keyword-only; the previous release's positional form
    still works with a DeprecationWarning and returns (PEStore, RefreshReport), as it did."""
    store, updates = os.fspath(store), os.fspath(updates)
    from sparkgnn.dl.model_store import register
    from sparkgnn.engine.api import coerce_graph, coerce_model, resolve_work_dir
    from sparkgnn.engine.session import configure
    from sparkgnn.pe import PEStore, PEWriter

    started = time.perf_counter()
    configure(spark)
    old_graph, model = coerce_graph(spark, graph), coerce_model(model)
    require_states(model, "a PE store refresh")
    model.check_edge_attr(old_graph.edge_attr_dim or None, where=f"graph {old_graph.name!r}")
    old_store = PEStore.open(store, model=model, graph=old_graph)
    if not old_store.with_states:
        raise RefreshError(
            f"PE store {old_store.base} was precomputed without aggregation states; a refresh needs them "
            "(rerun the precompute with states)"
        )
    updates = check_update(updates)
    partitions = int(partitions or max(1, default_parallelism(spark)))
    root = resolve_work_dir(spark, None, work_dir)
    run_dir = files.join(root, "refresh", uuid.uuid4().hex)
    ctx = RunContext(
        run_dir,
        pieces.pieces_dir(root, old_store.manifest["graph_fingerprint"], partitions),
        partitions,
        files.join(root, "models"),
        register(model, files.join(root, "models")),
        partition.stat_keys(model),
        _store_rows(old_store),
        update_path=updates,
        update_files=routing.file_marks(updates),
    )
    phases: dict = {}
    try:
        files.write_json_atomic(
            files.join(run_dir, "run.json"),
            {"feature_dim": old_graph.feature_dim, "weighted": old_graph.has_weight,
             "edge_attr_dim": old_graph.edge_attr_dim,
             "vertex_columns": [c for c in ("y", "split") if c in old_graph.vertices.columns]},
        )  # fmt: skip
        phases["build_pieces"] = 0.0  # 0: the graph's pieces were kept by the refresh that made it
        if not pieces.complete(ctx.pieces_dir):
            built_at = time.perf_counter()
            pieces.build(spark, old_graph, partitions, ctx.pieces_dir)
            phases["build_pieces"] = round(time.perf_counter() - built_at, 3)
            log.info(f"sparkgnn refresh: the graph's {partitions} pieces built in {phases['build_pieces']:.1f} s")
        built = _tasks(spark, partitions, functools.partial(partition.build_task, ctx), "apply the update")
        problems = sorted({s["problem"] for s in built if "problem" in s})
        if problems:
            raise GraphUpdateError("; ".join(problems))
        deleted = sorted({i for s in built for i in s.get("deleted", [])})
        if ctx.stat_keys:
            _foreign_stats(spark, ctx)
        if partition.out_stat_keys(ctx.stat_keys):
            _out_stats(spark, ctx)
        new_graph = _new_graph(spark, run_dir, old_graph, built, out_graph)
        report = RefreshReport(
            store="",
            graph_fingerprint=new_graph.fingerprint,
            previous_graph_fingerprint=old_store.manifest["graph_fingerprint"],
            updates=_kind_counts(built),
            phases=phases,
        )
        phases["apply"] = round(time.perf_counter() - started, 3)
        if report.graph_fingerprint == report.previous_graph_fingerprint:
            log.info(f"sparkgnn refresh: the update leaves the graph as it was; {old_store.base} stays current")
            return _result(old_store, report, _legacy)
        total = _sum(built, "vertices")
        writer = PEWriter(store, new_graph, model, with_states=True)
        done = set(writer.completed_layers())
        previous = None  # the folder holding layer l-1's recomputed rows: every layer-l task reads them
        for layer in range(1, model.num_rounds + 1):
            layer_started = time.perf_counter()
            planned = None
            if not ctx.store_rows:  # else the compute tasks read what they need from the row files
                planned = _tasks(spark, partitions, functools.partial(partition.plan_task, ctx, layer, previous),
                                 f"layer {layer} plan")  # fmt: skip
                _fetch_values(spark, ctx, old_store, layer, previous)
            computed = _tasks(spark, partitions, functools.partial(partition.compute_task, ctx, layer, previous),
                              f"layer {layer} compute")  # fmt: skip
            stats: dict = {"layer": layer, "needs": _sum(planned or computed, "needs")}
            stats["values"] = "fetched by Spark" if planned is not None else "read from row files"
            stats.update(
                {k: _sum(computed, k) for k in ("targets", "delta", "scratch", "new_messages", "old_messages")}
            )
            stats["seconds"] = round(time.perf_counter() - layer_started, 3)
            previous = layer_dir(run_dir, layer, "out")
            if layer not in done:
                written = time.perf_counter()
                previous = _commit(spark, writer, old_store, ctx, layer, deleted, total, stats)
                stats["write_seconds"] = round(time.perf_counter() - written, 3)
                if on_layer_committed is not None:
                    on_layer_committed(layer)
            report.layers.append(stats)
            log.info(
                f"sparkgnn refresh: layer {layer}/{model.num_rounds}: {stats['targets']} of {total} vertices "
                f"recomputed ({stats['delta']} by delta, {stats['scratch']} from scratch) in {stats['seconds']:.1f} s; "
                f"committed {stats.get('committed', 'earlier')}"
            )
        phases["layers"] = round(time.perf_counter() - started - phases["apply"], 3)
        chain = list((old_store.manifest.get("refresh") or {}).get("chain") or [report.previous_graph_fingerprint])
        report.seconds = round(time.perf_counter() - started, 3)
        writer.manifest["refresh"] = {**report.to_json(), "chain": [*chain, report.graph_fingerprint],
                                      "engine": "spark", "partitions": partitions}  # fmt: skip
        carried = carried_metrics(old_store)  # the old version's workload metrics, on the new graph
        if carried is not None and not writer.has_metrics():
            from sparkgnn.pe.metrics import one_pass_metrics

            writer.commit_metrics(one_pass_metrics(new_graph, *carried))
            phases["metrics"] = round(time.perf_counter() - started - phases["apply"] - phases["layers"], 3)
        writer.finish({"refresh_seconds": report.seconds})
        report.store = writer.base
        # after the last read of the updated graph's frames (they lie in next/ until adopted)
        pieces.adopt(files.join(run_dir, "next"), pieces.pieces_dir(root, new_graph.fingerprint, partitions))
        refreshed = PEStore.open(store, model=model, graph=new_graph)
        report.seconds = round(time.perf_counter() - started, 3)
        return _result(refreshed, report, _legacy)
    finally:
        files.delete(run_dir)
