"""Request: the unit a serving engine answers (query nodes Q that G has never seen, their
features, and the edges that attach them to G and to each other), plus its Parquet file format.

WHY validation lives here and not in the engine: a malformed request (a query id that already
names a vertex of G, an edge to a vertex that does not exist) would not crash the layers, it would
silently answer a different graph. Every problem is reported at once, with its count and the
first offenders, in the same style as the graph validators (sparkgnn.graph.problems).

WHY an edge must touch a query: an edge between two existing vertices changes G itself, i.e. the
stored embeddings of every mode that reuses them (HE, SRPE, EXACT) would be stale; that is a graph
update, not a query, and is refused. Request edges carry no weight; where G is weighted they
count with weight 1.0 (documented in ServingContext). Where G's edges carry attributes
(`edges/edge_attr`, width D), a request's edges may carry theirs (`edge_attr` [E, D], float32):
a model whose layers read edge attributes needs them (ServingContext.prepare refuses a request
without), and their width must be G's.

File format (one Parquet file per request or per batch of requests, one row per node OR edge):

    request_id : string    the request the row belongs to (requests keep their file order)
    kind       : string    "node" or "edge"
    node       : int64     node rows: the query id;               edge rows: null
    x          : list<float32>  node rows: the query's features;  edge rows: null
    src, dst   : int64     edge rows: endpoints (query or G ids); node rows: null
    edge_attr  : list<float32>  optional column (EDGE_ATTR_FIELD): edge rows: the edge's
                           attributes; node rows: null. Written only when a request has them.

One table (not a nodes file plus an edges file) so that a request is atomic on disk: a file
source (Spark Structured Streaming) that sees the file sees the whole request. A request with
nodes but no edges is legal (its queries are isolated); a request with no node is not.
"""

from __future__ import annotations

import errno
import os
import uuid
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkgnn import npsets
from sparkgnn.errors import SparkGNNError
from sparkgnn.graph.problems import MAX_EXAMPLES

KIND_NODE, KIND_EDGE = "node", "edge"
SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),
        ("kind", pa.string()),
        ("node", pa.int64()),
        ("x", pa.list_(pa.float32())),
        ("src", pa.int64()),
        ("dst", pa.int64()),
    ]
)


# The columns a typed request file adds (serving/typed_request.py): a homogeneous reader refuses
# such a file rather than answer its queries with their types dropped.
TYPED_COLUMNS = ("type", "relation")

# The optional edge attribute column (module doc): not part of SCHEMA, so files without it and
# the readers of the base schema stay as they are.
EDGE_ATTR_FIELD = pa.field("edge_attr", pa.list_(pa.float32()))


class RequestError(SparkGNNError, ValueError):
    """A serving request is malformed (duplicate or colliding query ids, unknown endpoints,
    wrong feature width, NaN/Inf, no query node) or a request file does not follow SCHEMA."""


def _examples(values, n: int = MAX_EXAMPLES) -> str:
    shown = ", ".join(str(v) for v in list(values[:n]))
    return shown + (", ..." if len(values) > n else "")


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _rows_and_values(rows: np.ndarray, values) -> str:
    """'row 3: 9223372036854775808, row 7: 1.5, ...' for the first offending rows."""
    plain = lambda v: v.item() if isinstance(v, np.generic) else v  # noqa: E731
    shown = [f"row {int(r)}: {plain(values[int(r)])!r}" for r in rows[:MAX_EXAMPLES]]
    return ", ".join(shown) + (", ..." if len(rows) > MAX_EXAMPLES else "")


def _bad_id_rows(arr: np.ndarray) -> np.ndarray | None:
    """Rows of `arr` (any dtype numpy made of the input) that are not integers in int64 range;
    None when the dtype is no number at all (strings, booleans)."""
    kind = arr.dtype.kind
    if kind == "i":
        return np.zeros(0, np.int64)
    if kind == "u":
        return np.flatnonzero(arr > INT64_MAX)
    if kind == "f":  # floats: integral, finite and in range (2**63 itself is out)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(arr) & (np.floor(arr) == arr) & (arr >= -(2.0**63)) & (arr < 2.0**63)
        return np.flatnonzero(~ok)
    if kind == "O":  # Python ints beyond 64 bits, or mixed objects

        def fits(v) -> bool:
            try:
                return int(v) == v and INT64_MIN <= int(v) <= INT64_MAX
            except (TypeError, ValueError, OverflowError):
                return False

        return np.flatnonzero([not fits(v) for v in arr])
    return None


