"""Once per (graph, partition count): vertex ownership, static edge layouts, node statistics and the
graph statistics the planner's cost model needs. All of it with Spark joins/aggregations.

Why once: edges and ownership do not change between layers or between runs of the same graph, so
the result is written under `<work_dir>/prep/<graph fingerprint>/P=<n>/` and reused (a marker file
is written last, so a crashed preparation is redone, never half-used).

Layouts (Parquet, partitioned by the owning partition `part`):
  vertices/     id, <statistics>               owner = part(id)                          always
  in_edges/     src, dst, w[, a]               owner = part(dst)   (replicate, edge_join) always
  out_targets/  id, pt   distinct (src, part(dst)) with part(dst) != part(src)  (replicate mirrors) always
  out_edges/    src, dst, w, pd                owner = part(src)   (combine)              on demand
  in_targets/   id, pt   distinct (dst, part(src)) with part(src) != part(dst)  (combine + attention) on demand
  out_stats/<key>/  id, v   one out-edge statistic's sums by source, owner = part(id) (its readers) on demand
  features/     the files exchange's feature scan, routed to the owners, kept by the first job
                that scanned them for this P (engine.exchange.keep_features; not written here)

`a` (array<float>) is the edge's attribute vector, only for a graph whose edges carry `edge_attr`
(its fingerprint, hence its prepared folder, differs from the same graph's without them): the
layers that read edge attributes run under replicate and edge_join, which read in_edges.

Why two sets: a job writes the layouts its plan reads, not every strategy's. The base set and the
statistics the planner needs to cost every strategy (combine's partial count included, counted
without writing its layouts) come first; the combine layouts are written (once, under their own
marker) only when a plan picks combine for some layer (ensure_layouts): most plans never read them,
and they are a sizeable share of a prepare.

The vertices carry every statistic of engine.degrees.PREPARED_STATS (GCN's degree and the weighted
in-degree, each with and without the edge weights, keyed by sparkgnn.stat_keys): one aggregation
by destination computes them all, and a run reads only the keys its convs ask for. The
statistics over a vertex's OUT-edges (engine.degrees.OUT_STATS, ChebConv's Laplacian degree) are
another aggregation over every edge, by source, that few models read: like the combine layouts
they are written on demand (ensure_out_stats), one piece per statistic key under
`out_stats/<key>/` with its own marker `out_stats/<key>.json`, from the prepared in_edges (Spark
SQL, or the prepare tasks where those wrote the base layouts), and merged into the owned vertices'
statistics where a step reads them (engine.static.stat_columns). A prepare never computes them,
and a run that does not read them never does either. The marker records LAYOUT_VERSION; a layout
of another version (other columns) is prepared again, never reused.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass

from sparkgnn import files
from sparkgnn.engine.degrees import PREPARED_STATS, is_out_stat, stat_sql
from sparkgnn.engine.routing import partition_expr
from sparkgnn.engine.spark_compat import set_job_description
from sparkgnn.engine.static import EDGE_ATTR_COLUMN, OUT_STATS_DIR

log = logging.getLogger(__name__)

MARKER = "prepared.json"
#: The version of the base layouts' content, recorded in the marker: raised whenever a layout's
#: columns or their meaning change, so a work dir's older layout is prepared again.
LAYOUT_VERSION = 2
# Layouts written on demand, with the marker that says they are complete.
ON_DEMAND_MARKER = "combine.json"

# Explicit schemas: a layout can be empty (one partition has no cross-partition edges), and Spark
# cannot infer the schema of an empty Parquet directory.
SCHEMAS = {
    "vertices": "id long, " + "".join(f"{key} float, " for key in PREPARED_STATS) + "part int",
    "in_edges": "src long, dst long, w float, part int",
    "out_edges": "src long, dst long, w float, pd int, part int",
    "out_targets": "id long, pt int, part int",
    "in_targets": "id long, pt int, part int",
}


def read_layout(spark, path: str, name: str, edge_attr: bool = False):
    """A layout with its explicit schema; `edge_attr`: in_edges with its attribute column `a`."""
    schema = SCHEMAS[name] + (f", {EDGE_ATTR_COLUMN} array<float>" if edge_attr and name == "in_edges" else "")
    return spark.read.schema(schema).parquet(os.path.join(path, name))


@dataclass
class PreparedGraph:
    path: str
    partitions: int
    stats: dict
    seconds: float = 0.0  # spent preparing in this job (0 when an earlier job's layout was reused)
    reused: bool = False  # the layout came from <work_dir>/prep (same graph fingerprint and P)

    @property
    def edge_attr_dim(self) -> int:
        """Width of the edge attributes in_edges carries (column `a`; 0: none)."""
        return int(self.stats.get("edge_attr_dim", 0))

    def edges_by_dst(self, spark):
        """Edge rows for the edge_join strategy: (src, dst, w, pd[, a])."""
        edges = read_layout(spark, self.path, "in_edges", edge_attr=bool(self.edge_attr_dim))
        return edges.withColumnRenamed("part", "pd")


def _edges_with_parts(graph, partitions: int):
    weight = "cast(weight as float)" if "weight" in graph.edges.columns else "cast(1.0 as float)"
    attr = [f"cast(edge_attr as array<float>) as {EDGE_ATTR_COLUMN}"] if _edge_attr_dim(graph) else []
    return graph.edges.selectExpr(
        "cast(src as long) as src",
        "cast(dst as long) as dst",
        f"{weight} as w",
        f"cast({partition_expr('src', partitions)} as int) as ps",
        f"cast({partition_expr('dst', partitions)} as int) as pd",
        *attr,
    )


def _edge_attr_dim(graph) -> int:
    """The graph's edge attribute width (0: none, or a graph object that has no such notion)."""
    return int(getattr(graph, "edge_attr_dim", 0) or 0)


