"""What crosses the wire in online serving: requests, batches and answers as Arrow tables.

WHY Arrow tables in the messenger's frames (not JSON, not pickle): a request carries B feature
rows and an answer B embedding rows; as Arrow they cross ZeroMQ as one buffer each, are read
zero-copy, and nothing from the network is ever unpickled or evaluated (the messenger's rule,
docs/ARCHITECTURE.md "The wire protocol"). The HTTP front end converts its JSON to the same
Request objects, so both protocols reach the same scheduler.

Tables (column names are the contract):
  client -> service   "nodes": node int64, x list<float32> (or fixed_size_list)
                      "edges": src int64, dst int64          (may be absent: isolated queries)
                               [edge_attr list<float32>: each edge's attributes, for a model
                               whose layers read them; null rows for a request without]
  service -> worker   the same two tables with a leading `req` int32 column: the request's
                      position in the batch (a batch is many requests, answered in one call)
  worker -> service   "answer": req int32, node int64, h list<float32>, pred int64 (nullable)
                      "meta": one JSON row: per-request errors, the mode's breakdown, cache stats
  service -> client   "answer" without `req`
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from sparkgnn.arrowvec import to_list, to_numpy_matrix
from sparkgnn.messenger import protocol
from sparkgnn.serving.request import EDGE_ATTR_FIELD, Request, RequestError, edge_attr_rows

META = "meta"


def request_tables(request: Request) -> dict[str, pa.Table]:
    """A Request as the tables a client sends."""
    edges = pa.table({"src": pa.array(request.src, pa.int64()), "dst": pa.array(request.dst, pa.int64())})
    if request.edge_attr is not None:
        edges = edges.append_column(EDGE_ATTR_FIELD, _attr_column([request]))
    return {
        "nodes": pa.table({"node": pa.array(request.qid, pa.int64()), "x": to_list(request.x)}),
        "edges": edges,
    }


def _attr_column(requests: list[Request]) -> pa.Array:
    """The edge_attr column of the requests' edges, in order: a request without attributes
    gives null rows (Request.validate and ServingContext.prepare judge each request). A request
    whose edge_attr is not one row per edge is refused (RequestError) before Arrow sees it."""
    for r in requests:
        if r.edge_attr is not None and (r.edge_attr.ndim != 2 or len(r.edge_attr) != r.num_edges):
            raise RequestError(
                f"request {r.request_id!r}: edge_attr has shape {r.edge_attr.shape}, "
                f"expected [{r.num_edges}, D] (one row per edge)"
            )
    rows = [r.edge_attr if r.edge_attr is not None else np.zeros((r.num_edges, 0), np.float32) for r in requests]
    lengths = np.concatenate(
        [np.full(r.num_edges, a.shape[1] if a.ndim == 2 else 0) for r, a in zip(requests, rows, strict=True)]
    )
    valid = np.concatenate([np.full(r.num_edges, r.edge_attr is not None) for r in requests])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = np.concatenate([a.reshape(-1) for a in rows]).astype(np.float32, copy=False)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.float32()), mask=pa.array(~valid))


def _attr_of(edges: pa.Table | None, start: int, stop: int, request_id: str) -> np.ndarray | None:
    """Edges start..stop's attribute rows (None: no edge_attr column, or all null)."""
    if edges is None or "edge_attr" not in edges.column_names:
        return None
    column = edges.column("edge_attr")
    if not (pa.types.is_list(column.type) and pa.types.is_floating(column.type.value_type)):
        raise RequestError(f"request {request_id!r}: edges.edge_attr must be list<float32>, not {column.type}")
    return edge_attr_rows(column.combine_chunks()[start:stop], request_id)


def _column(table: pa.Table, name: str, what: str) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise RequestError(f"{what} table has no column {name!r} (columns: {table.column_names})")
    return table.column(name)


def _ids(table: pa.Table, name: str, what: str) -> np.ndarray:
    column = _column(table, name, what)
    if column.null_count:
        raise RequestError(f"{what}.{name} has {column.null_count} null ids")
    if not pa.types.is_integer(column.type):
        raise RequestError(f"{what}.{name} must hold integer ids, not {column.type}")
    return column.to_numpy().astype(np.int64, copy=False)


def request_from_tables(request_id: str, tables: dict) -> Request:
    """The Request a client's tables describe; RequestError names a missing table or column,
    null ids, ragged or null feature rows (Request itself then refuses NaN, duplicates, ...)."""
    if "nodes" not in tables:
        raise RequestError(f"request {request_id!r} has no 'nodes' table (tables: {sorted(tables)})")
    nodes = tables["nodes"]
    qid = _ids(nodes, "node", "nodes")
    try:
        x = to_numpy_matrix(_column(nodes, "x", "nodes"))
    except (ValueError, TypeError) as exc:
        raise RequestError(f"request {request_id!r}: nodes.x is not a matrix of float vectors ({exc})") from None
    edges = tables.get("edges")
    if edges is None:
        src = dst = np.zeros(0, np.int64)
    else:
        src, dst = _ids(edges, "src", "edges"), _ids(edges, "dst", "edges")
    return Request(request_id, qid, x, src, dst, _attr_of(edges, 0, len(src), request_id))