def _id_array(values, field: str, request_id: str) -> np.ndarray:
    """`values` as a flat int64 array, or RequestError naming the field and the first rows that
    are not int64 ids. WHY not np.asarray(dtype=int64): it raises OverflowError for 2**63 from a
    list, wraps it around from uint64, and truncates 1.5 to 1, i.e. answers another query."""
    if isinstance(values, np.ndarray) and values.dtype.kind == "i":
        return np.ascontiguousarray(values, dtype=np.int64).reshape(-1)
    try:
        arr = np.asarray(values)
        if arr.dtype.kind == "f" and not isinstance(values, np.ndarray):
            arr = np.asarray(values, dtype=object)  # keep Python ints exact (-1, 2**63 -> float64)
    except (ValueError, TypeError) as exc:
        raise RequestError(
            f"request {request_id!r}: {field} must be a flat list of int64 ids ({' '.join(str(exc).split())})"
        ) from None
    arr = arr.reshape(-1)
    bad = _bad_id_rows(arr)
    if bad is None:
        raise RequestError(
            f"request {request_id!r}: {field} must hold int64 ids, got {arr.dtype} values (first: {_examples(arr)})"
        )
    if len(bad):
        raise RequestError(
            f"request {request_id!r}: {field}: {len(bad)} value(s) are not integer ids "
            f"in the int64 range [-2**63, 2**63-1]; first: {_rows_and_values(bad, arr)}"
        )
    return np.ascontiguousarray(
        arr.astype(np.int64) if arr.dtype != object else np.array([int(v) for v in arr], np.int64)
    )


def _width_text(width) -> str:
    return "a single number" if width is None else f"{width} value{'' if width == 1 else 's'}"


def _row_width(row):
    """Number of values in one feature row, None for a scalar (not a row)."""
    try:
        return len(row)
    except TypeError:
        return None


def _feature_matrix(values, request_id: str) -> np.ndarray:
    """`values` as a float32 array, or RequestError: ragged rows are named with their widths,
    non-numbers with numpy's reason (NaN/Inf are left to `problems`, so that a request file holding
    them becomes an error row under its request id, not a refused file)."""
    try:
        return np.ascontiguousarray(values, dtype=np.float32)
    except (ValueError, TypeError) as exc:
        reason = " ".join(str(exc).split())
    try:
        widths = [_row_width(row) for row in values]
    except TypeError:
        widths = []
    if widths and len(set(widths)) > 1:
        expected = widths[0]
        bad = np.flatnonzero([w != expected for w in widths])
        shown = ", ".join(f"row {int(r)} has {_width_text(widths[r])}" for r in bad[:MAX_EXAMPLES])
        raise RequestError(
            f"request {request_id!r}: x has rows of different widths (ragged "
            f"features): row 0 has {_width_text(expected)}, {len(bad)} rows differ; "
            f"first: {shown}{', ...' if len(bad) > MAX_EXAMPLES else ''}"
        )
    raise RequestError(f"request {request_id!r}: x must be a [B, F] matrix of numbers ({reason})")


