"""Prepare's base layouts written by the Python tasks themselves, for graph directories every
executor reads as a local disk (the files exchange's setting, engine.exchange).

Why: the Spark SQL prepare (engine.prepare) spends most of a cold job's time before the first
layer (repartitioning and writing in_edges, caching the edges, joining two aggregations for the GCN
degrees, a distinct for out_targets; docs/ARCHITECTURE.md has the figures). The same layouts come
from two passes of numpy over the edge files, with ownership from the same hash
(routing.owner_partition, a port of Spark's pmod(hash(id), P)):

1. edges: reader task i of P reads the edge files' row groups i::P and writes, for every partition q, the edges
   whose destination q owns as `in_edges/part=q/part-<run>-r<i>.parquet`.
2. partitions: task q reads in_edges/part=q (every in-edge of its vertices, complete after pass 1)
   and the ids of the vertex files, and writes `vertices/part=q` (id, the statistics of
   engine.degrees.PREPARED_STATS), the out_targets rows it is the target of
   (`out_targets/part=<ps>/part-<run>-t<q>.parquet`: distinct (src, q) for sources owned
   elsewhere, so rows of different tasks never repeat), and reports the statistics of its partition
   (vertices, edges, mirror rows, combine's partial rows); it also derives and saves the slice's
   local indexes (engine.static) that every first layer loads.

Combine's on-demand layouts (engine.prepare.ensure_layouts) come from one more pass over the
in_edges slices (combine_layouts_in_tasks): task q writes its slice's edges as out_edges rows of
each source's owner and its in_targets rows.

Readers and partitions are P control rows in at most one Spark task per core (prepare_tasks), a
task serving its run of them one after another.

For a graph directory nothing vouches for yet (prepare_and_scan_in_tasks), the same two passes
also validate and fingerprint it (graph.scan_facts): pass 1's readers check and hash the rows they
read, pass 2's tasks count duplicate ids and dangling endpoints; the driver stops after the pass
whose totals show a defect.

An out-edge statistic (engine.degrees.OUT_STATS) is not part of these passes: a run that reads
one has it written on demand (engine.prepare.ensure_out_stats) by out_stat_in_tasks, one pass over
the in_edges slices: task q sums the statistic by source over its slice and writes the partial
sums of the sources each partition o owns as `out_stats/<key>/part=o/part-<run>-r<q>.parquet`
(id, v); the reader (engine.static.stat_columns) adds a source's partial sums up.

The layouts and statistics equal the Spark SQL prepare's (tests compare them); edge order inside
a slice differs, which nothing reads. Files are named by a token of this preparation so the
derived local indexes (engine.static) of an interrupted earlier attempt are never taken for
these. The Spark SQL path stays for graphs given as DataFrames, remote storage and clusters
whose executors do not share the work dir's disk (engine.prepare.layout_writer).
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkgnn import npsets
from sparkgnn.arrowvec import to_fixed_list, to_numpy_matrix
from sparkgnn.engine import static
from sparkgnn.engine.degrees import is_out_stat, out_stat_sums, prepared_stat_values
from sparkgnn.engine.exchange import check_reports, control_partitions, control_rows, summary_row
from sparkgnn.engine.phases import phase
from sparkgnn.engine.routing import FILES_SCHEMA_DDL, owner_partition
from sparkgnn.engine.spark_compat import default_parallelism
from sparkgnn.errors import SparkGNNError
from sparkgnn.files import data_files, dealt_batches, filesystem, is_local, join, parquet_batches
from sparkgnn.graph import scan_facts
from sparkgnn.graph.layout import EDGE_ATTR, EDGES_DIR, VERTICES_DIR
from sparkgnn.graph.scan_facts import ScanPartial, ScanTotals

READ_BATCH_ROWS = 1 << 20
STATS_SCHEMA_DDL = "pt int, rows long, bytes long, vertices long, edges long, mirror_rows long, partials long"
#: A mapped id (IdMap) must stay within +-MAPPED_ID_LIMIT of the stored one's range, as SQL's check.
MAPPED_ID_LIMIT = 1 << 62


class IdMap(NamedTuple):
    """How a graph's ids are formed from the ids stored in a folder: `scale * id + offset`
    (identity by default). A typed relation between two types maps source ids to 2*id and
    destination ids to 2*id+1 (engine.typed_relations), naming `node_type` when an id does not fit."""

    scale: int = 1
    offset: int = 0
    node_type: str = ""

    def apply(self, ids: np.ndarray) -> np.ndarray:
        """The mapped ids; SparkGNNError (naming the type) for an id beyond +-2^62 when scaling."""
        if self.scale == 1 and self.offset == 0:
            return ids
        if len(ids) and bool(((ids >= MAPPED_ID_LIMIT) | (ids <= -MAPPED_ID_LIMIT)).any()):
            raise SparkGNNError(
                f"node type {self.node_type}: id beyond +-2^62 cannot be mapped for a relation between two types"
            )
        return ids * self.scale + self.offset


@dataclass(frozen=True)
class RowFiles:
    """Where prepare's tasks read a graph's rows: one local folder of edge Parquet files (src,
    dst[, weight, edge_attr]) with the maps of its endpoints' ids, and the vertex folders whose
    `id` columns, each through its map, are the graph's vertex ids. A graph directory is one edge
    folder and one vertex folder, unmapped; a typed relation's graph (engine.typed_relations) is
    the relation's edge folder and its one or two node types' vertex folders, mapped."""

    edges: str
    vertices: tuple[tuple[str, IdMap], ...]
    src: IdMap = IdMap()
    dst: IdMap = IdMap()


def row_files(graph) -> RowFiles | None:
    """The RowFiles of `graph`: the ones it carries (`graph.row_files`, a typed relation's), else
    its directory's when it was opened from a local one; None when its rows are only DataFrames
    (the Spark SQL prepare then writes its layouts, engine.prepare.layout_writer)."""
    carried = getattr(graph, "row_files", None)
    if carried is not None:
        return carried
    path = getattr(graph, "path", None)
    if not path or not is_local(path):
        return None
    return RowFiles(join(path, EDGES_DIR), ((join(path, VERTICES_DIR), IdMap()),))


def _write_piece(directory: str, name: str, table: pa.Table) -> int:
    """One Parquet file (temp + rename); an empty slice writes nothing (as Spark's writer).
    Uncompressed, without dictionaries: a layout is the work dir's own, on a local disk, read by
    this preparation's next pass and the steps' local indexes, where snappy and the dictionary
    pass only cost CPU (4M edges: written in 0.09 s against 0.40 s, read in 0.04 s against 0.10 s,
    at twice the bytes)."""
    if not table.num_rows:
        return 0
    fs, inner = filesystem(directory)
    fs.create_dir(inner, recursive=True)
    temporary = join(inner, f".{name}.tmp")
    with fs.open_output_stream(temporary) as sink:
        pq.write_table(table, sink, compression="none", use_dictionary=False)
    fs.move(temporary, join(inner, name))
    return fs.get_file_info(join(inner, name)).size


def _edges_task(prep_dir, files, maps, partitions, token, has_weight, attr_dim, scan, batches):
    """Pass 1 for the readers this task serves (control_rows), one after another (_edges_reader)."""
    for reader in control_partitions(batches):
        yield from _edges_reader(prep_dir, files, maps, partitions, token, has_weight, attr_dim, scan, reader)


def _edges_reader(prep_dir, files, maps, partitions, token, has_weight, attr_dim, scan, reader):
    """Pass 1, reader i: in_edges slices by destination owner (with the edges' attribute vectors
    as column `a` when the graph has `attr_dim` > 0), endpoints through `maps` (the src and dst
    IdMap of RowFiles). With `scan` (the vertex files and their
    columns to read), it also checks and hashes the edges it reads and its share of the vertex
    files (_vertex_share; graph.scan_facts) and reports them next to its summary (ScanPartial.ddl)."""
    columns = ["src", "dst"] + (["weight"] if has_weight else []) + ([EDGE_ATTR] if attr_dim else [])
    pieces: dict[int, list[tuple]] = {q: [] for q in range(partitions)}
    partial = ScanPartial() if scan else None
    for batch in dealt_batches(files, columns, reader, partitions, READ_BATCH_ROWS):
        if partial is not None and partial.null_endpoints(batch):
            continue  # counted; the graph is refused before anything reads these slices
        src = batch.column("src").to_numpy().astype(np.int64, copy=False)
        dst = batch.column("dst").to_numpy().astype(np.int64, copy=False)
        w = (
            batch.column("weight").to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
            if has_weight
            else np.ones(len(src), np.float32)
        )
        if partial is not None:
            partial.add_edges(src, dst, w if has_weight else None)
        src, dst = maps[0].apply(src), maps[1].apply(dst)
        attr = to_numpy_matrix(batch.column(EDGE_ATTR), attr_dim) if attr_dim else None
        pd = owner_partition(dst, partitions)
        order = np.argsort(pd, kind="stable")
        bounds = np.searchsorted(pd[order], np.arange(partitions + 1))
        for q in range(partitions):
            take = order[bounds[q] : bounds[q + 1]]
            if len(take):
                pieces[q].append((src[take], dst[take], w[take], None if attr is None else attr[take]))
    rows = written = 0
    for q, parts in pieces.items():
        if not parts:
            continue
        table = pa.table(
            {
                "src": np.concatenate([p[0] for p in parts]),
                "dst": np.concatenate([p[1] for p in parts]),
                "w": np.concatenate([p[2] for p in parts]),
                **({static.EDGE_ATTR_COLUMN: to_fixed_list(np.concatenate([p[3] for p in parts]))} if attr_dim else {}),
            }
        )
        rows += table.num_rows
        written += _write_piece(join(prep_dir, "in_edges", f"part={q}"), f"part-{token}-r{reader}.parquet", table)
    summary = summary_row(reader, rows, written)
    if partial is None:
        yield summary
        return
    vertex_files, vertex_columns = scan
    for path in _vertex_share(vertex_files, reader, partitions):
        for batch in parquet_batches(path, vertex_columns, READ_BATCH_ROWS):
            partial.add_vertices(batch)
    yield _with_scan(summary, partial)


def _vertex_share(vertex_files: list[str], reader: int, partitions: int) -> list[str]:
    """The vertex files reader `reader` scans: dealt from the last reader backwards, so a graph of
    fewer row groups of edges than readers has its edges and its vertex files read by different tasks."""
    return [path for j, path in enumerate(vertex_files) if (partitions - 1 - j) % partitions == reader]


def _with_scan(report: pa.RecordBatch, partial: ScanPartial) -> pa.RecordBatch:
    """A task's report row with its scan partial's columns appended (ScanPartial.ddl)."""
    columns = {name: report.column(name) for name in report.schema.names}
    return pa.RecordBatch.from_pydict({**columns, **partial.arrays()})


def _read_slice(prep_dir: str, part: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    directory = join(prep_dir, "in_edges", f"part={part}")
    tables = [pq.read_table(join(directory, f.rel), columns=["src", "dst", "w"]) for f in data_files(directory)]
    if not tables:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    table = pa.concat_tables(tables)
    return (
        table.column("src").to_numpy(),
        table.column("dst").to_numpy(),
        table.column("w").to_numpy().astype(np.float32, copy=False),
    )


def _owned_ids(vertex_files: list[tuple[str, IdMap]], part: int | None, partitions: int) -> np.ndarray:
    """The vertex ids partition `part` owns, ascending (`part` None: every id); `vertex_files`:
    (file, the IdMap of its ids) pairs."""
    found = []
    for path, id_map in vertex_files:
        for batch in parquet_batches(path, ["id"], READ_BATCH_ROWS):
            ids = id_map.apply(batch.column("id").to_numpy().astype(np.int64, copy=False))
            found.append(ids if part is None else ids[owner_partition(ids, partitions) == part])
    return np.sort(np.concatenate(found)) if found else np.zeros(0, np.int64)


def _partition_task(prep_dir, vertex_files, partitions, token, scan, batches):
    """Pass 2 for the partitions this task serves (control_rows), one after another (_partition)."""
    for part in control_partitions(batches):
        yield from _partition(prep_dir, vertex_files, partitions, token, scan, part)


def _partition(prep_dir, vertex_files, partitions, token, scan, part):
    """Pass 2, partition q: vertices, the out_targets rows naming q, and q's statistics. With
    `scan`, it also counts q's duplicate ids and the edges of its slice whose endpoints are not
    vertex ids (graph.scan_facts), and reports them next to its statistics."""
    src, dst, w = _read_slice(prep_dir, part)
    partial = ScanPartial() if scan else None
    if partial is None:
        ids = _owned_ids(vertex_files, part, partitions)
    else:  # every id: an edge's source may be owned elsewhere (duplicates share an owner)
        every = _owned_ids(vertex_files, None, partitions)
        ids = every[owner_partition(every, partitions) == part]
        partial.duplicate_ids = scan_facts.repeated(ids)
        partial.dangling_dst = scan_facts.missing(ids, dst)
        partial.dangling_src = scan_facts.missing(every, src)
        if partial.duplicate_ids or partial.dangling_dst or partial.dangling_src:  # refused: write nothing
            yield _with_scan(_partition_report((part, len(ids), 0, len(ids), len(src), 0, 0)), partial)
            return
    written = _write_piece(
        join(prep_dir, "vertices", f"part={part}"),
        f"part-{token}-t{part}.parquet",
        pa.table({"id": ids, **prepared_stat_values(ids, src, dst, w)}),
    )
    ps = owner_partition(src, partitions)
    cross = ps != part
    sources = npsets.unique(src[cross])  # distinct (src, part) with the source owned elsewhere
    owner = owner_partition(sources, partitions)
    for p in npsets.unique(owner):
        rows = sources[owner == p]
        written += _write_piece(
            join(prep_dir, "out_targets", f"part={int(p)}"),
            f"part-{token}-t{part}.parquet",
            pa.table({"id": rows, "pt": np.full(len(rows), part, np.int32)}),
        )
    # combine's partial rows: distinct (source partition, destination) over cross edges
    partials = sum(len(npsets.unique(dst[cross & (ps == p)])) for p in range(partitions) if p != part)
    # The slice's local indexes (engine.static), saved next to the layout while its files are warm:
    # every later job's first layer loads them instead of deriving them. Content is a function of
    # the graph fingerprint and P (the folder's key), so a process-cached copy is never stale.
    if partial is None:
        static.in_edges(prep_dir, part)
    else:  # saved, not kept: this folder is renamed under the graph's fingerprint once every task
        # is done (engine.prepare), and the steps load the saved arrays from there
        static.in_edges.__wrapped__(prep_dir, part)
        static.owned.cache_clear()
    report = _partition_report((part, len(ids), written, len(ids), len(src), len(sources), partials))
    yield report if partial is None else _with_scan(report, partial)


def _partition_report(stats: tuple) -> pa.RecordBatch:
    """Pass 2's report row (STATS_SCHEMA_DDL) of (pt, rows, bytes, vertices, edges, mirror_rows, partials)."""
    names = ["pt", "rows", "bytes", "vertices", "edges", "mirror_rows", "partials"]
    return pa.RecordBatch.from_arrays(
        [pa.array([stats[0]], pa.int32())] + [pa.array([v], pa.int64()) for v in stats[1:]], names=names
    )


def prepare_in_tasks(spark, graph, partitions: int, path: str) -> dict:
    """Write the base layouts under `path` with the two passes above; returns the statistics
    engine.prepare's marker records. `path`'s layout folders are this preparation's (the marker
    is missing: an interrupted attempt's files are replaced, as Spark's overwrite would)."""
    stats, _totals = _two_passes(spark, graph, partitions, path, scan=False)
    return stats


def prepare_and_scan_in_tasks(spark, graph, partitions: int, path: str) -> tuple[dict, ScanTotals]:
    """prepare_in_tasks for a graph directory nothing vouches for yet (Graph.unvouched), whose
    tasks also validate and fingerprint what they read (graph.scan_facts): (the statistics, the
    scan's totals). Raises scan_facts.ScanFoundDefects as soon as a pass's totals show a defect
    (after pass 1 for the row checks, before pass 2 writes anything), for the caller to clean
    `path` up and let Graph.validate word the refusal. Not for edges with edge_attr."""
    if "edge_attr" in graph.edges.columns:
        raise ValueError("the prepare tasks' scan does not check edge attributes: validate the graph first")
    return _two_passes(spark, graph, partitions, path, scan=True)


def _two_passes(spark, graph, partitions: int, path: str, *, scan: bool) -> tuple[dict, ScanTotals]:
    source = row_files(graph)
    if source is None:
        raise ValueError(f"graph {graph.name!r} has no local files for prepare's tasks to read (engine.prepare)")
    for name in ("vertices", "in_edges", "out_targets"):  # each exists, empty or not, as Spark's writer leaves it
        _fresh_dir(join(path, name))
    token = uuid.uuid4().hex[:12]
    edge_files = [join(source.edges, f.rel) for f in data_files(source.edges)]
    vertex_files = [(join(folder, f.rel), id_map) for folder, id_map in source.vertices for f in data_files(folder)]
    control = control_rows(spark, partitions, prepare_tasks(spark, partitions))
    has_weight = "weight" in graph.edges.columns
    attr_dim = 0 if scan else int(getattr(graph, "edge_attr_dim", 0) or 0)
    totals = ScanTotals(has_weight)
    vertex_columns = ["id", "x"] + [c for c in ("y", "split") if c in graph.vertices.columns]
    scanned = ([file for file, _ in vertex_files], vertex_columns) if scan else None
    maps = (source.src, source.dst)
    edges = functools.partial(_edges_task, path, edge_files, maps, partitions, token, has_weight, attr_dim, scanned)
    extra = (", " + ScanPartial.ddl()) if scan else ""
    # two Spark jobs, each its own line in the job's time table (engine.phases); in a cold job the
    # first also starts the Python workers the later steps reuse
    with phase("prepare: edges by partition (tasks)"):
        reports = control.mapInArrow(edges, FILES_SCHEMA_DDL + extra).collect()
    check_reports(reports, partitions)
    _add_scans(totals, reports, scan)
    parts = functools.partial(_partition_task, path, vertex_files, partitions, token, scan)
    with phase("prepare: vertices, mirrors and counts (tasks)"):
        reports = control.mapInArrow(parts, STATS_SCHEMA_DDL + extra).collect()
    check_reports(reports, partitions)
    _add_scans(totals, reports, scan)
    return _stats(reports, partitions), totals


def _stats(reports, partitions: int) -> dict:
    """The statistics engine.prepare's marker records, from pass 2's reports of one graph."""
    partials = sum(int(r["partials"]) for r in reports)
    return {
        "num_vertices": sum(int(r["vertices"]) for r in reports),
        "num_edges": sum(int(r["edges"]) for r in reports),
        "partitions": partitions,
        "mirror_rows": sum(int(r["mirror_rows"]) for r in reports),
        "in_mirror_rows": partials,
        "combine_rows": partials,
        "max_partition_edges": max((int(r["edges"]) for r in reports), default=0),
    }


def prepare_many_in_tasks(spark, items) -> list[dict]:
    """prepare_in_tasks for several graphs at once (`items`: (graph, partitions, path) triples,
    each graph with RowFiles, no edge attributes): both passes of every graph in ONE Spark job
    each, whose control rows are every graph's readers (then partitions) in turn, a task serving
    a contiguous run of them. WHY: a typed round's relation layouts (engine.typed_prepare) are
    small, and a pass per relation pays a job's and its Python tasks' fixed cost for a fraction of
    a second of numpy; one pass over all of them pays it once. The statistics of each graph, in
    `items`' order."""
    if not items:
        return []
    offsets, units = [], 0
    readers, parts = [], []
    for graph, partitions, path in items:
        source = row_files(graph)
        if source is None or int(getattr(graph, "edge_attr_dim", 0) or 0):
            raise ValueError(f"graph {graph.name!r}: prepare_many_in_tasks reads local rows without edge attributes")
        for name in ("vertices", "in_edges", "out_targets"):
            _fresh_dir(join(path, name))
        token = uuid.uuid4().hex[:12]
        edge_files = [join(source.edges, f.rel) for f in data_files(source.edges)]
        vertex_files = [(join(folder, f.rel), id_map) for folder, id_map in source.vertices for f in data_files(folder)]
        has_weight = "weight" in graph.edges.columns
        readers.append((path, edge_files, (source.src, source.dst), partitions, token, has_weight, 0, None))
        parts.append((path, vertex_files, partitions, token, None))
        offsets.append(units)
        units += partitions
    control = control_rows(spark, units, prepare_tasks(spark, units))
    with phase("prepare: edges by partition (tasks)"):
        check_reports(
            control.mapInArrow(
                functools.partial(_units_task, _edges_reader, readers, offsets), FILES_SCHEMA_DDL
            ).collect(),
            units,
        )
    with phase("prepare: vertices, mirrors and counts (tasks)"):
        reports = control.mapInArrow(
            functools.partial(_units_task, _partition, parts, offsets), STATS_SCHEMA_DDL
        ).collect()
    check_reports(reports, units)
    stats = []
    for (_, partitions, _), offset in zip(items, offsets, strict=True):
        mine = [r for r in reports if offset <= int(r["pt"]) < offset + partitions]
        stats.append(_stats(mine, partitions))
    return stats


def _units_task(run, args: list[tuple], offsets: list[int], batches):
    """A pass of prepare_many_in_tasks for the units this task serves (control_rows): unit u is
    graph g's reader or partition u - offsets[g], run by `run` (_edges_reader or _partition) with
    g's `args` around it; each report row renumbered to u, so the driver checks every unit once."""
    import bisect

    for unit in control_partitions(batches):
        g = bisect.bisect_right(offsets, unit) - 1
        for row in run(*args[g], unit - offsets[g]):
            columns = {name: row.column(name) for name in row.schema.names}
            columns["pt"] = pa.array([unit], pa.int32())
            yield pa.RecordBatch.from_pydict(columns)


def prepare_tasks(spark, partitions: int) -> int:
    """How many Spark tasks run the P readers or partitions of a pass: no more than the cores,
    each serving a contiguous run of them one after another (control_rows). WHY: a Python task
    has a fixed cost that P tasks on fewer cores pay P / cores times over; the cores already ran
    them that many at a time, so the memory held at once and the work per core are unchanged."""
    return max(1, min(partitions, default_parallelism(spark)))


def _combine_task(prep_dir, partitions, token, batches):
    """combine's layouts for the partitions this task serves (control_rows), one after another."""
    for part in control_partitions(batches):
        yield from _combine_partition(prep_dir, partitions, token, part)


def _combine_partition(prep_dir, partitions, token, part):
    """Partition q's in_edges slice (every edge whose destination q owns) as combine's layouts:
    its edges as out_edges rows (src, dst, w, pd = q) of each source's owner, and q's in_targets
    rows, the distinct (dst, source partition) over cross edges (complete here: every edge of a
    destination q owns is in this slice)."""
    src, dst, w = _read_slice(prep_dir, part)
    ps = owner_partition(src, partitions)
    order = np.argsort(ps, kind="stable")
    bounds = np.searchsorted(ps[order], np.arange(partitions + 1))
    rows = written = 0
    for p in range(partitions):
        take = order[bounds[p] : bounds[p + 1]]
        if len(take):
            rows += len(take)
            written += _write_piece(
                join(prep_dir, "out_edges", f"part={p}"),
                f"part-{token}-t{part}.parquet",
                pa.table({"src": src[take], "dst": dst[take], "w": w[take], "pd": np.full(len(take), part, np.int32)}),
            )
    cross = ps != part
    pairs = np.unique(np.column_stack([dst[cross], ps[cross].astype(np.int64)]), axis=0)
    written += _write_piece(
        join(prep_dir, "in_targets", f"part={part}"),
        f"part-{token}-t{part}.parquet",
        pa.table({"id": pairs[:, 0], "pt": pairs[:, 1].astype(np.int32)}),
    )
    yield summary_row(part, rows + len(pairs), written)


def combine_layouts_in_tasks(spark, path: str, partitions: int) -> None:
    """Write combine's on-demand layouts (engine.prepare: out_edges, in_targets) of the layout
    prepared under `path` from its in_edges slices, in one Spark job of at most one task per core
    (prepare_tasks; an interrupted attempt's files replaced). Equal to the Spark SQL layouts."""
    for name in ("out_edges", "in_targets"):
        _fresh_dir(join(path, name))
    task = functools.partial(_combine_task, path, partitions, uuid.uuid4().hex[:12])
    control = control_rows(spark, partitions, prepare_tasks(spark, partitions))
    check_reports(control.mapInArrow(task, FILES_SCHEMA_DDL).collect(), partitions)


def _add_scans(totals: ScanTotals, reports, scan: bool) -> None:
    """Add a pass's scan partials to `totals`; a defect stops the preparation (ScanFoundDefects)."""
    if not scan:
        return
    for row in reports:
        totals.add(ScanPartial.from_row(row))
    if totals.has_defect:
        raise scan_facts.ScanFoundDefects("the prepare tasks found a defect in the graph's rows")


def _fresh_dir(path: str) -> None:
    """An empty folder at `path` (an interrupted attempt's files deleted)."""
    fs, inner = filesystem(path)
    try:
        fs.delete_dir(inner)
    except FileNotFoundError:
        pass
    fs.create_dir(inner, recursive=True)


def _out_stat_task(prep_dir, key, partitions, token, batches):
    """Out-edge statistic `key` for the partitions this task serves (control_rows), one after another."""
    for part in control_partitions(batches):
        yield from _out_stat_partition(prep_dir, key, partitions, token, part)


def _out_stat_partition(prep_dir, key, partitions, token, part):
    """Partition q's in_edges slice summed by source for out-edge statistic `key`: the partial
    sums of the sources partition o owns written to out_stats/<key>/part=o."""
    ids, sums = out_stat_sums(key, *_read_slice(prep_dir, part))
    owner = owner_partition(ids, partitions)
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(partitions + 1))
    written = 0
    for o in range(partitions):
        take = order[bounds[o] : bounds[o + 1]]
        if len(take):
            written += _write_piece(
                join(prep_dir, static.OUT_STATS_DIR, key, f"part={o}"),
                f"part-{token}-r{part}.parquet",
                pa.table({"id": ids[take], "v": sums[take]}),
            )
    yield summary_row(part, len(ids), written)


def out_stat_in_tasks(spark, path: str, partitions: int, key: str) -> None:
    """Write out-edge statistic `key`'s piece (module doc) of the layout prepared under `path`
    from its in_edges slices, at most one task per core (prepare_tasks; an interrupted attempt's
    files replaced)."""
    if not is_out_stat(key):
        raise ValueError(f"{key!r} is not an out-edge statistic")
    _fresh_dir(join(path, static.OUT_STATS_DIR, key))
    task = functools.partial(_out_stat_task, path, key, partitions, uuid.uuid4().hex[:12])
    control = control_rows(spark, partitions, prepare_tasks(spark, partitions))
    check_reports(control.mapInArrow(task, FILES_SCHEMA_DDL).collect(), partitions)
