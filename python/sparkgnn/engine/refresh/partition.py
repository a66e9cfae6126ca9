"""One partition of a partitioned refresh (job.py): the piece of the graph a Spark task owns, the
update applied to that piece, and the per-layer work on it.

A partition p OWNS the vertices with pmod(hash(id), P) = p (engine.routing.partition_expr) and
holds their in-edges (old, and inserted by the update) plus every vertex those edges come from
("foreign" vertices; their features stay with their owner, read when needed: routing.owner_rows,
fill_x).
That is everything refresh_kernel needs to recompute p's own targets, because a vertex's h^(l)
depends only on its in-edges, its own h^(l-1) and statistics, and the sources' h^(l-1) and
statistics:

* the update is applied to the piece with the single-machine `graph.updates.apply` (so a piece
  follows exactly the semantics, and the validation, of the local refresh): its edge rows are
  routed by destination, its vertex rows to the owner and to every partition holding the vertex
  (routing.py);
* statistics (GCN degrees ...) depend on a vertex's in-edges, which only its owner holds: each
  owner computes them for its vertices (old and new graph) and the driver joins them to the
  partitions holding the vertex as a foreign one (`foreign_stats`);
* a statistic over a vertex's OUT-edges (layers.stats.OUT_EDGE_STATS: ChebConv's Laplacian
  degree) is spread over every piece holding one of those edges: each piece writes its partial
  sums for every vertex it holds (`out_partials`), the driver sums them by id and routes the
  totals to every piece holding the vertex (`out_stats`), which replace the piece's own values.
  A vertex whose out-degree the update changes then counts as a changed source in every piece
  holding it, so its out-neighbours (and itself, at its owner) are recomputed;
* `plan_layer(..., owned=)` restricts the targets to owned vertices; the plan says which h^(l-1)
  values (old and new) and stored states the computation reads, the driver fetches exactly those
  from the store and the previous layer (`values`), and the computation runs. Where every segment
  of the old store has a row file (RunContext.store_rows), the compute task plans and reads those
  rows itself (`_read_values`: mapped row files, the new h^(l-1) from the files layer l-1's
  tasks wrote: `previous_rows`).

Everything a task reads or writes lies in the run directory (job.py lists it; rundir.py reads and
writes it), on a filesystem
every executor reaches; a task recomputes its piece from there (cached per Python worker), so a
task lost with its executor reruns anywhere. Vertex rows are sorted by id and edges by (dst, src,
weight), so every attempt of a task sums messages in the same order.

A graph whose edges carry attributes (`edge_attr`) keeps them on every edge row: in the pieces,
in the update's edge_insert rows, in the updated pieces; a conv that reads them gets the piece's
[E, D] rows (Piece.side), and the updated graph's fingerprint hashes them.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from sparkgnn import files, npsets
from sparkgnn.arrowvec import to_list, to_numpy_matrix
from sparkgnn.engine.refresh.routing import kind_counts, owner_rows, route_update
from sparkgnn.engine.refresh.rundir import (
    RunContext,
    edge_attr_dim,
    edge_schema,
    feature_dim,
    layer_dir,
    read_slice,
    vertex_schema,
    write_piece_file,
)
from sparkgnn.errors import GraphUpdateError
from sparkgnn.graph.checks import NO_SPLIT
from sparkgnn.graph.data import GraphData
from sparkgnn.graph.fingerprint import edge_hash_sum, vertex_hash_sum
from sparkgnn.graph.updates import UPDATE_SCHEMA, GraphUpdate, apply
from sparkgnn.graph.updates.applying import Applied
from sparkgnn.graph.updates.format import EDGE_ATTR_FIELD
from sparkgnn.layers.stats import OUT_EDGE_STATS, STATS
from sparkgnn.pe.lookup import SortedTable
from sparkgnn.pe.refresh_kernel import Side, compute_layer, plan_layer
from sparkgnn.stat_keys import stat_key

# Kinds of the values a layer's computation reads (column `kind` of needs / values).
NEW_H, OLD_H, STATE = 0, 1, 2
SUMMARY_SCHEMA = "part int, info string"
# layer l-1's recomputed rows as a layer-l task reads them (previous_rows)
CHANGED_SCHEMA = pa.schema([("id", pa.int64()), ("h", pa.list_(pa.float32()))])
CACHED_PIECES = 4


def out_stat_keys(keys) -> list:
    """The keys of `keys` (RunContext.stat_keys) that sum over a vertex's OUT-edges."""
    return [key for key, name, _w in keys if name in OUT_EDGE_STATS]