def _vertices_with_degree(graph, edges, partitions: int):
    """Every vertex with its statistics (engine.degrees.PREPARED_STATS, stat_sql): one aggregation
    over the edges and one join (each one more would be another pass over the edges)."""
    # views of this call's own names: relation layouts of a typed round are prepared from several
    # driver threads at once (engine.typed_prepare), and a shared name could be replaced in between
    tag = uuid.uuid4().hex
    edges_view, vertices_view = f"_sg_edges_{tag}", f"_sg_vertices_{tag}"
    edges.createOrReplaceTempView(edges_view)
    graph.vertices.selectExpr("cast(id as long) as id").createOrReplaceTempView(vertices_view)
    spark = graph.vertices.sparkSession
    sql = {key: stat_sql(key) for key in PREPARED_STATS}
    columns = "".join(f",\n cast(coalesce(n.{key}, {empty}) as float) as {key}" for key, (_, empty) in sql.items())
    aggregates = ", ".join(f"{expr} as {key}" for key, (expr, _) in sql.items())
    # the views are kept: a Spark Connect frame is analysed again, from the names, when it runs
    return spark.sql(
        f"""
        select v.id, cast({partition_expr("v.id", partitions)} as int) as part{columns}
        from {vertices_view} v
        left join (select dst, {aggregates} from {edges_view} group by dst) n on n.dst = v.id
        """
    )


def out_stat_frame(edges, key: str, partitions: int):
    """One out-edge statistic (engine.degrees.is_out_stat) over `edges` (src, dst, w): (id, v
    double, part) with one row per source that has out-edges, owned by part(id); a vertex without
    a row has the statistic's empty value (engine.static.stat_columns fills it in)."""
    from pyspark.sql import functions

    expr, _ = stat_sql(key)
    return (
        edges.groupBy("src")
        .agg(functions.expr(f"cast({expr} as double)").alias("v"))
        .selectExpr("src as id", "v", f"cast({partition_expr('src', partitions)} as int) as part")
    )