@dataclass(eq=False)
class Request:
    """Q = qid (new ids), x[i] = features of qid[i]; edges src[j] -> dst[j] in ORIGINAL ids;
    edge_attr[j]: the attributes of edge j ([E, D] float32), or None (module doc)."""

    request_id: str
    qid: np.ndarray
    x: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    edge_attr: np.ndarray | None = None

    def __post_init__(self):
        """Coerce the fields to int64 ids and float32 features, refusing (RequestError naming the
        field and the first offending rows) what a cast would otherwise turn into a numpy
        traceback or, worse, silently into other values (ragged rows, ids beyond int64, 1.5)."""
        self.request_id = str(self.request_id)
        self.qid = _id_array(self.qid, "qid", self.request_id)
        self.x = _feature_matrix(self.x, self.request_id)
        if self.x.ndim == 1 and self.x.size == 0:
            self.x = self.x.reshape(0, 0)
        self.src = _id_array(self.src, "src", self.request_id)
        self.dst = _id_array(self.dst, "dst", self.request_id)
        if self.edge_attr is not None:
            try:
                attr = np.ascontiguousarray(self.edge_attr, dtype=np.float32)
            except (ValueError, TypeError) as exc:
                raise RequestError(
                    f"request {self.request_id!r}: edge_attr must be an [E, D] matrix of numbers "
                    f"({' '.join(str(exc).split())})"
                ) from None
            self.edge_attr = attr.reshape(-1, 1) if attr.ndim == 1 else attr

    @property
    def batch_size(self) -> int:
        return int(len(self.qid))

    @property
    def num_edges(self) -> int:
        return int(len(self.src))

    def problems(self, graph=None, feature_dim: int | None = None) -> list[str]:
        """Every defect as one sentence (count + first offenders); empty when valid. With `graph`
        (a GraphData) ids are checked against its id index and the width against its features."""
        out: list[str] = []
        if self.batch_size == 0:
            out.append("the request has no query node")
        if feature_dim is None and graph is not None:
            feature_dim = graph.feature_dim
        if self.x.ndim != 2 or self.x.shape[0] != self.batch_size:
            out.append(f"x has shape {self.x.shape}, expected [{self.batch_size}, F] (one row per qid)")
        elif feature_dim is not None and self.x.shape[1] != feature_dim and self.batch_size:
            out.append(f"x has width {self.x.shape[1]}, the graph's features have width {feature_dim}")
        elif self.x.size and not np.isfinite(self.x).all():
            bad = ~np.isfinite(self.x).all(axis=1)
            rows = np.flatnonzero(bad)
            out.append(
                f"x: {len(rows)} query nodes have NaN/Inf features; first: "
                f"{_examples(self.qid[rows])} (rows {_examples(rows)})"
            )
        if len(self.src) != len(self.dst):
            out.append(f"src has {len(self.src)} entries but dst has {len(self.dst)}")
            return out
        out += self._edge_attr_problems(graph)
        # sorted query ids: duplicates are neighbours, and an endpoint is a query when
        # searchsorted finds it (no np.unique/np.isin: their fixed cost dominates small requests)
        values = np.sort(self.qid) if len(self.qid) > 1 else self.qid
        repeated = values[1:] == values[:-1]
        if repeated.any():
            dup = npsets.unique(values[1:][repeated])
            out.append(f"{len(dup)} query ids appear more than once; first: {_examples(dup)}")
        m = len(self.src)
        in_g_src = in_g_dst = np.zeros(m, bool)
        if graph is not None:  # one lookup for every id the request names: queries, then sources, then targets
            _, found = graph.id_index.lookup(np.concatenate([self.qid, self.src, self.dst]))
            b = self.batch_size
            collide, in_g_src, in_g_dst = found[:b], found[b : b + m], found[b + m :]
            if collide.any():
                out.append(
                    f"{int(collide.sum())} query ids are already vertex ids of the graph; "
                    f"first: {_examples(self.qid[collide])}"
                )
        q_src, q_dst = _members(self.src, values), _members(self.dst, values)
        if graph is not None:
            unknown = ~((q_src | in_g_src) & (q_dst | in_g_dst))
            if unknown.any():
                ids = unknown_ids(self, q_src | in_g_src, q_dst | in_g_dst)
                out.append(
                    f"{int(unknown.sum())} edges name an id that is neither a query nor a "
                    f"vertex of the graph; first: {_examples(_fmt_edges(self, unknown))} "
                    f"({len(ids)} unknown ids; first: {_examples(ids)})"
                )
        no_query = ~(q_src | q_dst)
        if no_query.any():
            out.append(
                f"{int(no_query.sum())} edges touch no query node (an edge between existing "
                f"vertices is a graph update, not a query); first: "
                f"{_examples(_fmt_edges(self, no_query))}"
            )
        return out

    def _edge_attr_problems(self, graph) -> list[str]:
        """Shape, width (G's edge_attr width, with `graph`) and finiteness of edge_attr."""
        attr = self.edge_attr
        if attr is None:
            return []
        if attr.ndim != 2 or len(attr) != self.num_edges:
            return [f"edge_attr has shape {attr.shape}, expected [{self.num_edges}, D] (one row per edge)"]
        width = None if graph is None else int(getattr(graph, "edge_attr_dim", 0) or 0)
        if width == 0:
            return ["edges carry edge_attr, but the graph's edges carry none"]
        if width is not None and attr.shape[1] != width and self.num_edges:
            return [f"edge_attr has width {attr.shape[1]}, the graph's edge attributes have width {width}"]
        bad = ~np.isfinite(attr).all(axis=1)
        if bad.any():
            return [
                f"edge_attr: {int(bad.sum())} edges have NaN/Inf attributes; first: {_examples(_fmt_edges(self, bad))}"
            ]
        return []

    def validate(self, graph=None, feature_dim: int | None = None) -> Request:
        """Raise RequestError listing every problem; else self."""
        problems = self.problems(graph, feature_dim)
        if problems:
            raise RequestError(f"request {self.request_id!r} is invalid:\n  - " + "\n  - ".join(problems))
        return self