def stat_keys(model) -> tuple:
    """The statistics the model's convs read, keyed by (name, whether edge weights count)."""
    keys = {}
    for conv in model.convs:
        for name in conv.required_stats:
            keys[stat_key(conv, name)] = (name, bool(conv.uses_edge_weight))
    return tuple((key, name, weighted) for key, (name, weighted) in sorted(keys.items()))


# -- the piece ------------------------------------------------------------------------------------
VERTEX_COLUMNS = ("id", "x", "y", "split", "owned")


def _column(table: pa.Table, name: str):
    return table.column(name).to_numpy(zero_copy_only=False) if name in table.column_names else None


def _read_update(table: pa.Table) -> GraphUpdate:

    names = [*UPDATE_SCHEMA.names, EDGE_ATTR_FIELD.name]
    return GraphUpdate.from_table(table.select([n for n in names if n in table.column_names]))


@dataclass
class Piece:
    """Partition p's graph before and after the update, as refresh_kernel sees it."""

    part: int
    old: GraphData
    applied: Applied
    owned: np.ndarray  # bool over NEW rows
    owned_old: np.ndarray  # bool over OLD rows
    stats_old: dict = field(default_factory=dict)  # stat key -> float32 [old rows]
    stats_new: dict = field(default_factory=dict)  # stat key -> float32 [new rows]
    kinds: dict = field(default_factory=dict)  # update kind -> rows of it this piece counts (each row once)
    # whether a row's x is real (owned, or filled from its owner: fill_x) or zeros (a foreign vertex)
    known_old: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    known_new: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    extra: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # route_update's extra ids

    @property
    def new(self) -> GraphData:
        return self.applied.graph

    def side(self, conv, graph: GraphData, stats: dict, values) -> Side:
        """The Side of `graph` for `conv`: a conv that reads edge attributes gets the [E, D] rows
        in the weight slot (refresh_kernel's module doc), another its weights if it uses them."""
        w = graph.weight if conv.uses_edge_weight else None
        if conv.edge_attr_dim:
            if graph.edge_attr is None:
                raise ValueError(f"{conv.kind} reads edge attributes (edge_attr), but {graph.name} has none")
            w = graph.edge_attr
        named = {name: torch.from_numpy(stats[stat_key(conv, name)]) for name in conv.required_stats}
        return Side(graph.edge_src, graph.edge_dst, w, named, values)