def _write(df, path: str, partitions: int, part_column: str) -> None:
    df.repartition(partitions, part_column).write.mode("overwrite").partitionBy(part_column).parquet(path)


def _base_layouts(edges, vertices) -> dict:
    return {
        "vertices": vertices,
        "in_edges": edges.selectExpr(
            "src", "dst", "w", *([EDGE_ATTR_COLUMN] if EDGE_ATTR_COLUMN in edges.columns else []), "pd as part"
        ),
        "out_targets": edges.where("ps != pd").selectExpr("src as id", "pd as pt", "ps as part").distinct(),
    }


def _on_demand_layouts(edges) -> dict:
    return {
        "out_edges": edges.selectExpr("src", "dst", "w", "pd", "ps as part"),
        "in_targets": edges.where("ps != pd").selectExpr("dst as id", "ps as pt", "pd as part").distinct(),
    }


# Which strategies read the on-demand layouts (engine.steps: partials and destination payloads).
ON_DEMAND_FOR = frozenset({"combine"})


def _write_marker(path: str, content: dict) -> None:
    """One atomic object (files.write_json_atomic), written after everything it vouches for."""
    files.write_json_atomic(path, content)


def _write_with_spark(spark, graph, partitions: int, path: str) -> dict:
    """The base layouts and statistics with Spark SQL (any graph, any filesystem, any cluster)."""
    edges = _edges_with_parts(graph, partitions).cache()
    for name, df in _base_layouts(edges, _vertices_with_degree(graph, edges, partitions)).items():
        _write(df, os.path.join(path, name), partitions, "part")
    stats = _graph_stats(spark, path, edges, partitions)
    edges.unpersist()
    return stats


def _write_in_tasks(spark, graph, partitions: int, path: str) -> dict:
    from sparkgnn.engine.prepare_tasks import prepare_in_tasks

    return prepare_in_tasks(spark, graph, partitions, path)


# How the base layouts get written (engine.prepare_tasks says why there are two).
LAYOUT_WRITERS = {"spark": _write_with_spark, "tasks": _write_in_tasks}


def layout_writer(graph, exchange: str, *, shared_disk: bool = False) -> str:
    """The Python tasks write the layouts where every executor shares the work dir's disk (they
    exchange rows through files, or `shared_disk`: engine.exchange.files_reach_every_task) and the
    graph's rows are local files (a directory on it); Spark SQL elsewhere. WHY also under the
    shuffle exchange (edge_join, pushdown, --exchange shuffle): the layouts are equal, and the
    tasks write them in two Spark jobs where the SQL prepare runs a score of them, each a fixed
    cost a small graph pays in full.
    A graph derived from another's carries the local folders of its rows (prepare_tasks.row_files:
    a typed relation's, a pruned subgraph's collected rows, engine.pruned): its layout comes from
    the tasks too."""
    from sparkgnn.engine.prepare_tasks import row_files

    return "tasks" if (exchange == "files" or shared_disk) and row_files(graph) is not None else "spark"


def _prepared_path(work_dir: str, fingerprint: str, partitions: int) -> str:
    return files.join(work_dir, "prep", str(fingerprint), f"P={partitions}")


def is_prepared(graph, partitions: int, work_dir: str) -> bool:
    """Whether an earlier job prepared this graph for `partitions` under `work_dir` (False when the
    graph's fingerprint is not known yet: finding out would cost a pass over the graph)."""
    fingerprint = graph.known_fingerprint
    return fingerprint is not None and _current(files.join(_prepared_path(work_dir, fingerprint, partitions), MARKER))


def _current(marker: str) -> bool:
    """Whether a marker exists and vouches for a layout of this LAYOUT_VERSION."""
    try:
        return files.read_json(marker).get("layout") == LAYOUT_VERSION
    except (OSError, ValueError, AttributeError):
        return False