def batch_tables(requests: list[Request]) -> dict[str, pa.Table]:
    """Many requests as one worker call: the request's position in the batch is column `req`."""
    node_req = np.repeat(np.arange(len(requests), dtype=np.int32), [r.batch_size for r in requests])
    edge_req = np.repeat(np.arange(len(requests), dtype=np.int32), [r.num_edges for r in requests])
    width = max((r.x.shape[1] for r in requests if r.x.ndim == 2), default=0)
    x = np.concatenate([r.x.reshape(-1, width) for r in requests]) if requests else np.zeros((0, 0), np.float32)
    edges = pa.table(
        {
            "req": pa.array(edge_req),
            "src": pa.array(np.concatenate([r.src for r in requests]), pa.int64()),
            "dst": pa.array(np.concatenate([r.dst for r in requests]), pa.int64()),
        }
    )
    if any(r.edge_attr is not None for r in requests):
        edges = edges.append_column(EDGE_ATTR_FIELD, _attr_column(requests))
    return {
        "nodes": pa.table(
            {
                "req": pa.array(node_req),
                "node": pa.array(np.concatenate([r.qid for r in requests]), pa.int64()),
                "x": to_list(x),
            }
        ),
        "edges": edges,
    }


def requests_from_batch(request_ids: list[str], tables: dict) -> list[Request]:
    """The inverse of batch_tables (on the worker)."""
    nodes, edges = tables["nodes"], tables["edges"]
    node_req = nodes.column("req").to_numpy()
    edge_req = edges.column("req").to_numpy()
    qid, x = nodes.column("node").to_numpy(), to_numpy_matrix(nodes.column("x"))
    src, dst = edges.column("src").to_numpy(), edges.column("dst").to_numpy()
    node_bounds = np.searchsorted(node_req, np.arange(len(request_ids) + 1))
    edge_bounds = np.searchsorted(edge_req, np.arange(len(request_ids) + 1))
    out = []
    for i, rid in enumerate(request_ids):
        a, b = node_bounds[i], node_bounds[i + 1]
        c, d = edge_bounds[i], edge_bounds[i + 1]
        out.append(Request(rid, qid[a:b], x[a:b], src[c:d], dst[c:d], _attr_of(edges, int(c), int(d), rid)))
    return out


def answer_table(req: np.ndarray, node: np.ndarray, h: np.ndarray, pred: np.ndarray | None) -> pa.Table:
    return pa.table(
        {
            "req": pa.array(req.astype(np.int32, copy=False)),
            "node": pa.array(node, pa.int64()),
            "h": to_list(h),
            "pred": pa.array(pred, pa.int64()) if pred is not None else pa.nulls(len(node), pa.int64()),
        }
    )


def client_answer_table(node: np.ndarray, h: np.ndarray, pred: np.ndarray | None) -> pa.Table:
    """One request's answer as the service sends it unpacked (node, h, pred; no `req`)."""
    return answer_table(np.zeros(len(node), np.int32), node, h, pred).drop_columns(["req"])


def meta_table(meta: dict) -> pa.Table:
    return pa.table({"v": pa.array([json.dumps(meta)])})


def read_meta(tables: dict) -> dict:
    return json.loads(tables[META].column("v")[0].as_py())