def build_piece(ctx: RunContext, part: int) -> Piece:
    """Partition `part`'s piece: the old graph's piece (plus the vertices the update's inserted
    edges come from), the update applied (GraphUpdateError names what in the update is wrong for
    the vertices and edges this partition holds). A foreign vertex's features are not in the
    piece (pieces.py): its row holds zeros until a computation reads it (fill_x, from its owner)."""
    run_dir, schema = ctx.run_dir, vertex_schema(ctx.run_dir)
    vertices = read_slice(files.join(ctx.pieces_dir, "vertices"), part, schema)
    update_rows, extra = route_update(ctx, part, vertices.column("id").to_numpy())
    if len(extra):  # the sources of inserted edges the piece does not hold: from their owners
        found, rows = owner_rows(ctx, extra)
        rows = rows.append_column("owned", pa.array(np.zeros(rows.num_rows, bool)))
        vertices = pa.concat_tables([vertices, rows.select(vertices.column_names).cast(vertices.schema)])
    vertices = vertices.take(pc.sort_indices(vertices, [("id", "ascending")]))
    ids = vertices.column("id").to_numpy()
    x, known = _features(vertices.column("x"), feature_dim(run_dir))
    edges = read_slice(files.join(ctx.pieces_dir, "edges"), part, edge_schema(run_dir))
    src_ids, dst_ids = edges.column("src").to_numpy(), edges.column("dst").to_numpy()
    weight = _column(edges, "weight")
    order = np.lexsort((weight if weight is not None else np.zeros(len(src_ids)), src_ids, dst_ids))
    src, dst = np.searchsorted(ids, src_ids[order]), np.searchsorted(ids, dst_ids[order])
    edge_attr = None
    if edge_attr_dim(run_dir):
        edge_attr = to_numpy_matrix(edges.column(EDGE_ATTR_FIELD.name), edge_attr_dim(run_dir))[order]
    old = GraphData(
        ids,
        x,
        src,
        dst,
        weight=None if weight is None else np.asarray(weight, np.float32)[order],
        edge_attr=edge_attr,
        y=_column(vertices, "y"),
        split=_column(vertices, "split"),
        name=f"partition {part}",
    )
    owned_old = np.asarray(_column(vertices, "owned"), bool)
    update = _read_update(update_rows)
    # a feature update's old values decide whether it changes anything (Applied.feature_changed)
    touched, _found = old.id_index.lookup(update.feature_update_ids)
    _fill_rows(ctx, old, known, touched[_found])
    applied = apply(update, old)
    inserted_owned = update_rows.filter(
        pc.and_(pc.equal(update_rows.column("kind"), "vertex_insert"), update_rows.column("owned"))
    )
    owned = np.zeros(applied.graph.num_nodes, bool)
    inserted = applied.old_rows < 0
    owned[~inserted] = owned_old[applied.old_rows[~inserted]]
    owned[inserted] = np.isin(applied.graph.ids[inserted], inserted_owned.column("node").to_numpy())
    piece = Piece(part, old, applied, owned, owned_old, kinds=kind_counts(update_rows))
    piece.known_old, piece.extra = known, extra
    piece.known_new = np.ones(applied.graph.num_nodes, bool)
    piece.known_new[~inserted] = known[applied.old_rows[~inserted]]
    return piece


