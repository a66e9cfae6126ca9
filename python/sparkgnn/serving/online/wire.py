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
        if len(req) > 1 and (np.diff(req) < 0).any():
            raise ValueError("the answer table's rows are not in request order (column req decreases)")
        self.count = int(count)
        self.bounds: list[int] = np.searchsorted(req, np.arange(count + 1)).tolist()
        self.body = table.drop_columns(["req"])  # what the ZeroMQ front sends, sliced per request
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(node ids, h [rows, d], pred or None) of the whole batch, read on first use (threads
        that race here read equal arrays; either result is kept)."""
        found = self._arrays
        if found is None:
            found = self._arrays = answer_arrays(self.body)
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
