"""The update routed by a refresh's tasks, and the owners' vertex rows (partition.py's pieces
read both).

Every round-0 task reads the update folder whole (cached per Python worker, keyed by the files the
driver listed) and keeps the rows its piece concerns (`route_update`): edge rows by destination,
vertex rows to the owner and to every piece holding the vertex -- the routing Spark's joins did,
without a Spark job. A piece that needs the features of a vertex it does not own reads them from
the owner's features file (`owner_rows`), memory-mapped and cached per worker, checked against the
files' sizes and mtimes."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sparkgnn import files, npsets
from sparkgnn.engine.refresh.rundir import RunContext, read_slice, vertex_schema
from sparkgnn.errors import GraphUpdateError
from sparkgnn.graph.updates import KINDS, UPDATE_SCHEMA
from sparkgnn.graph.updates.format import EDGE_ATTR_FIELD

# The update's kinds whose rows are routed to every piece holding the vertex (the owner counts them).
VERTEX_KINDS = ("vertex_insert", "feature_update", "vertex_delete")


# -- the update, routed by the tasks ---------------------------------------------------------------
UPDATE_TASK_SCHEMA = pa.schema([*UPDATE_SCHEMA, EDGE_ATTR_FIELD])
_UPDATES: dict = {}


def file_marks(path: str) -> tuple:
    """((relative name, size, mtime_ns), ...) of the data files under `path` (a single file: its
    base name; nothing there: ()): what a worker's cached copy of them is keyed by and checked
    against (the update: RunContext.update_files; the owners' rows: _owned_table)."""
    if files.kind(path) == "file":
        fs, inner = files.filesystem(path)
        info = fs.get_file_info(inner)
        return ((info.base_name, int(info.size), int(info.mtime_ns or 0)),)
    return tuple((f.rel, f.size, f.mtime_ns) for f in files.data_files(path))


def _update_table(path: str, listed: tuple) -> pa.Table:
    """The update folder whole (every column of UPDATE_TASK_SCHEMA; one it lacks is null), cached
    per Python worker (every round-0 task reads it; a Spark session's workers outlive a refresh)
    keyed by the path and `listed`, the files the driver saw (file_marks): an update rewritten
    at the same path is read again, and one rewritten while the refresh runs is refused."""
    key = (path, listed)
    if key in _UPDATES:
        return _UPDATES[key]
    if listed and file_marks(path) != listed:
        raise GraphUpdateError(f"graph update {path} changed while the refresh ran: rerun it on a fixed update")
    paths = [path] if files.kind(path) == "file" else [files.join(path, f.rel) for f in files.data_files(path)]
    fs = files.filesystem(path)[0]
    tables = []
    for one in paths:
        table = pq.read_table(files.filesystem(one)[1], filesystem=fs, partitioning=None)
        columns = []
        for f in UPDATE_TASK_SCHEMA:
            column = table.column(f.name) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
            try:
                columns.append(column.cast(f.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise GraphUpdateError(
                    f"graph update {one}: column `{f.name}` is {column.type}, not {f.type}"
                ) from None
        tables.append(pa.table(columns, schema=UPDATE_TASK_SCHEMA))
    table = pa.concat_tables(tables) if tables else UPDATE_TASK_SCHEMA.empty_table()
    _UPDATES.clear()
    _UPDATES[key] = table
    return table


def route_update(ctx: RunContext, part: int, held: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """(the update's rows piece `part` applies, with `owned`; the ids of the sources of its
    inserted or deleted edges it does not hold): edge rows by destination, vertex rows to the
    owner and to every piece holding the vertex, the rows no task could be chosen for (an unknown
    kind, a missing dst or node) to piece 0, whose apply names them -- the routing Spark's joins
    did, in every task from the update read whole."""
    from sparkgnn.engine.routing import owner_partition

    table = _update_table(ctx.update_path, ctx.update_files)
    kind = table.column("kind")
    known_kind = pc.fill_null(pc.is_in(kind, pa.array(KINDS)), False).to_numpy(zero_copy_only=False)
    edge = pc.fill_null(pc.is_in(kind, pa.array(["edge_insert", "edge_delete"])), False).to_numpy(zero_copy_only=False)
    vertex_kind = pc.fill_null(pc.is_in(kind, pa.array(VERTEX_KINDS)), False).to_numpy(zero_copy_only=False)
    dst_valid = table.column("dst").is_valid().to_numpy(zero_copy_only=False)
    node_valid = table.column("node").is_valid().to_numpy(zero_copy_only=False)
    dst = pc.fill_null(table.column("dst"), 0).to_numpy()
    node = pc.fill_null(table.column("node"), 0).to_numpy()
    P = ctx.partitions
    edge_here = edge & np.where(dst_valid, owner_partition(dst, P) == part, part == 0)
    src = table.column("src").filter(pa.array(edge_here)).drop_null().to_numpy()
    extra = npsets.setdiff(npsets.unique(src), held)
    holds = npsets.union(held, extra)
    vertex = vertex_kind & node_valid
    owner = owner_partition(node, P) == part
    vertex_here = vertex & (owner | np.isin(node, holds))
    other = (~known_kind | (vertex_kind & ~node_valid)) & (part == 0)
    keep = edge_here | vertex_here | other
    routed = table.filter(pa.array(keep)).append_column("owned", pa.array((vertex & owner)[keep]))
    return routed, extra


# -- the owners' vertex rows (features of foreign vertices) ----------------------------------------
_OWNED: OrderedDict = OrderedDict()


def _owned_table(ctx: RunContext, part: int) -> tuple[np.ndarray, pa.Table]:
    """(sorted ids, rows) of the vertices piece `part` owns in the old graph: its features file
    (features/part=<p>.arrow, memory-mapped) where the refresh that made the pieces wrote one,
    else its vertex rows (the owned ones carry x). Cached per Python worker, keyed by the pieces'
    folder (its name holds the graph's fingerprint and P) and checked against the files' sizes and
    mtimes, so a layout deleted and rebuilt under the same name is read again."""
    key = (ctx.pieces_dir, part)
    path = files.join(ctx.pieces_dir, "features", f"part={part}.arrow")
    mapped = files.is_local(path) and files.kind(path) == "file"
    marks = file_marks(path) if mapped else file_marks(files.join(ctx.pieces_dir, "vertices", f"part={part}"))
    cached = _OWNED.get(key)
    if cached is not None and cached[0] == marks:
        _OWNED.move_to_end(key)
        return cached[1], cached[2]
    if mapped:
        table = pa.ipc.open_file(pa.memory_map(files.filesystem(path)[1])).read_all()
    else:
        table = read_slice(files.join(ctx.pieces_dir, "vertices"), part, vertex_schema(ctx.run_dir))
        table = table.filter(table.column("owned")).drop_columns(["owned"])
        table = table.take(pc.sort_indices(table, [("id", "ascending")]))
    ids = table.column("id").to_numpy()
    _OWNED[key] = (marks, ids, table)
    while len(_OWNED) > 2 * ctx.partitions:
        _OWNED.popitem(last=False)
    return ids, table


def owner_rows(ctx: RunContext, ids: np.ndarray) -> tuple[np.ndarray, pa.Table]:
    """(found [len(ids)] bool, the owners' rows of ids[found] in that order: id, x[, y][, split])."""
    from sparkgnn.engine.routing import owner_partition

    ids = np.asarray(ids, np.int64)
    owners = owner_partition(ids, ctx.partitions)
    found = np.zeros(len(ids), bool)
    positions = np.zeros(len(ids), np.int64)
    tables = {}
    for q in npsets.unique(owners):
        at = np.flatnonzero(owners == q)
        owned_ids, table = _owned_table(ctx, int(q))
        pos = np.minimum(np.searchsorted(owned_ids, ids[at]), max(len(owned_ids) - 1, 0))
        hit = (owned_ids[pos] == ids[at]) if len(owned_ids) else np.zeros(len(at), bool)
        found[at] = hit
        positions[at] = pos
        tables[int(q)] = table
    schema = vertex_schema(ctx.run_dir).remove(vertex_schema(ctx.run_dir).get_field_index("owned"))
    hits = np.flatnonzero(found)
    chunks, where = [], []
    for q, table in tables.items():
        sel = hits[owners[hits] == q]
        if len(sel):  # a features file's x is a fixed-size list: one type for both sources
            chunks.append(table.select(schema.names).take(pa.array(positions[sel])).cast(schema))
            where.append(sel)
    if not chunks:
        return found, schema.empty_table()
    table = pa.concat_tables(chunks)
    return found, table.take(pa.array(np.argsort(np.concatenate(where), kind="stable")))


def kind_counts(update_rows: pa.Table) -> dict:
    """Rows of each update kind this piece counts: a vertex row where the piece owns the vertex
    (it is routed to every holder, the owner among them), any other row where it was routed (once)."""
    vertex_row = pc.is_in(update_rows.column("kind"), pa.array(VERTEX_KINDS))
    counted = update_rows.filter(pc.or_kleene(pc.invert(vertex_row), update_rows.column("owned")))
    return {str(v["values"]): int(v["counts"]) for v in counted.column("kind").value_counts().to_pylist()}