def _features(column, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(x [n, width] float32, known [n] bool): a null x (a foreign vertex's) is a row of zeros."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    known = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), bool)
    if known.all():
        x = to_numpy_matrix(column, width) if len(column) else np.zeros((0, width), np.float32)
        return np.array(x, dtype=np.float32, copy=True), known
    x = np.zeros((len(column), width), np.float32)
    if known.any():
        x[known] = to_numpy_matrix(column.filter(pa.array(known)), width)
    return x, known


def _fill_rows(ctx: RunContext, graph: GraphData, known: np.ndarray, rows: np.ndarray) -> None:
    """Fill graph.x at `rows` whose features the piece does not hold, from their owners."""
    missing = npsets.unique(rows[~known[rows]])
    if not len(missing):
        return
    found, table = owner_rows(ctx, graph.ids[missing])
    if not found.all():
        bad = graph.ids[missing[~found]][:5].tolist()
        raise ValueError(f"{graph.name}: the owners of vertices {bad} hold no row for them")
    graph.x[missing] = to_numpy_matrix(table.column("x"), graph.feature_dim)
    known[missing] = True


def fill_x(ctx: RunContext, piece: Piece, rows: np.ndarray, new: bool) -> None:
    """Make the features of `rows` (of the new graph if `new`, else of the old) real: a foreign
    vertex's row holds zeros until read. A new row is known where the update set it (inserted,
    or a feature update: its old row was filled before apply) or its old row is known."""
    if not new:
        _fill_rows(ctx, piece.old, piece.known_old, rows)
        return
    unknown = rows[~piece.known_new[rows]]  # kept rows: an inserted one is known
    if len(unknown):
        old_rows = piece.applied.old_rows[unknown]
        _fill_rows(ctx, piece.old, piece.known_old, old_rows)
        if piece.new.x is not piece.old.x:
            piece.new.x[unknown] = piece.old.x[old_rows]
        piece.known_new[unknown] = True


def local_stats(graph: GraphData, keys) -> dict:
    """Every statistic of `keys` for the rows of `graph` from its own edges (right for the
    vertices whose in-edges it holds: the owned ones)."""
    src, dst = torch.from_numpy(graph.edge_src), torch.from_numpy(graph.edge_dst)
    out = {}
    for key, name, weighted in keys:
        w = torch.from_numpy(graph.weight) if weighted and graph.weight is not None else None
        out[key] = STATS.lookup(name)(src, dst, w, graph.num_nodes).numpy().astype(np.float32)
    return out


_PIECES: OrderedDict = OrderedDict()
_PIECES_LOCK = threading.Lock()


def load_piece(ctx: RunContext, part: int) -> Piece:
    """The piece with every vertex's statistics (its own, foreign ones from their owners): the
    input of every layer's tasks, cached per Python worker (a few pieces: tasks of one layer run
    one part after another)."""
    key = (ctx.run_dir, part)
    with _PIECES_LOCK:
        if key in _PIECES:
            _PIECES.move_to_end(key)
            return _PIECES[key]
    piece = build_piece(ctx, part)
    piece.stats_old = local_stats(piece.old, ctx.stat_keys)
    piece.stats_new = local_stats(piece.new, ctx.stat_keys)
    if ctx.stat_keys:
        names = [f"{k}_{side}" for k, _n, _w in ctx.stat_keys for side in ("old", "new")]
        schema = pa.schema([("id", pa.int64())] + [(n, pa.float32()) for n in names])
        foreign = read_slice(files.join(ctx.run_dir, "foreign_stats"), part, schema)
        fids = foreign.column("id").to_numpy()
        for stats, graph, side in ((piece.stats_old, piece.old, "old"), (piece.stats_new, piece.new, "new")):
            rows, found = graph.id_index.lookup(fids)
            for k, _n, _w in ctx.stat_keys:
                values = foreign.column(f"{k}_{side}").to_numpy(zero_copy_only=False)
                keep = found & ~np.isnan(values)
                stats[k][rows[keep]] = values[keep]
    out_keys = out_stat_keys(ctx.stat_keys)
    if out_keys:  # every held vertex's total over all pieces replaces the piece's partial sum
        names = [f"{k}_{side}" for k in out_keys for side in ("old", "new")]
        schema = pa.schema([("id", pa.int64())] + [(n, pa.float32()) for n in names])
        totals = read_slice(files.join(ctx.run_dir, "out_stats"), part, schema)
        tids = totals.column("id").to_numpy()
        for stats, graph, side in ((piece.stats_old, piece.old, "old"), (piece.stats_new, piece.new, "new")):
            rows, found = graph.id_index.lookup(tids)
            for k in out_keys:
                values = totals.column(f"{k}_{side}").to_numpy(zero_copy_only=False)
                stats[k][rows[found]] = values[found]
    _cache_piece(ctx, piece)
    return piece


def _cache_piece(ctx: RunContext, piece: Piece) -> None:
    with _PIECES_LOCK:
        _PIECES[(ctx.run_dir, piece.part)] = piece
        while len(_PIECES) > CACHED_PIECES:
            _PIECES.popitem(last=False)


# -- the tasks --------------------------------------------------------------------------------------
def _parts(batches):
    for batch in batches:
        yield from (int(p) for p in batch.column(0).to_numpy())


def _summary(part: int, info: dict) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"part": pa.array([part], pa.int32()), "info": [json.dumps(info)]})