def _members(ids: np.ndarray, sorted_values: np.ndarray) -> np.ndarray:
    """Which of `ids` are in `sorted_values` (ascending): np.isin's answer without its setup."""
    if len(sorted_values) == 1:
        return ids == sorted_values[0]
    if not len(sorted_values):
        return np.zeros(len(ids), bool)
    pos = np.searchsorted(sorted_values, ids)
    return sorted_values[np.minimum(pos, len(sorted_values) - 1)] == ids


def unknown_ids(req: Request, src_known: np.ndarray, dst_known: np.ndarray) -> np.ndarray:
    """The distinct endpoint ids that are neither a query nor a vertex of G (sources first)."""
    ids = np.concatenate([req.src[~src_known], req.dst[~dst_known]])
    _, first = np.unique(ids, return_index=True)
    return ids[np.sort(first)]


def _fmt_edges(req: Request, mask: np.ndarray) -> list[str]:
    idx = np.flatnonzero(mask)[: MAX_EXAMPLES + 1]
    return [f"({req.src[i]} -> {req.dst[i]})" for i in idx]


# --- files -------------------------------------------------------------------------------------


def requests_table(requests) -> pa.Table:
    """Requests -> one Arrow table in SCHEMA (node rows of a request, then its edge rows)."""
    requests = list(requests)
    if not requests:
        raise RequestError("no requests to write")
    with_attr = any(r.edge_attr is not None for r in requests)
    parts = []
    for r in requests:  # per-request grouping; the rows themselves are built vectorised
        b, m = r.batch_size, r.num_edges
        n = b + m
        x_flat = r.x.reshape(-1)
        w = r.x.shape[1] if r.x.ndim == 2 else 0
        offsets = np.concatenate([np.arange(b + 1, dtype=np.int32) * w, np.full(m, b * w, dtype=np.int32)])
        mask = np.concatenate([np.zeros(b, bool), np.ones(m, bool)])
        x = pa.ListArray.from_arrays(pa.array(offsets), pa.array(x_flat, pa.float32()), mask=pa.array(mask))
        node_mask = np.concatenate([np.zeros(b, bool), np.ones(m, bool)])
        edge_mask = ~node_mask
        pad_q = np.concatenate([r.qid, np.zeros(m, np.int64)])
        pad_s = np.concatenate([np.zeros(b, np.int64), r.src])
        pad_d = np.concatenate([np.zeros(b, np.int64), r.dst])
        kind = pa.DictionaryArray.from_arrays(
            pa.array(node_mask.astype(np.int8)), pa.array([KIND_NODE, KIND_EDGE])
        ).cast(pa.string())
        part = pa.table(
            {
                "request_id": pa.array(np.full(n, r.request_id, dtype=object), pa.string()),
                "kind": kind,
                "node": pa.array(pad_q, mask=node_mask),
                "x": x,
                "src": pa.array(pad_s, mask=edge_mask),
                "dst": pa.array(pad_d, mask=edge_mask),
            },
            schema=SCHEMA,
        )
        if with_attr:
            part = part.append_column(EDGE_ATTR_FIELD, _edge_attr_column(r, b))
        parts.append(part)
    return pa.concat_tables(parts)


def _edge_attr_column(r: Request, b: int) -> pa.Array:
    """The request's edge_attr rows after its b node rows (null on node rows, and on every edge
    row of a request without attributes)."""
    m = r.num_edges
    attr = r.edge_attr if r.edge_attr is not None else np.zeros((m, 0), np.float32)
    w = attr.shape[1] if attr.ndim == 2 else 0
    offsets = np.concatenate([np.zeros(b, np.int64), np.arange(m + 1, dtype=np.int64) * w])
    valid = np.concatenate([np.zeros(b, bool), np.full(m, r.edge_attr is not None)])
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), pa.array(attr.reshape(-1), pa.float32()), mask=pa.array(~valid)
    )


