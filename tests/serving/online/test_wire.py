"""The online wire's tables (serving/online/wire.py): requests cross as Arrow tables and come back
the same requests, edge attributes included (a column only when some request carries them)."""

import numpy as np
import pytest

from sparkgnn.serving.online.wire import (
    batch_tables,
    pack_answer,
    pack_request,
    request_from_tables,
    request_tables,
    requests_from_batch,
    unpack_answer,
    unpack_request,
)
from sparkgnn.serving.request import Request, RequestError


def _request(rid: str, edges: int, attr: bool) -> Request:
    rng = np.random.default_rng(len(rid) + edges)
    q = np.array([100, 101])
    src, dst = np.full(edges, 100), np.arange(edges)
    values = rng.normal(size=(edges, 3)).astype(np.float32) if attr else None
    return Request(rid, q, rng.normal(size=(2, 4)).astype(np.float32), src, dst, values)


def _same(a: Request, b: Request) -> None:
    assert a.request_id == b.request_id
    for name in ("qid", "x", "src", "dst"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    if a.num_edges == 0:  # no edge rows carry no attributes: back as None, which prepare() accepts
        assert b.edge_attr is None
        return
    assert (a.edge_attr is None) == (b.edge_attr is None)
    if a.edge_attr is not None:
        np.testing.assert_array_equal(a.edge_attr, b.edge_attr)


def test_requests_with_and_without_edge_attributes_cross_the_wire_unchanged():
    batch = [_request("a", 3, True), _request("bb", 2, False), _request("ccc", 0, True), _request("d", 4, True)]
    tables = batch_tables(batch)
    assert "edge_attr" in tables["edges"].column_names
    for want, got in zip(batch, requests_from_batch([r.request_id for r in batch], tables), strict=True):
        _same(want, got)
    assert "edge_attr" not in batch_tables([_request("bb", 2, False)])["edges"].column_names
    for r in batch:
        _same(r, request_from_tables(r.request_id, request_tables(r)))


def test_packed_requests_and_answers_come_back_equal_and_a_wrong_size_is_refused():
    for r in (_request("a", 3, True), _request("bb", 2, False), _request("ccc", 0, False)):
        counts, payload = pack_request(r)
        _same(r, unpack_request(r.request_id, counts, payload))
        with pytest.raises(RequestError, match="the packed payload holds"):
            unpack_request(r.request_id, counts, payload + b"\0" * 8)
    with pytest.raises(RequestError, match=r"packed.width must be an integer in \[0, 2\*\*40\]"):
        unpack_request("a", {"queries": 1, "edges": 0, "width": 2**60, "attr_width": 0}, b"")
    with pytest.raises(RequestError, match="must be an object"):
        unpack_request("a", [1, 2], b"")
    h = np.arange(6, dtype=np.float32).reshape(2, 3)
    for pred in (np.array([4, 5]), None):
        node, got_h, got_pred = unpack_answer(*pack_answer(np.array([7, 8]), h, pred))
        np.testing.assert_array_equal(node, [7, 8])
        np.testing.assert_array_equal(got_h, h)
        assert (got_pred is None) == (pred is None) and (pred is None or np.array_equal(got_pred, pred))


def test_a_request_whose_edges_carry_attributes_partly_is_refused():
    tables = request_tables(_request("a", 3, True))
    edges = tables["edges"]
    column = edges.column("edge_attr").to_pylist()
    import pyarrow as pa

    partly = edges.set_column(2, "edge_attr", pa.array([column[0], None, column[2]], pa.list_(pa.float32())))
    with pytest.raises(RequestError, match="1 of its 3 edge rows have a null edge_attr"):
        request_from_tables("a", {**tables, "edges": partly})
    with pytest.raises(RequestError, match="edges.edge_attr must be list<float32>, not int64"):
        request_from_tables("a", {**tables, "edges": edges.set_column(2, "edge_attr", pa.array([1, 2, 3]))})


def test_a_request_whose_edge_attr_is_not_one_row_per_edge_is_refused_in_one_line_when_packed():
    short = Request("short", [100], np.zeros((1, 4), np.float32), [100, 100], [0, 1], np.ones((1, 3), np.float32))
    pattern = r"request 'short': edge_attr has shape \(1, 3\), expected \[2, D\] \(one row per edge\)"
    with pytest.raises(RequestError, match=pattern):
        request_tables(short)
    with pytest.raises(RequestError, match=pattern):
        batch_tables([_request("a", 3, True), short])


def test_a_batchs_answers_are_cut_into_each_requests_rows_once():
    from sparkgnn.serving.online.wire import BatchAnswers, answer_arrays, answer_table

    h = np.arange(12, dtype=np.float32).reshape(4, 3)
    # request 0: rows 0-1, request 1: none (its error), request 2: rows 2-3
    table = answer_table(np.array([0, 0, 2, 2]), np.array([7, 8, 9, 10]), h, np.array([1, 0, 2, 1]))
    batch = BatchAnswers(table, 3)
    first, empty, last = (batch.rows(i) for i in range(3))
    nodes, rows, pred = last.arrays()
    np.testing.assert_array_equal(nodes, [9, 10])
    np.testing.assert_array_equal(rows, h[2:])
    np.testing.assert_array_equal(pred, [2, 1])
    assert len(first) == 2 and len(empty) == 0
    assert empty.arrays()[1].shape == (0, 0) and empty.arrays()[2] is None
    for got, want in zip(answer_arrays(first.table()), first.arrays(), strict=True):  # the ZeroMQ front's table
        np.testing.assert_array_equal(got, want)
    assert first.table().column_names == ["node", "h", "pred"]
    assert BatchAnswers(answer_table(np.array([0]), np.array([7]), h[:1], None), 1).rows(0).arrays()[2] is None
    with pytest.raises(IndexError, match="request 3 is not in this batch of 3"):
        batch.rows(3)
    with pytest.raises(ValueError, match="not in request order"):
        BatchAnswers(answer_table(np.array([1, 0]), np.array([7, 8]), h[:2], None), 2)


def test_a_batch_answered_in_process_keeps_its_arrays_and_builds_a_table_only_when_asked():
    from sparkgnn.serving.online.wire import BatchAnswers, answer_table

    h = np.arange(12, dtype=np.float32).reshape(4, 3)
    req, node, pred = np.array([0, 0, 2, 2]), np.array([7, 8, 9, 10]), np.array([1, 0, 2, 1])
    batch = BatchAnswers.from_arrays(req, node, h, pred, 3)
    assert batch._body is None and batch.rows(2).arrays()[1] is not None
    np.testing.assert_array_equal(batch.rows(2).arrays()[1], h[2:])
    assert batch._body is None  # numpy answers built no Arrow table
    assert batch.rows(0).table().equals(BatchAnswers(answer_table(req, node, h, pred), 3).rows(0).table())
    assert len(batch.rows(1)) == 0
    with pytest.raises(ValueError, match="not in request order"):
        BatchAnswers.from_arrays(np.array([1, 0]), node[:2], h[:2], None, 2)