def build_task(ctx: RunContext, batches):
    """Round 0, one row per partition: apply the update to the piece; write the owned vertices'
    statistics (old and new graph) and the updated graph's piece (its owned vertices and their
    in-edges are also the piece's share of the updated graph). A rejected update yields its
    problem instead, for the driver to raise."""
    for part in _parts(batches):
        try:
            piece = build_piece(ctx, part)
        except GraphUpdateError as error:
            yield _summary(part, {"problem": str(error)})
            continue
        old, new = piece.old, piece.new
        stats_old, stats_new = local_stats(old, ctx.stat_keys), local_stats(new, ctx.stat_keys)
        if not ctx.stat_keys:  # complete: the layers' tasks on this Python worker start from it
            piece.stats_old, piece.stats_new = stats_old, stats_new
            _cache_piece(ctx, piece)
        ids = npsets.union(old.ids[piece.owned_old], new.ids[piece.owned])
        columns = {"id": pa.array(ids)}
        for k, _n, _w in ctx.stat_keys:
            for side, graph, stats in (("old", old, stats_old), ("new", new, stats_new)):
                rows, found = graph.id_index.lookup(ids)
                values = np.full(len(ids), np.nan, np.float32)
                values[found] = stats[k][rows[found]]
                columns[f"{k}_{side}"] = pa.array(values)
        write_piece_file(files.join(ctx.run_dir, "stats", f"part={part}.parquet"), pa.table(columns))
        extra = pa.table({"id": pa.array(piece.extra, pa.int64())})  # job._local reads them with the pieces'
        write_piece_file(files.join(ctx.run_dir, "in", "extra_local", f"part={part}", "extra.parquet"), extra)
        _write_out_partials(ctx, piece, stats_old, stats_new)
        _write_next_piece(ctx.run_dir, piece)
        rows = np.flatnonzero(piece.owned)
        yield _summary(
            part,
            {
                "vertices": len(rows),
                "edges": int(new.num_edges),
                "deleted": old.ids[piece.owned_old & (piece.applied.new_rows < 0)].tolist(),
                "kinds": piece.kinds,
                # the updated graph's fingerprint partials (graph/fingerprint.py sums are additive)
                "vertex_sum": vertex_hash_sum(new.ids[rows], new.x[rows]),
                "edge_sum": edge_hash_sum(new.ids[new.edge_src], new.ids[new.edge_dst], new.weight, new.edge_attr),
            },
        )


def _write_out_partials(ctx: RunContext, piece: Piece, stats_old: dict, stats_new: dict) -> None:
    """The piece's partial sums of each out-edge statistic (over the edges it holds, each edge
    held by exactly one piece) for every vertex it holds, old and new graph (0 where the vertex
    is absent), with the piece's part: the driver sums them into totals (module doc)."""
    out_keys = out_stat_keys(ctx.stat_keys)
    if not out_keys:
        return
    old, new = piece.old, piece.new
    ids = npsets.union(old.ids, new.ids)
    columns = {"id": pa.array(ids), "part": pa.array(np.full(len(ids), piece.part, np.int32))}
    for k in out_keys:
        for side, graph, stats in (("old", old, stats_old), ("new", new, stats_new)):
            rows, found = graph.id_index.lookup(ids)
            values = np.zeros(len(ids), np.float32)
            values[found] = stats[k][rows[found]]
            columns[f"{k}_{side}"] = pa.array(values)
    write_piece_file(files.join(ctx.run_dir, "out_partials", f"part={piece.part}.parquet"), pa.table(columns))


def _write_next_piece(run_dir: str, piece: Piece) -> None:
    """The updated graph's piece, in the layout of pieces.py (the next refresh's input): owned
    vertices and the sources of their in-edges, the in-edges, the held ids."""
    new = piece.new
    held = piece.owned.copy()
    held[new.edge_src] = True
    rows = np.flatnonzero(held)
    vertices = {"id": pa.array(new.ids[rows]), "x": _owned_x(new.x, rows, piece.owned[rows])}
    vertices.update(_labels(new, rows))
    vertices["owned"] = pa.array(piece.owned[rows])
    folder = files.join(run_dir, "next")
    name = f"part={piece.part}/piece.parquet"
    write_piece_file(files.join(folder, "vertices", name), pa.table(vertices))
    owned = np.flatnonzero(piece.owned)
    owned = owned[np.argsort(new.ids[owned], kind="stable")]
    features = {"id": pa.array(new.ids[owned]), "x": to_list(new.x[owned])}
    features.update(_labels(new, owned))
    write_features(folder, piece.part, pa.table(features))
    write_piece_file(files.join(folder, "edges", name), pa.table(_edge_columns(new)))
    write_piece_file(files.join(folder, "local", name), pa.table({"id": pa.array(new.ids[rows])}))