def write_requests(path: str, requests) -> str:
    """Write requests as ONE Parquet file at `path` (a file name; its folder is created).
    Returns the path. Writing to a temp name and renaming makes the file appear atomically, so a
    streaming file source never reads half a batch. The temp name is hidden (a file source skips
    it), unique and created exclusively: in a drop folder other writers share, two writers never
    collide, and a link planted under a predictable name cannot redirect the write."""
    return write_request_table(path, requests_table(requests))


def write_request_table(path: str, table: pa.Table) -> str:
    """Write one request file's table to `path` atomically (write_requests; the typed request
    files of serving.typed_request too). Returns the path."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as sink:
            pq.write_table(table, sink)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise
    return path


def request_ids_and_kinds(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The request_id and kind columns of a request table as str arrays; RequestError when a row's
    kind is neither node nor edge (shared by the homogeneous and typed readers)."""
    rid = table.column("request_id").to_numpy(zero_copy_only=False).astype(str)
    kind = table.column("kind").to_numpy(zero_copy_only=False).astype(str)
    bad_kind = ~np.isin(kind, (KIND_NODE, KIND_EDGE))
    if bad_kind.any():
        raise RequestError(
            f"{int(bad_kind.sum())} rows have a kind not in {{node, edge}}; "
            f"first: {_examples(npsets.unique(kind[bad_kind]))}"
        )
    return rid, kind


def requests_from_table(table: pa.Table) -> list[Request]:
    """Arrow table in SCHEMA -> requests, in order of first appearance of each request_id."""
    missing = [f.name for f in SCHEMA if f.name not in table.column_names]
    if missing:
        raise RequestError(f"request file lacks column(s) {missing}; expected {SCHEMA.names}")
    rid, kind = request_ids_and_kinds(table)
    names, first, code = np.unique(rid, return_index=True, return_inverse=True)
    order_of_name = np.argsort(np.argsort(first, kind="stable"), kind="stable")
    code = order_of_name[code]  # request number in file order
    names = names[np.argsort(first, kind="stable")]
    is_node = kind == KIND_NODE

    node_rows = np.flatnonzero(is_node)
    node_rows = node_rows[np.argsort(code[node_rows], kind="stable")]
    nodes = table.take(pa.array(node_rows))
    qid = _non_null_int(nodes.column("node"), "node", "node rows")
    x_col = nodes.column("x").combine_chunks()
    if x_col.null_count:
        raise RequestError(f"{x_col.null_count} node rows have a null x")
    lengths = np.diff(x_col.offsets.to_numpy()) if len(x_col) else np.zeros(0, np.int64)
    flat = x_col.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)

    edge_rows = np.flatnonzero(~is_node)
    edge_rows = edge_rows[np.argsort(code[edge_rows], kind="stable")]
    edges = table.take(pa.array(edge_rows))
    src = _non_null_int(edges.column("src"), "src", "edge rows")
    dst = _non_null_int(edges.column("dst"), "dst", "edge rows")
    attr_col = edges.column("edge_attr").combine_chunks() if "edge_attr" in edges.column_names else None

    k = len(names)
    node_bounds = np.searchsorted(code[node_rows], np.arange(k + 1))
    edge_bounds = np.searchsorted(code[edge_rows], np.arange(k + 1))
    x_bounds = np.concatenate([[0], np.cumsum(lengths)])
    out = []
    for i in range(k):  # per-request grouping only
        a, b = node_bounds[i], node_bounds[i + 1]
        widths = npsets.unique(lengths[a:b])
        if len(widths) > 1:
            raise RequestError(
                f"request {str(names[i])!r}: feature vectors of different lengths {widths.tolist()} "
                f"(node rows of one request must have one width)"
            )
        w = int(widths[0]) if len(widths) else 0
        x = flat[x_bounds[a] : x_bounds[b]].reshape(b - a, w)
        e0, e1 = edge_bounds[i], edge_bounds[i + 1]
        attr = None if attr_col is None else edge_attr_rows(attr_col[e0:e1], str(names[i]))
        out.append(Request(names[i], qid[a:b], x, src[e0:e1], dst[e0:e1], attr))
    return out