def scans_in_tasks(graph, writer: str) -> bool:
    """Whether prepare's tasks validate and fingerprint `graph` as they read it (graph.scan_facts):
    an unvouched directory (Graph.unvouched) without edge attributes, prepared by the tasks."""
    return writer == "tasks" and bool(getattr(graph, "unvouched", False)) and "edge_attr" not in graph.edges.columns


def prepare(spark, graph, partitions: int, work_dir: str, writer: str = "spark") -> PreparedGraph:
    """The base layouts and statistics of `graph` for `partitions` under `work_dir`, reused when an
    earlier job prepared the same fingerprint and P. For an unvouched directory the tasks writer
    also validates and fingerprints it in the same passes (_prepare_scanning)."""
    if scans_in_tasks(graph, writer):
        return _prepare_scanning(spark, graph, partitions, work_dir)
    fingerprint = graph.fingerprint
    path = _prepared_path(work_dir, fingerprint, partitions)
    marker = files.join(path, MARKER)
    if _current(marker):
        started = time.perf_counter()
        stats = files.read_json(marker)["stats"]
        log.info(f"sparkgnn: reusing the graph layout prepared for {partitions} partitions ({path})")
        return PreparedGraph(path, partitions, stats, time.perf_counter() - started, reused=True)
    started = time.perf_counter()
    set_job_description(spark, f"sparkgnn prepare: partition graph into {partitions}")
    stats = LAYOUT_WRITERS[writer](spark, graph, partitions, path)
    if _edge_attr_dim(graph):
        stats["edge_attr_dim"] = _edge_attr_dim(graph)
    return _finished(marker, path, fingerprint, partitions, stats, started, f"prepared graph {fingerprint}")


def prepare_many(spark, items, work_dir: str) -> int:
    """The base layouts of several graphs (`items`: (graph, partitions) pairs) written by the
    tasks in two Spark jobs for all of them (prepare_tasks.prepare_many_in_tasks), each marked
    complete as `prepare` marks one, so the jobs of those graphs reuse them. Only graphs whose
    fingerprint is known, whose rows the tasks read (prepare_tasks.row_files; no edge attributes)
    and that `work_dir` does not hold prepared already; returns how many it prepared."""
    from sparkgnn.engine.prepare_tasks import prepare_many_in_tasks, row_files

    todo, seen = [], set()
    for graph, partitions in items:
        fingerprint = graph.known_fingerprint
        if (
            fingerprint is None
            or row_files(graph) is None
            or _edge_attr_dim(graph)
            or (fingerprint, partitions) in seen
        ):
            continue
        path = _prepared_path(work_dir, fingerprint, partitions)
        if not _current(files.join(path, MARKER)):
            seen.add((fingerprint, partitions))
            todo.append((graph, partitions, path))
    if not todo:
        return 0
    started = time.perf_counter()
    set_job_description(spark, f"sparkgnn prepare: partition {len(todo)} graphs in one pass")
    all_stats = prepare_many_in_tasks(spark, todo)
    for (graph, partitions, path), stats in zip(todo, all_stats, strict=True):
        what = f"prepared graph {graph.known_fingerprint} ({graph.name}, one of {len(todo)} in one pass)"
        _finished(files.join(path, MARKER), path, graph.known_fingerprint, partitions, stats, started, what)
    return len(todo)


