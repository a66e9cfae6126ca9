"""engine.khop.upstream and collect_upstream against a breadth-first search in numpy over the
skewed graph's in-edges (duplicates, self loops, isolated vertices): every hop's set, its size and
its in-edge count; the collected frontier's edges whichever way its hops select them."""

import numpy as np
import pytest

from sparkgnn.engine import khop
from sparkgnn.engine.khop import collect_upstream, upstream


def _reference(src: np.ndarray, dst: np.ndarray, ids: np.ndarray, hops: int):
    sets, in_edges = [np.unique(ids)], []
    for _ in range(hops):
        incoming = np.isin(dst, sets[-1])
        in_edges.append(int(incoming.sum()))
        sets.append(np.union1d(sets[-1], src[incoming]))
    return sets, in_edges


def test_upstream_sets_equal_a_numpy_search(spark, graph_dirs):
    requested = 25
    _, data = graph_dirs["skewed"]
    rng = np.random.default_rng(requested)
    ids = rng.choice(data.ids, requested, replace=False)
    edges = spark.createDataFrame(
        [(int(s), int(d)) for s, d in zip(data.ids[data.edge_src], data.ids[data.edge_dst], strict=True)],
        "src long, dst long",
    )
    request = spark.createDataFrame([(int(i),) for i in np.concatenate([ids, ids[:1]])], "id long")  # a repeat
    frontier = upstream(request, edges, 3)
    sets, in_edges = _reference(data.ids[data.edge_src], data.ids[data.edge_dst], ids, 3)
    assert frontier.sizes == [len(s) for s in sets]
    assert frontier.in_edges == in_edges
    for got, expected in zip(frontier.sets, sets, strict=True):
        assert np.array_equal(np.sort(got.toArrow().column("id").to_numpy()), expected)
    assert frontier.sizes[0] == requested and frontier.sizes[-1] > frontier.sizes[1]
    frontier.unpersist()


def test_zero_hops_is_the_request(spark):
    request = spark.createDataFrame([(3,), (3,), (5,)], "id long")
    edges = spark.createDataFrame([(1, 3)], "src long, dst long")
    frontier = upstream(request, edges, 0)
    assert frontier.sizes == [2] and frontier.in_edges == []


@pytest.mark.parametrize("in_filter_ids", [khop.IN_FILTER_IDS, 0])  # an IN filter, or the ids broadcast
def test_collected_frontier_equals_a_numpy_search(spark, graph_dirs, monkeypatch, in_filter_ids):
    monkeypatch.setattr(khop, "IN_FILTER_IDS", in_filter_ids)
    _, data = graph_dirs["skewed"]
    ids = np.random.default_rng(5).choice(data.ids, 7, replace=False)
    src, dst = data.ids[data.edge_src], data.ids[data.edge_dst]
    edges = spark.createDataFrame(
        [(int(s), int(d), float(w)) for s, d, w in zip(src, dst, data.weight, strict=True)],
        "src long, dst long, weight float",
    )
    collected = collect_upstream(spark, ids, edges, 3, max_edges=len(src))
    sets, in_edges = _reference(src, dst, ids, 3)
    assert collected is not None and collected.sizes == [len(s) for s in sets] and collected.in_edges == in_edges
    for j, expected in enumerate(sets):
        assert np.array_equal(np.sort(collected.order[: collected.sizes[j]]), expected)
    rows = collected.edge_rows(3)  # the in-edges of D_2, as (src, dst, weight) rows of the graph
    keep = np.isin(dst, sets[2])
    got = sorted(zip(rows["src"].tolist(), rows["dst"].tolist(), rows["weight"].tolist(), strict=True))
    assert got == sorted(zip(src[keep].tolist(), dst[keep].tolist(), data.weight[keep].tolist(), strict=True))
    assert collect_upstream(spark, ids, edges, 3, max_edges=in_edges[-1] - 1) is None  # past the budget