class BatchAnswers:
    """The worker's answer table of one batch and each request's rows in it (those whose `req` is
    i: the worker writes them in request order), read into numpy at most ONCE for all its requests
    (`arrays`: node ids, h [rows, d], pred or None when the model predicts no class).

    WHY once per batch: the HTTP front answers every request of the batch from these arrays by
    slicing (`rows(i).arrays()`: O(1), no Arrow conversion per request), so the per-request cost
    of an answer does not grow with the batch's size nor pay Arrow's per-call overhead. WHY on
    first use: a batch answered only over ZeroMQ sends Arrow slices (`rows(i).table()`) and never
    needs numpy."""

    def __init__(self, table: pa.Table, count: int):
        req = table.column("req").to_numpy()
        self._start(req, count)
        self._body: pa.Table | None = table.drop_columns(["req"])  # what the ZeroMQ front sends, sliced
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None

    @classmethod
    def from_arrays(
        cls, req: np.ndarray, node: np.ndarray, h: np.ndarray, pred: np.ndarray | None, count: int
    ) -> BatchAnswers:
        """The answers of a batch answered in this process, from its arrays (answer_table's
        columns): no Arrow table unless a ZeroMQ reply asks for one (`body`, built once)."""
        out = cls.__new__(cls)
        out._start(np.asarray(req), count)
        out._body = None
        out._arrays = (node, h, pred)
        return out

    def _start(self, req: np.ndarray, count: int) -> None:
        if len(req) > 1 and (np.diff(req) < 0).any():
            raise ValueError("the answer table's rows are not in request order (column req decreases)")
        self.req = req
        self.count = int(count)
        self.bounds: list[int] = np.searchsorted(req, np.arange(count + 1)).tolist()

    @property
    def body(self) -> pa.Table:
        """The batch's answer table without `req` (node, h, pred), what the ZeroMQ front sends
        sliced per request; built from the arrays on first use where the batch came as arrays."""
        found = self._body
        if found is None:
            node, h, pred = self.arrays()
            found = self._body = answer_table(self.req, node, h, pred).drop_columns(["req"])
        return found

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(node ids, h [rows, d], pred or None) of the whole batch, read on first use (threads
        that race here read equal arrays; either result is kept)."""
        found = self._arrays
        if found is None:
            assert self._body is not None  # a batch built from arrays has them from the start
            found = self._arrays = answer_arrays(self._body)
        return found

    def rows(self, i: int) -> AnswerRows:
        """Request i's rows (0 <= i < count)."""
        if not 0 <= i < self.count:
            raise IndexError(f"request {i} is not in this batch of {self.count}")
        return AnswerRows(self, self.bounds[i], self.bounds[i + 1])


class AnswerRows:
    """One request's answer: rows start..stop of its batch's BatchAnswers. `arrays()` are numpy
    views of the batch's arrays (read them, do not write them: they are shared with the batch's
    other requests); `table()` is the Arrow table the ZeroMQ front sends (a zero-copy slice)."""

    __slots__ = ("batch", "start", "stop")

    def __init__(self, batch: BatchAnswers, start: int, stop: int):
        self.batch, self.start, self.stop = batch, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(node ids, h [B, d], pred or None) of this request, as answer_arrays gives them."""
        node, h, pred = self.batch.arrays()
        s, e = self.start, self.stop
        if s == e:
            return node[s:e], np.zeros((0, 0), np.float32), None
        return node[s:e], h[s:e], None if pred is None else pred[s:e]

    def table(self) -> pa.Table:
        """This request's answer table (node, h, pred), a slice of the batch's."""
        return self.batch.body.slice(self.start, self.stop - self.start)


def answer_arrays(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(node ids, h [B, d], pred or None) of one request's answer table."""
    pred = table.column("pred")
    return (
        table.column("node").to_numpy(),
        to_numpy_matrix(table.column("h")) if table.num_rows else np.zeros((0, 0), np.float32),
        None if pred.null_count == len(pred) else pred.to_numpy(),
    )


# -- the packed layout: one request or answer as ONE contiguous buffer -----------------------------
#
# WHY a second layout beside the Arrow tables: a single-query request is a few hundred bytes, and
# reading two Arrow IPC streams (schemas, validation, list offsets) and converting them back to
# numpy costs the service more CPU than answering the request. Packed, the arrays lie end to end
# at offsets the header's `packed` field fixes (counts only, each bounded), so the service checks
# one size, hashes the frame as the messenger does, and takes numpy views: no per-request Arrow
# framing, nothing unpickled or evaluated. Clients and the front processes send this layout; the
# Arrow tables stay accepted. An answer to a packed request is packed the same way.
#
#   request  packed = {"queries": B, "edges": E, "width": F, "attr_width": D}
#            bytes  = qid int64[B] | src int64[E] | dst int64[E] | x float32[B*F] | edge_attr float32[E*D]
#            (D = 0: no edge attributes)
#   answer   packed = {"rows": R, "width": W, "pred": bool}
#            bytes  = node int64[R] | h float32[R*W] | pred int64[R] (when pred)

PACKED = "packed"  # the header field that marks a packed message and gives its counts
REQUEST_COUNTS = ("queries", "edges", "width", "attr_width")
ANSWER_COUNTS = ("rows", "width")
MAX_PACKED_COUNT = 2**40  # any count past this is refused before it is multiplied


def _counts(packed: object, names: tuple[str, ...], what: str) -> list[int]:
    """The named non-negative integer counts of a `packed` header field (RequestError otherwise)."""
    if not isinstance(packed, dict):
        raise RequestError(f"{what}: header {PACKED!r} must be an object, got {type(packed).__name__}")
    out = []
    for name in names:
        value = packed.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PACKED_COUNT:
            raise RequestError(f"{what}: {PACKED}.{name} must be an integer in [0, 2**40], got {value!r}")
        out.append(value)
    return out