def _prepare_scanning(spark, graph, partitions: int, work_dir: str) -> PreparedGraph:
    """prepare for an unvouched directory (scans_in_tasks). Its fingerprint, the layout's key, is
    known only once the tasks have read every row, so they write into a hidden folder of this
    attempt (`prep/.scan-<token>/`), which is renamed to `prep/<fingerprint>/P=<n>` once the scan
    vouches for the graph (or dropped when an earlier job prepared that fingerprint already). A
    defect stops the tasks after the pass that counts it; the folder is removed and
    Graph.validate words the refusal, the same line a validation on its own gives."""
    from sparkgnn.engine.prepare_tasks import prepare_and_scan_in_tasks
    from sparkgnn.graph.scan_facts import ScanFoundDefects

    started = time.perf_counter()
    staging = files.join(work_dir, "prep", f".scan-{uuid.uuid4().hex[:12]}")
    set_job_description(spark, f"sparkgnn prepare: validate, fingerprint and partition graph into {partitions}")
    try:
        stats, totals = prepare_and_scan_in_tasks(spark, graph, partitions, files.join(staging, f"P={partitions}"))
    except ScanFoundDefects:
        files.delete(staging)
        graph.validate(force=True)  # raises with the defects' counts and first offenders
        log.warning("sparkgnn: prepare's tasks counted a defect that validation does not find; preparing again")
        return prepare(spark, graph, partitions, work_dir, writer="tasks")
    except BaseException:
        files.delete(staging)
        raise
    graph.adopt_scanned(totals.facts(), totals.fingerprint())
    graph.remember_facts(work_dir)  # the next job on these files reads neither again (graph.facts_cache)
    fingerprint = graph.fingerprint
    path = _prepared_path(work_dir, fingerprint, partitions)
    marker = files.join(path, MARKER)
    if _current(marker):  # the same content prepared before (another path, or files touched since)
        files.delete(staging)
        log.info(f"sparkgnn: reusing the graph layout prepared for {partitions} partitions ({path})")
        return PreparedGraph(path, partitions, files.read_json(marker)["stats"], time.perf_counter() - started, True)
    files.delete(path)  # an interrupted attempt's files, without a marker
    files.makedirs(files.parent(path))
    fs, inner = files.filesystem(path)
    fs.move(files.filesystem(files.join(staging, f"P={partitions}"))[1], inner)
    files.delete(staging)
    what = f"validated, fingerprinted ({fingerprint}) and prepared graph {graph.path}"
    return _finished(marker, path, fingerprint, partitions, stats, started, what)


def _finished(marker: str, path: str, fingerprint: str, partitions: int, stats: dict, started: float, what: str):
    """Write the layout's marker (it is complete from then on) and log `what` was done; the
    PreparedGraph of it."""
    _write_marker(
        marker, {"fingerprint": fingerprint, "partitions": partitions, "layout": LAYOUT_VERSION, "stats": stats}
    )
    seconds = time.perf_counter() - started
    log.info(
        f"sparkgnn: {what} for {partitions} partitions in {seconds:.1f} s "
        f"(R_f = {1 + stats['mirror_rows'] / max(stats['num_vertices'], 1):.2f})"
    )
    return PreparedGraph(path=path, partitions=partitions, stats=stats, seconds=seconds)


def ensure_layouts(spark, graph, prepared: PreparedGraph, strategies, writer: str = "spark") -> PreparedGraph:
    """Write the on-demand layouts when one of `strategies` reads them and an earlier job has not,
    with Spark SQL or, for `writer` "tasks" (layout_writer), from the prepared in_edges slices in
    one job (prepare_tasks.combine_layouts_in_tasks); the time is added to prepared.seconds (a
    reused layout stays reused only if nothing was written)."""
    if writer not in LAYOUT_WRITERS:
        raise ValueError(f"unknown layout writer {writer!r}; known: {', '.join(LAYOUT_WRITERS)}")
    marker = files.join(prepared.path, ON_DEMAND_MARKER)
    if not ON_DEMAND_FOR.intersection(strategies) or files.exists(marker):
        return prepared
    started = time.perf_counter()
    set_job_description(spark, f"sparkgnn prepare: combine layouts for {prepared.partitions}")
    if writer == "tasks":
        from sparkgnn.engine.prepare_tasks import combine_layouts_in_tasks

        combine_layouts_in_tasks(spark, prepared.path, prepared.partitions)
    else:
        edges = _edges_with_parts(graph, prepared.partitions)
        for name, df in _on_demand_layouts(edges).items():
            _write(df, os.path.join(prepared.path, name), prepared.partitions, "part")
    _write_marker(marker, {"layouts": ["in_targets", "out_edges"]})
    seconds = time.perf_counter() - started
    log.info(f"sparkgnn: wrote the combine layouts (out_edges, in_targets) in {seconds:.1f} s")
    return PreparedGraph(prepared.path, prepared.partitions, prepared.stats, prepared.seconds + seconds, reused=False)


