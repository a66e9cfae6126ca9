"""The typed request file: serving.request's Parquet format with a node type on every node row and
a relation on every edge row, read into serving.typed.TypedRequest (what the streaming job reads
on a typed graph).

    request_id, kind, node, x, src, dst   as in serving/request.py (SCHEMA)
    type       : string   node rows: the query's node type;                     edge rows: null
    relation   : string   edge rows: the `src__rel__dst` key of the edge's relation (the key
                          the typed graph format names its edge folders by); node rows: null

Ids are per type: a node row's `node` is an id of its `type`, an edge row's `src` an id of its
relation's source type (a query of that type or a vertex of G), `dst` one of its destination type.
A type whose vertices have no features in G has queries without features: `x` is null on all of
its node rows; the queries of one type within one request carry features all or none, of one
width. Node rows keep their order within a type; a request's types and relations keep the order
of their first row, which is the order of TypedRequest.nodes (and of the answer's queries).

Malformed (the whole file refused, RequestError starting with the file's name): what the
homogeneous format refuses (not Parquet, a column missing, no row, a kind other than node/edge,
null ids), a node row without a type, an edge row without a relation or with one that is not a
`src__rel__dst` key, some but not all of a type's queries with features, ragged feature rows, or
an `edge_attr` column (typed requests carry no edge attributes). A file that parses but names an
unknown type or relation, or ids G does not have, holds an invalid REQUEST (TypedRequest.problems):
the streaming job answers it with an error row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sparkgnn import npsets
from sparkgnn.graph.typed import edge_key, parse_edge_key
from sparkgnn.serving.request import (
    KIND_EDGE,
    KIND_NODE,
    SCHEMA,
    RequestError,
    _non_null_int,
    _one_line,
    request_file_table,
    request_ids_and_kinds,
    write_request_table,
)
from sparkgnn.serving.typed import TypedRequest

TYPED_SCHEMA = pa.schema([*SCHEMA, pa.field("type", pa.string()), pa.field("relation", pa.string())])


def typed_requests_table(requests) -> pa.Table:
    """TypedRequests -> one Arrow table in TYPED_SCHEMA (a request's node rows type by type, then
    its edge rows relation by relation)."""
    requests = list(requests)
    if not requests:
        raise RequestError("no typed requests to write")
    cols: dict[str, list] = {f.name: [] for f in TYPED_SCHEMA}

    def add(**row) -> None:
        for name, values in cols.items():
            values.append(row.get(name))

    for r in requests:
        for t, (ids, x) in r.nodes.items():
            ids = np.asarray(ids, dtype=np.int64).reshape(-1)
            rows = None if x is None else np.asarray(x, dtype=np.float32).reshape(len(ids), -1)
            for k, i in enumerate(ids.tolist()):
                add(request_id=r.request_id, kind=KIND_NODE, node=i, x=None if rows is None else rows[k], type=t)
        for et, (src, dst) in r.edges.items():
            src = np.asarray(src, dtype=np.int64).reshape(-1).tolist()
            dst = np.asarray(dst, dtype=np.int64).reshape(-1).tolist()
            if len(src) != len(dst):
                raise RequestError(
                    f"typed request {r.request_id!r}: relation {tuple(et)}: {len(src)} sources but {len(dst)} "
                    "destinations"
                )
            key = edge_key(tuple(et))
            for s, d in zip(src, dst, strict=True):
                add(request_id=r.request_id, kind=KIND_EDGE, src=s, dst=d, relation=key)
    return pa.table({f.name: pa.array(cols[f.name], f.type) for f in TYPED_SCHEMA}, schema=TYPED_SCHEMA)


def write_typed_requests(path: str, requests) -> str:
    """Write TypedRequests as ONE typed request file at `path`, atomically (as
    serving.request.write_requests). Returns the path."""
    return write_request_table(path, typed_requests_table(requests))


def parse_typed_request_bytes(content: bytes | None, name: str = "<bytes>") -> list[TypedRequest]:
    """The typed requests of one typed request file's bytes, in file order; RequestError, starting
    with `name`, says why the file is unusable (module doc)."""
    table = request_file_table(
        content, name, TYPED_SCHEMA, what="a typed request file", hint="the graph served here is typed: "
    )
    if "edge_attr" in table.column_names:
        raise RequestError(f"{name}: has an edge_attr column; typed requests carry no edge attributes")
    if table.num_rows == 0:
        raise RequestError(f"{name}: no rows (a request file holds at least one request)")
    try:
        table = table.select(TYPED_SCHEMA.names).cast(TYPED_SCHEMA)
    except Exception as exc:  # noqa: BLE001  (ArrowInvalid / NotImplemented: types do not fit)
        have = {f.name: str(f.type) for f in table.schema if f.name in TYPED_SCHEMA.names}
        raise RequestError(
            f"{name}: column types {have} do not fit the typed request schema ({_one_line(exc)})"
        ) from None
    try:
        return typed_requests_from_table(table)
    except RequestError as exc:
        raise RequestError(f"{name}: {_one_line(exc)}") from None


def _strings(table: pa.Table, column: str, rows: np.ndarray, what: str) -> np.ndarray:
    """`column` at `rows` as strings; RequestError when one is null."""
    values = table.column(column).take(pa.array(rows, pa.int64())).combine_chunks()
    if values.null_count:
        raise RequestError(f"{values.null_count} {what} have a null {column}")
    return values.to_numpy(zero_copy_only=False).astype(str)


def _first_order(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values in order of first appearance, each entry's index into them)."""
    names, first, code = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return names[order], rank[code.reshape(-1)]