def pack_request(request: Request) -> tuple[dict, bytes]:
    """A Request as (the header's `packed` field, its one payload buffer): layout above."""
    b, e = request.batch_size, request.num_edges
    width = int(request.x.shape[1]) if request.x.ndim == 2 else 0
    attr = request.edge_attr
    attr_width = int(attr.shape[1]) if attr is not None and attr.ndim == 2 and len(attr) == e else 0
    if attr is not None and attr_width == 0 and e and attr.size:
        raise RequestError(
            f"request {request.request_id!r}: edge_attr has shape {attr.shape}, expected [{e}, D] (one row per edge)"
        )
    if request.x.size != b * width:
        raise RequestError(f"request {request.request_id!r}: x has shape {request.x.shape}, expected [{b}, F]")
    parts = [request.qid, request.src, request.dst, request.x]
    if attr is not None and attr_width:
        parts.append(attr)
    payload = b"".join(np.ascontiguousarray(p).tobytes() for p in parts)
    return {"queries": b, "edges": e, "width": width, "attr_width": attr_width}, payload


def unpack_request(request_id: str, packed: object, payload) -> Request:
    """The Request a packed payload holds (numpy views of it, read-only); RequestError when the
    counts are malformed or the payload is not exactly their size."""
    b, e, width, attr_width = _counts(packed, REQUEST_COUNTS, f"request {request_id!r}")
    sizes = (8 * b, 8 * e, 8 * e, 4 * b * width, 4 * e * attr_width)
    view = memoryview(payload).cast("B")
    if len(view) != sum(sizes):
        raise RequestError(
            f"request {request_id!r}: the packed payload holds {len(view)} bytes; its counts {packed} need {sum(sizes)}"
        )
    bounds = np.cumsum((0, *sizes)).tolist()
    qid, src, dst = (np.frombuffer(view[bounds[i] : bounds[i + 1]], np.int64) for i in range(3))
    x = np.frombuffer(view[bounds[3] : bounds[4]], np.float32).reshape(b, width)
    attr = np.frombuffer(view[bounds[4] : bounds[5]], np.float32).reshape(e, attr_width) if attr_width else None
    return Request(request_id, qid, x, src, dst, attr)


def pack_answer(node: np.ndarray, h: np.ndarray, pred: np.ndarray | None) -> tuple[dict, bytes]:
    """One request's answer arrays as (the header's `packed` field, its one payload buffer)."""
    rows = len(node)
    width = int(h.shape[1]) if h.ndim == 2 and rows else 0
    parts = [np.asarray(node, np.int64), np.asarray(h, np.float32)]
    if pred is not None:
        parts.append(np.asarray(pred, np.int64))
    payload = b"".join(np.ascontiguousarray(p).tobytes() for p in parts)
    return {"rows": rows, "width": width, "pred": pred is not None}, payload


def unpack_answer(packed: object, payload) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(node ids, h [R, W], pred or None) of a packed answer, as answer_arrays gives them;
    RequestError when the counts are malformed or the payload is not exactly their size."""
    rows, width = _counts(packed, ANSWER_COUNTS, "answer")
    has_pred = bool(packed.get("pred")) if isinstance(packed, dict) else False
    sizes = (8 * rows, 4 * rows * width, 8 * rows if has_pred else 0)
    view = memoryview(payload).cast("B")
    if len(view) != sum(sizes):
        raise RequestError(f"answer: the packed payload holds {len(view)} bytes; its counts {packed} need {sum(sizes)}")
    node = np.frombuffer(view[: sizes[0]], np.int64)
    h = np.frombuffer(view[sizes[0] : sizes[0] + sizes[1]], np.float32).reshape(rows, width)
    if not rows:
        h = np.zeros((0, 0), np.float32)
    pred = np.frombuffer(view[sizes[0] + sizes[1] :], np.int64) if has_pred else None
    return node, h, pred


def packed_frames(header: dict, kind: str, packed: dict, payload: bytes) -> list:
    """The messenger frames of a packed message: the header (stamped by protocol.stamp: no tables,
    the payload's hash) with its `packed` counts, then the payload as one frame."""
    stamped = protocol.stamp({**header, PACKED: packed}, kind, {}, [payload])
    return [protocol.encode_header(stamped), payload]


def packed_payload(header: dict, payload_frames: list) -> pa.Buffer:
    """The one payload frame of a packed message whose header is already read, checked against the
    header's hash (protocol.ProtocolError) and frame count (RequestError)."""
    if len(payload_frames) != 1 or header.get("tables"):
        raise RequestError(
            f"a packed message is its header and ONE payload frame with no tables, got {len(payload_frames)} "
            f"payload frame(s) and tables {header.get('tables')!r}"
        )
    buffer = protocol.frame_buffer(payload_frames[0])
    protocol.check_payload_hash(header, [buffer])
    return buffer