def out_stat_marker(path: str, key: str) -> str:
    """The marker vouching for statistic `key`'s piece of the layout prepared under `path`."""
    return files.join(path, OUT_STATS_DIR, f"{key}.json")


def _write_out_stat_with_spark(spark, prepared: PreparedGraph, key: str) -> None:
    in_edges = read_layout(spark, prepared.path, "in_edges").select("src", "dst", "w")
    sums = out_stat_frame(in_edges, key, prepared.partitions)
    _write(sums, files.join(prepared.path, OUT_STATS_DIR, key), prepared.partitions, "part")


def _write_out_stat_in_tasks(spark, prepared: PreparedGraph, key: str) -> None:
    from sparkgnn.engine.prepare_tasks import out_stat_in_tasks

    out_stat_in_tasks(spark, prepared.path, prepared.partitions, key)


# How an out-edge statistic's piece gets written, by the writer of the base layouts (LAYOUT_WRITERS).
OUT_STAT_WRITERS = {"spark": _write_out_stat_with_spark, "tasks": _write_out_stat_in_tasks}


def ensure_out_stats(spark, prepared: PreparedGraph, keys, writer: str = "spark") -> PreparedGraph:
    """Write the piece of each out-edge statistic among `keys` (engine.degrees.is_out_stat; the
    in-edge ones are in the base layout) that an earlier run has not, from the prepared in_edges;
    the time is added to prepared.seconds (a reused layout stays reused only if nothing was
    written). `writer` is the base layouts' ("spark" or "tasks", LAYOUT_WRITERS)."""
    if writer not in OUT_STAT_WRITERS:
        raise ValueError(f"unknown layout writer {writer!r}; known: {', '.join(sorted(OUT_STAT_WRITERS))}")
    missing = sorted(key for key in set(keys) if is_out_stat(key) and not _current(out_stat_marker(prepared.path, key)))
    if not missing:
        return prepared
    started = time.perf_counter()
    for key in missing:
        set_job_description(spark, f"sparkgnn prepare: out-edge statistic {key} for {prepared.partitions}")
        OUT_STAT_WRITERS[writer](spark, prepared, key)
        _write_marker(out_stat_marker(prepared.path, key), {"statistic": key, "layout": LAYOUT_VERSION})
    seconds = time.perf_counter() - started
    log.info(f"sparkgnn: computed the out-edge statistics {', '.join(missing)} in {seconds:.1f} s")
    return PreparedGraph(prepared.path, prepared.partitions, prepared.stats, prepared.seconds + seconds, reused=False)


def _graph_stats(spark, path: str, edges, partitions: int) -> dict:
    """What the planner costs strategies with. The combine strategy's partial rows (distinct
    (source partition, destination) over cross-partition edges) are also its in_targets rows, so one
    count serves both, whether or not those layouts are ever written."""
    per_part = edges.groupBy("pd").count().collect()
    cross_partials = int(edges.where("ps != pd").select("ps", "dst").distinct().count())
    return {
        "num_vertices": int(read_layout(spark, path, "vertices").count()),
        "num_edges": int(sum(r[1] for r in per_part)),
        "partitions": partitions,
        "mirror_rows": int(read_layout(spark, path, "out_targets").count()),
        "in_mirror_rows": cross_partials,
        "combine_rows": cross_partials,
        "max_partition_edges": int(max((r[1] for r in per_part), default=0)),
    }