def edge_attr_rows(column: pa.Array, request_id: str) -> np.ndarray | None:
    """One request's edge_attr rows as [E, D] float32; None when all are null (a request without
    attributes); a request whose edges carry them partly or of several widths is refused."""
    if column.null_count == len(column):
        return None
    if column.null_count:
        raise RequestError(
            f"request {request_id!r}: {column.null_count} of its {len(column)} edge rows have a null "
            "edge_attr (a request's edges carry attributes all or none)"
        )
    lengths = np.diff(column.offsets.to_numpy()) if len(column) else np.zeros(0, np.int64)
    widths = npsets.unique(lengths)
    if len(widths) > 1:
        raise RequestError(f"request {request_id!r}: edge_attr vectors of different lengths {widths.tolist()}")
    flat = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return flat.reshape(len(column), int(widths[0]) if len(widths) else 0)


def _non_null_int(column, name: str, rows: str) -> np.ndarray:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if arr.null_count:
        raise RequestError(f"{arr.null_count} {rows} have a null {name}")
    return arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def read_requests(path: str) -> list[Request]:
    """Read one request file, or every *.parquet file in a folder (sorted by name; hidden and
    temp files skipped), into requests in file order. Any unreadable file (empty, truncated, not
    Parquet, wrong schema, malformed rows) is a RequestError whose message starts with its path."""
    if os.path.isdir(path):
        files = sorted(f for f in os.listdir(path) if f.endswith(".parquet") and not f.startswith((".", "_")))
        out: list[Request] = []
        for f in files:
            out.extend(_read_file(os.path.join(path, f)))
        return out
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "no such request file or folder", path)
    return _read_file(path)


def _read_file(path: str) -> list[Request]:
    """One file's requests. The bytes are read first so that an OS error (permissions, a file that
    vanished) stays an OS error and only a failure to DECODE them reads as "not Parquet"."""
    with open(path, "rb") as fh:
        content = fh.read()
    return parse_request_bytes(content, path)


def request_file_table(
    content: bytes | None, name: str, schema: pa.Schema, what: str = "a request file", hint: str = ""
) -> pa.Table:
    """The Parquet table of one request file's bytes (`what`: how the refusals name the file's
    kind), holding every column of `schema`; RequestError, starting with `name`, when the file is
    empty, not (or truncated) Parquet, or lacks a column (`hint` precedes the columns it should
    have). Shared by the homogeneous and typed parsers, so both refuse in the same words."""
    if not content:
        raise RequestError(f"{name}: empty file (0 bytes); {what} is a Parquet file with columns {schema.names}")
    try:
        table = pq.read_table(pa.BufferReader(content))
    except Exception as exc:  # noqa: BLE001  (any failure to decode the bytes means: not Parquet)
        raise RequestError(
            f"{name}: not a readable Parquet file, truncated or of another format "
            f"({len(content)} bytes; {type(exc).__name__}: {_one_line(exc)})"
        ) from None
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise RequestError(f"{name}: lacks column(s) {missing}; {hint}{what} has {schema.names}")
    return table


def parse_request_bytes(content: bytes | None, name: str = "<bytes>") -> list[Request]:
    """The requests of one request file's bytes, in file order. RequestError, starting with
    `name`, says why the file is unusable: empty, not (or truncated) Parquet, a column of SCHEMA
    missing or of a type that cannot be cast, no row, or rows requests_from_table refuses.
    Shared by read_requests and the streaming intake, so both refuse the same files in the same
    words."""
    table = request_file_table(content, name, SCHEMA)
    typed = [c for c in TYPED_COLUMNS if c in table.column_names]
    if typed:
        raise RequestError(
            f"{name}: a typed request file (column(s) {typed}); the graph served here is homogeneous, "
            "its request files have no node types or relations"
        )
    if table.num_rows == 0:
        raise RequestError(f"{name}: no rows (a request file holds at least one request)")
    schema = pa.schema([*SCHEMA, EDGE_ATTR_FIELD]) if "edge_attr" in table.column_names else SCHEMA
    try:
        table = table.select(schema.names).cast(schema)
    except Exception as exc:  # noqa: BLE001  (ArrowInvalid / NotImplemented: types do not fit)
        have = {f.name: str(f.type) for f in table.schema if f.name in SCHEMA.names}
        raise RequestError(f"{name}: column types {have} do not fit the request schema ({_one_line(exc)})") from None
    try:
        return requests_from_table(table)
    except RequestError as exc:
        raise RequestError(f"{name}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 400 else text[:397] + "..."