def write_features(pieces: str, part: int, table: pa.Table) -> None:
    """features/part=<part>.arrow of the pieces at `pieces`: `table` (the part's owned vertices,
    id sorted: id, x[, y][, split]) as an Arrow IPC file, x a fixed-size list, that owner_rows
    memory-maps and takes rows from (no Parquet decode of the part's vertices)."""
    if table.num_rows:
        x = to_numpy_matrix(table.column("x"))
        flat = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(x).reshape(-1)), x.shape[1])
        table = table.set_column(table.column_names.index("x"), "x", flat)
    path = files.join(pieces, "features", f"part={part}.arrow")
    files.makedirs(files.parent(path))
    fs, inner = files.filesystem(path)
    with fs.open_output_stream(inner) as sink, pa.ipc.new_file(sink, table.schema) as out:
        out.write_table(table)


def _owned_x(x: np.ndarray, rows: np.ndarray, owned: np.ndarray) -> pa.Array:
    """x[rows] as a list column, null where the row is not owned (no copy of foreign features)."""
    width = x.shape[1]
    offsets = np.zeros(len(rows) + 1, np.int32)
    np.cumsum(np.where(owned, width, 0), out=offsets[1:])
    values = pa.array(np.ascontiguousarray(x[rows[owned]]).reshape(-1))
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(~owned))


def _labels(graph: GraphData, rows: np.ndarray) -> dict:
    out = {}
    if graph.y is not None:
        out["y"] = pa.array(graph.y[rows])
    if graph.split is not None:
        split = np.asarray(graph.split[rows]).astype(str)
        out["split"] = pa.array(split, mask=split == NO_SPLIT, type=pa.string())
    return out


def _edge_columns(graph: GraphData) -> dict:
    edges = {"src": pa.array(graph.ids[graph.edge_src]), "dst": pa.array(graph.ids[graph.edge_dst])}
    if graph.weight is not None:
        edges["weight"] = pa.array(graph.weight)
    if graph.edge_attr is not None:
        edges[EDGE_ATTR_FIELD.name] = to_list(graph.edge_attr)
    return edges


_MODELS: dict = {}


def _model(ctx: RunContext):
    from sparkgnn.dl.model_store import ModelRegistry

    registry = _MODELS.setdefault(ctx.model_store, ModelRegistry(ctx.model_store))
    return registry.get(ctx.model_fingerprint)


def _rows(values: SortedTable, ids: np.ndarray) -> torch.Tensor:
    """The fetched vectors of `ids` (each must have been fetched: the plan task asked for it)."""
    return torch.from_numpy(np.ascontiguousarray(values.take(ids, "v")))


def _values(ctx: RunContext, layer: int, part: int) -> dict:
    schema = pa.schema([("id", pa.int64()), ("kind", pa.int32()), ("v", pa.list_(pa.float32()))])
    table = read_slice(layer_dir(ctx.run_dir, layer, "values"), part, schema)
    kinds = table.column("kind").to_numpy()
    out = {}
    for kind, what in ((NEW_H, "h^(l-1) after"), (OLD_H, "h^(l-1) before"), (STATE, "stored state")):
        rows = table.filter(pa.array(kinds == kind))
        if rows.column("v").null_count:
            bad = rows.filter(rows.column("v").is_null()).column("id").to_numpy()[:5].tolist()
            raise ValueError(f"layer {layer}: the PE store has no {what} for vertices {bad} of partition {part}")
        matrix = to_numpy_matrix(rows.column("v")) if rows.num_rows else np.zeros((0, 0), np.float32)
        out[kind] = SortedTable(rows.column("id").to_numpy(), {"v": matrix}, f"layer {layer} {what}, partition {part}")
    return out


def previous_rows(folder: str, piece: Piece, with_h: bool) -> pa.Table:
    """Layer l-1's recomputed rows (id[, h]) the piece holds, read from `folder` (the files the
    tasks of layer l-1 wrote, every partition's: id, h, state, a tombstone's h null), tombstones
    and the rows of vertices the piece does not hold left out. Every task reads them whole (the
    id column, and h when asked): the recomputed rows of one layer, no Spark job to route them."""
    columns = ["id", "h"] if with_h else ["id"]
    paths = [files.join(folder, f.rel) for f in files.data_files(folder)]
    fs = files.filesystem(folder)[0]
    schema = CHANGED_SCHEMA if with_h else pa.schema([("id", pa.int64())])
    tables = [
        pq.read_table(files.filesystem(p)[1], columns=columns, filesystem=fs, partitioning=None).cast(schema)
        for p in paths
    ]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    if with_h:
        table = table.filter(pc.is_valid(table.column("h")))
    _rows_, found = piece.new.id_index.lookup(table.column("id").to_numpy())
    return table.filter(pa.array(found)).select(columns)


