"""What crosses the wire in online serving: requests, batches and answers as Arrow tables.

WHY Arrow tables in the messenger's frames (not JSON, not pickle): a request carries B feature
rows and an answer B embedding rows; as Arrow they cross ZeroMQ as one buffer each, are read
zero-copy, and nothing from the network is ever unpickled or evaluated (the messenger's rule,
docs/ARCHITECTURE.md "The wire protocol"). The HTTP front end converts its JSON to the same
Request objects, so both protocols reach the same scheduler.

Tables (column names are the contract):
  client -> service   "nodes": node int64, x list<float32> (or fixed_size_list)
                      "edges": src int64, dst int64          (may be absent: isolated queries)
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
from sparkgnn.serving.request import Request, RequestError

META = "meta"


def request_tables(request: Request) -> dict[str, pa.Table]:
    """A Request as the tables a client sends."""
    return {
        "nodes": pa.table({"node": pa.array(request.qid, pa.int64()), "x": to_list(request.x)}),
        "edges": pa.table({"src": pa.array(request.src, pa.int64()), "dst": pa.array(request.dst, pa.int64())}),
    }


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
    return Request(request_id, qid, x, src, dst)


def batch_tables(requests: list[Request]) -> dict[str, pa.Table]:
    """Many requests as one worker call: the request's position in the batch is column `req`."""
    node_req = np.repeat(np.arange(len(requests), dtype=np.int32), [r.batch_size for r in requests])
    edge_req = np.repeat(np.arange(len(requests), dtype=np.int32), [r.num_edges for r in requests])
    width = max((r.x.shape[1] for r in requests if r.x.ndim == 2), default=0)
    x = np.concatenate([r.x.reshape(-1, width) for r in requests]) if requests else np.zeros((0, 0), np.float32)
    return {
        "nodes": pa.table(
            {
                "req": pa.array(node_req),
                "node": pa.array(np.concatenate([r.qid for r in requests]), pa.int64()),
                "x": to_list(x),
            }
        ),
        "edges": pa.table(
            {
                "req": pa.array(edge_req),
                "src": pa.array(np.concatenate([r.src for r in requests]), pa.int64()),
                "dst": pa.array(np.concatenate([r.dst for r in requests]), pa.int64()),
            }
        ),
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
        out.append(Request(rid, qid[a:b], x[a:b], src[c:d], dst[c:d]))
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


def split_answers(table: pa.Table, count: int) -> list[pa.Table]:
    """The worker's answer table cut into one table per request of the batch (without `req`)."""
    req = table.column("req").to_numpy()
    bounds = np.searchsorted(req, np.arange(count + 1))
    body = table.drop_columns(["req"])
    return [body.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i])) for i in range(count)]


def answer_arrays(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(node ids, h [B, d], pred or None) of one request's answer table."""
    pred = table.column("pred")
    return (
        table.column("node").to_numpy(),
        to_numpy_matrix(table.column("h")) if table.num_rows else np.zeros((0, 0), np.float32),
        None if pred.null_count == len(pred) else pred.to_numpy(),
    )