def typed_requests_from_table(table: pa.Table) -> list[TypedRequest]:
    """Arrow table in TYPED_SCHEMA -> TypedRequests, in order of first appearance of each request
    id (module doc)."""
    rid, kind = request_ids_and_kinds(table)
    names, code = _first_order(rid)
    node_rows = np.flatnonzero(kind == KIND_NODE)
    edge_rows = np.flatnonzero(kind == KIND_EDGE)
    node_rows = node_rows[np.argsort(code[node_rows], kind="stable")]
    edge_rows = edge_rows[np.argsort(code[edge_rows], kind="stable")]

    nodes = table.take(pa.array(node_rows, pa.int64()))
    qid = _non_null_int(nodes.column("node"), "node", "node rows")
    types = _strings(table, "type", node_rows, "node rows")
    x_col = nodes.column("x").combine_chunks()
    has_x = x_col.is_valid().to_numpy(zero_copy_only=False)
    offsets = x_col.offsets.to_numpy()
    lengths = np.diff(offsets) * has_x if len(x_col) else np.zeros(0, np.int64)
    flat = x_col.values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)

    edges = table.take(pa.array(edge_rows, pa.int64()))
    src = _non_null_int(edges.column("src"), "src", "edge rows")
    dst = _non_null_int(edges.column("dst"), "dst", "edge rows")
    keys = _strings(table, "relation", edge_rows, "edge rows")
    relations = {}
    for key in npsets.unique(keys).tolist():
        relation = parse_edge_key(key)
        if relation is None:
            raise RequestError(f"relation {key!r} is not a 'src type__relation__dst type' key")
        relations[key] = relation

    k = len(names)
    node_bounds = np.searchsorted(code[node_rows], np.arange(k + 1))
    edge_bounds = np.searchsorted(code[edge_rows], np.arange(k + 1))
    out = []
    for i in range(k):  # per-request grouping only
        request_id = str(names[i])
        a, b = node_bounds[i], node_bounds[i + 1]
        request_nodes: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        if b > a:
            type_names, type_code = _first_order(types[a:b])
            for j, t in enumerate(type_names.tolist()):
                rows = a + np.flatnonzero(type_code == j)
                request_nodes[t] = (qid[rows], _features(rows, has_x, lengths, offsets, flat, request_id, t))
        e0, e1 = edge_bounds[i], edge_bounds[i + 1]
        request_edges: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]] = {}
        if e1 > e0:
            key_names, key_code = _first_order(keys[e0:e1])
            for j, key in enumerate(key_names.tolist()):
                rows = e0 + np.flatnonzero(key_code == j)
                request_edges[relations[key]] = (src[rows], dst[rows])
        out.append(TypedRequest(request_nodes, request_edges, request_id=request_id))
    return out


def _features(rows, has_x, lengths, offsets, flat, request_id: str, node_type: str) -> np.ndarray | None:
    """The [q, F] features of one request's queries of one type, None when none carries any."""
    present = has_x[rows]
    if not present.any():
        return None
    if not present.all():
        raise RequestError(
            f"request {request_id!r}: node type {node_type!r}: {int((~present).sum())} of its {len(rows)} node rows "
            "have a null x (a type's queries carry features all or none)"
        )
    widths = npsets.unique(lengths[rows])
    if len(widths) > 1:
        raise RequestError(
            f"request {request_id!r}: node type {node_type!r}: feature vectors of different lengths "
            f"{widths.tolist()} (a type's node rows of one request have one width)"
        )
    width = int(widths[0])
    if width == 0:
        return np.zeros((len(rows), 0), np.float32)
    starts = offsets[rows]
    return flat[starts[:, None] + np.arange(width)[None, :]]


__all__ = [
    "TYPED_SCHEMA",
    "parse_typed_request_bytes",
    "typed_requests_from_table",
    "typed_requests_table",
    "write_typed_requests",
]