def _changed(layer: int, piece: Piece, previous: str | None) -> np.ndarray:
    """Sorted new rows of the piece whose h^(l-1) changed (layer 1: features; else the previous
    layer's targets in every partition, read from `previous`: previous_rows)."""
    if layer == 1:
        return np.asarray(piece.applied.feature_changed, np.int64)
    assert previous is not None, "layer > 1 reads the previous layer's rows"
    ids = previous_rows(previous, piece, with_h=False)
    rows, found = piece.new.id_index.lookup(ids.column("id").to_numpy())
    return npsets.unique(rows[found])


def _layer_sides(ctx: RunContext, layer: int, piece: Piece, values: dict | None):
    """(model, conv l, old Side, new Side); h^(l-1) from the features at layer 1, else from the
    fetched `values` (None while planning: a plan reads no values)."""
    model = _model(ctx)
    conv = model.conv(layer - 1)
    old, new = piece.old, piece.new
    old_values: Callable | None = None
    new_values: Callable | None = None
    if layer == 1:

        def old_values(rows):
            fill_x(ctx, piece, np.asarray(rows), new=False)
            return model.pre(torch.from_numpy(np.ascontiguousarray(old.x[rows])))

        def new_values(rows):
            fill_x(ctx, piece, np.asarray(rows), new=True)
            return model.pre(torch.from_numpy(np.ascontiguousarray(new.x[rows])))

    elif values is not None:

        def old_values(rows):
            return _rows(values[OLD_H], old.ids[rows])

        def new_values(rows):
            return _rows(values[NEW_H], new.ids[rows])

    return (
        model,
        conv,
        piece.side(conv, old, piece.stats_old, old_values),
        piece.side(conv, new, piece.stats_new, new_values),
    )


def _plan(ctx: RunContext, layer: int, piece: Piece, values: dict | None, previous: str | None):
    model, conv, old, new = _layer_sides(ctx, layer, piece, values)
    plan = plan_layer(conv, old, new, piece.applied, _changed(layer, piece, previous), owned=piece.owned)
    return model, conv, old, new, plan


def _wanted(layer: int, piece: Piece, plan) -> list:
    """[(kind, ids)]: the values the plan's computation reads (stored states of layer l; from
    layer 2 on, h^(l-1) after and before the update)."""
    wanted = [(STATE, piece.old.ids[plan.state_rows_needed(piece.applied.old_rows)])]
    if layer > 1:
        wanted += [(NEW_H, piece.new.ids[plan.new_rows_needed()]), (OLD_H, piece.old.ids[plan.old_rows_needed()])]
    return wanted


def plan_task(ctx: RunContext, layer: int, previous: str | None, batches):
    """Round 1 of a layer: plan the piece's targets and write which values the computation reads
    (h^(l-1) after and before the update, stored states of layer l) as (part, id, kind) rows.
    `previous`: the folder holding layer l-1's recomputed rows (None at layer 1)."""
    for part in _parts(batches):
        piece = load_piece(ctx, part)
        _model_, _conv, _old, _new, plan = _plan(ctx, layer, piece, None, previous)
        wanted = _wanted(layer, piece, plan)
        ids = np.concatenate([w for _k, w in wanted])
        kinds = np.concatenate([np.full(len(w), k, np.int32) for k, w in wanted])
        table = pa.table(
            {"part": pa.array(np.full(len(ids), part, np.int32)), "id": pa.array(ids), "kind": pa.array(kinds)}
        )
        write_piece_file(files.join(layer_dir(ctx.run_dir, layer, "needs"), f"part={part}.parquet"), table)
        yield _summary(part, {"targets": len(plan.targets), "needs": len(ids)})


