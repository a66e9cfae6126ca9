"""Request validation (every problem named with counts and examples) and the Parquet round trip."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkgnn.errors import SparkGNNError
from sparkgnn.graph import GraphData
from sparkgnn.serving.request import Request, RequestError, read_requests, write_requests


@pytest.fixture(scope="module")
def small_graph():
    ids = np.array([10, 20, 30, 40])
    return GraphData(ids, np.zeros((4, 3), np.float32), [0, 1, 2], [1, 2, 3])


def _req(**kw):
    base = dict(request_id="r", qid=[100, 101], x=np.ones((2, 3)), src=[100, 10], dst=[20, 101])
    base.update(kw)
    return Request(**base)


def test_valid_request_passes(small_graph):
    assert _req().validate(small_graph).batch_size == 2


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(qid=[100, 100, 101, 101, 102], x=np.ones((5, 3))), ["2 query ids appear more than once", "100, 101"]),
        (dict(qid=[10, 20, 101], x=np.ones((3, 3))), ["2 query ids are already vertex ids", "10, 20"]),
        (dict(src=[100, 7, 8, 9], dst=[20, 101, 101, 100]), ["3 edges name an id", "(7 -> 101)", "(9 -> 100)"]),
        (dict(x=np.ones((2, 4))), ["width 4", "width 3"]),
        (dict(x=np.array([[1, np.nan, 0], [0, 0, np.inf]])), ["2 query nodes have NaN/Inf", "100, 101"]),
        (dict(qid=[], x=np.zeros((0, 3)), src=[], dst=[]), ["no query node"]),
        (dict(src=[10, 100], dst=[20, 101]), ["1 edges touch no query node", "(10 -> 20)"]),
        (dict(src=[100], dst=[20, 101]), ["src has 1 entries but dst has 2"]),
    ],
)
def test_validation_errors_name_counts_and_examples(small_graph, kw, words):
    with pytest.raises(RequestError) as err:
        _req(**kw).validate(small_graph)
    assert isinstance(err.value, SparkGNNError)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_many_unknown_edges_are_truncated(small_graph):
    src = np.arange(1000, 1020)
    with pytest.raises(RequestError, match=r"20 edges name an id.*\(1000 -> 100\).*\.\.\.") as err:
        _req(src=src, dst=np.full(20, 100)).validate(small_graph)
    assert "(1019 -> 100)" not in str(err.value)


def test_round_trip_keeps_order_dtypes_and_empty_edges(tmp_path):
    rng = np.random.default_rng(0)
    reqs = [
        Request(
            f"req-{i}",
            rng.integers(1000, 2000, size=b),
            rng.standard_normal((b, 5)),
            rng.integers(0, 50, size=m),
            rng.integers(0, 50, size=m),
        )
        for i, (b, m) in enumerate([(3, 7), (1, 0), (4, 2)])
    ]
    reqs.reverse()  # file order, not name order, is kept
    path = write_requests(str(tmp_path / "batch.parquet"), reqs)
    back = read_requests(path)
    assert [r.request_id for r in back] == [r.request_id for r in reqs]
    for a, b in zip(back, reqs, strict=True):
        assert a.qid.dtype == np.int64 and a.x.dtype == np.float32 and a.src.dtype == np.int64
        np.testing.assert_array_equal(a.qid, b.qid)
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.src, b.src)
        np.testing.assert_array_equal(a.dst, b.dst)
    t = pq.read_table(path)
    assert set(t.column("kind").to_pylist()) == {"node", "edge"}
    write_requests(str(tmp_path / "more.parquet"), reqs[:1])
    assert len(read_requests(str(tmp_path))) == 4  # a folder reads every file, sorted by name


def test_a_link_planted_at_the_old_fixed_temp_name_is_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file")
    drop = tmp_path / "drop"
    drop.mkdir()
    (drop / ".batch.parquet.tmp").symlink_to(victim)  # the name the writer used to write through
    req = Request("r", np.array([1]), np.ones((1, 2)), np.zeros(0, np.int64), np.zeros(0, np.int64))
    write_requests(str(drop / "batch.parquet"), [req])
    assert victim.read_text() == "someone else's file"
    assert [r.request_id for r in read_requests(str(drop / "batch.parquet"))] == ["r"]
    assert sorted(p.name for p in drop.iterdir()) == [".batch.parquet.tmp", "batch.parquet"]  # no temp left


def test_bad_file_is_a_request_error(tmp_path):
    pq.write_table(pa.table({"request_id": ["a"], "kind": ["node"]}), tmp_path / "bad.parquet")
    with pytest.raises(RequestError, match="lacks column"):
        read_requests(str(tmp_path / "bad.parquet"))


def test_edge_attributes_are_checked_against_the_graph_and_kept_in_files(small_graph, tmp_path):
    import dataclasses

    with_attr = dataclasses.replace(small_graph, edge_attr=np.ones((3, 2), np.float32))
    assert _req(edge_attr=np.ones((2, 2))).validate(with_attr).edge_attr.dtype == np.float32
    cases = [
        (small_graph, np.ones((2, 2)), "edges carry edge_attr, but the graph's edges carry none"),
        (with_attr, np.ones((2, 3)), "edge_attr has width 3, the graph's edge attributes have width 2"),
        (with_attr, np.ones((1, 2)), "edge_attr has shape (1, 2), expected [2, D] (one row per edge)"),
        (with_attr, [[0.0, np.nan], [1.0, 1.0]], "edge_attr: 1 edges have NaN/Inf attributes; first: (100 -> 20)"),
    ]
    for graph, attr, words in cases:
        with pytest.raises(RequestError) as err:
            _req(edge_attr=attr).validate(graph)
        assert words in str(err.value), (words, str(err.value))
    reqs = [_req(request_id="a", edge_attr=[[1.0, 2.0], [3.0, 4.0]]), _req(request_id="b")]
    back = read_requests(write_requests(str(tmp_path / "r.parquet"), reqs))
    np.testing.assert_array_equal(back[0].edge_attr, np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    assert back[1].edge_attr is None
    assert read_requests(write_requests(str(tmp_path / "plain.parquet"), reqs[1:]))[0].edge_attr is None