def compute_task(ctx: RunContext, layer: int, previous: str | None, batches):
    """Round 2 of a layer (its only round when the tasks read the old store's row files:
    RunContext.store_rows): recompute the piece's targets from the fetched values and write their
    (id, h, state) rows, and a tombstone (null h and state) per owned vertex the update deletes:
    the layer's delta as the store commits it. `previous`: the folder holding layer l-1's rows."""
    for part in _parts(batches):
        yield _summary(part, _compute_piece(ctx, layer, part, previous))


@torch.no_grad()
def _compute_piece(ctx: RunContext, layer: int, part: int, previous: str | None) -> dict:
    piece = load_piece(ctx, part)
    read: dict = {}
    if ctx.store_rows:  # plan, then read what the plan needs (the sides look values up when computing)
        values: dict = {}
        model, conv, old, new, plan = _plan(ctx, layer, piece, values, previous)
        read["needs"] = _read_values(ctx, layer, piece, plan, values, previous)
    else:
        values = _values(ctx, layer, part)
        model, conv, old, new, plan = _plan(ctx, layer, piece, values, previous)
    change = compute_layer(
        conv,
        lambda h: model.post(layer - 1, h),
        plan,
        old,
        new,
        piece.applied.old_rows,
        lambda rows: _rows(values[STATE], piece.old.ids[rows]),
    )
    deleted = piece.old.ids[piece.owned_old & (piece.applied.new_rows < 0)]
    h, state = to_list(change.h.numpy()), to_list(change.state.numpy())
    table = pa.table(
        {
            "id": pa.array(np.concatenate([piece.new.ids[change.targets], deleted])),
            "h": pa.concat_arrays([h, pa.nulls(len(deleted), h.type)]),
            "state": pa.concat_arrays([state, pa.nulls(len(deleted), state.type)]),
        }
    )
    write_piece_file(files.join(layer_dir(ctx.run_dir, layer, "out"), f"part={part}.parquet"), table)
    info = {k: int(getattr(change, k)) for k in ("delta", "scratch", "new_messages", "old_messages")}
    return {"targets": len(change.targets), **info, **read}


def _read_values(ctx: RunContext, layer: int, piece: Piece, plan, values: dict, previous: str | None) -> int:
    """Fill `values` (kind -> SortedTable, as _values reads them from a fetch) with what `plan`
    reads: stored states and h^(l-1) before the update from the old store's row files, h^(l-1)
    after it from layer l-1's recomputed rows (previous_rows, with h) where the vertex
    was recomputed, else from the store (unchanged). Returns how many values it read."""
    wanted = {kind: npsets.unique(ids) for kind, ids in _wanted(layer, piece, plan)}
    where = f"partition {piece.part}"
    state = ctx.layer_rows(layer)
    values[STATE] = SortedTable(
        wanted[STATE], {"v": state.get(wanted[STATE], "state")}, f"layer {layer} stored state, {where}"
    )
    if layer > 1:
        stored = ctx.layer_rows(layer - 1)
        assert previous is not None, "layer > 1 reads the previous layer's rows"
        changed = previous_rows(previous, piece, with_h=True)
        width = stored.segments[-1].widths["h"]
        # an id may come twice (held as a source and inserted here): the same row
        fresh_ids, first = np.unique(changed.column("id").to_numpy(), return_index=True)
        fresh = to_numpy_matrix(changed.column("h"), width) if len(fresh_ids) else np.zeros((0, width), np.float32)
        new_ids = wanted[NEW_H]
        recomputed = np.isin(new_ids, fresh_ids)
        new_h = np.empty((len(new_ids), width), np.float32)
        new_h[recomputed] = fresh[first[np.searchsorted(fresh_ids, new_ids[recomputed])]]
        new_h[~recomputed] = stored.get(new_ids[~recomputed], "h")
        values[NEW_H] = SortedTable(new_ids, {"v": new_h}, f"layer {layer} h^(l-1) after, {where}")
        values[OLD_H] = SortedTable(
            wanted[OLD_H], {"v": stored.get(wanted[OLD_H], "h")}, f"layer {layer} h^(l-1) before, {where}"
        )
    return int(sum(len(ids) for ids in wanted.values()))
