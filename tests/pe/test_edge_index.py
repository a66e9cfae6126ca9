"""EdgeIndex (pe/edge_index.py): advanced across updates of every kind (edge inserts into the tail,
deletes and vertex inserts / deletes remapping the base, a tail folded into the base), its in- and
out-edges of any rows equal a pass over every edge; and a layer planned through the index
(pe/refresh_kernel.plan_layer) is the plan of a pass over every edge, field by field, for convs
that refresh by delta, from scratch, and with a self-loop policy and weights."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_follow import updates_in_order  # noqa: E402
from test_refresh import graph, model_of  # noqa: E402, F401

from sparkgnn.graph.updates import GraphUpdate, apply  # noqa: E402
from sparkgnn.pe import edge_index  # noqa: E402
from sparkgnn.pe.edge_index import EdgeIndex  # noqa: E402
from sparkgnn.pe.refresh_kernel import Side, plan_layer  # noqa: E402


def assert_index_of(index: EdgeIndex, g, rng) -> None:
    assert (index.num_nodes, index.num_edges) == (g.num_nodes, g.num_edges)
    for size in (1, 7, g.num_nodes // 3):
        rows = rng.choice(g.num_nodes, size, replace=False)
        member = np.zeros(g.num_nodes, bool)
        member[rows] = True
        assert np.array_equal(index.out_edges(rows), np.flatnonzero(member[g.edge_src]))
        assert np.array_equal(index.in_edges(rows), np.flatnonzero(member[g.edge_dst]))
    assert len(index.in_edges(np.zeros(0, np.int64))) == 0


def inserts(g, rng, n: int) -> GraphUpdate:
    return GraphUpdate(
        edge_insert_src=rng.choice(g.ids, n),
        edge_insert_dst=rng.choice(g.ids, n),
        edge_insert_weight=np.ones(n, np.float32),
    )


def test_advanced_index_equals_a_pass_over_every_edge(graph, monkeypatch):  # noqa: F811
    monkeypatch.setattr(edge_index, "TAIL_MIN", 40)  # the third insert batch folds the tail into the base
    monkeypatch.setattr(edge_index, "TAIL_FRACTION", 0.001)
    rng = np.random.default_rng(0)
    g, index = graph, EdgeIndex.of(graph)
    assert_index_of(index, g, rng)
    steps = [inserts(g, rng, 15), inserts(g, rng, 15), *updates_in_order(g)]
    steps[3:3] = [inserts(g, rng, 30)]
    base_lens, edges = [], []
    for update in steps:
        applied = apply(update, g)
        index, g = index.advance(applied), applied.graph
        base_lens.append(index.base_len)
        edges.append(g.num_edges)
        assert_index_of(index, g, rng)
    assert base_lens[0] == base_lens[1] == graph.num_edges  # inserts went to the tail
    assert base_lens[2] == graph.num_edges < edges[2]  # a vertex insert remaps the base, its edges in the tail
    assert base_lens[3] == edges[3]  # 30 more inserts: the tail folded into the base
    with pytest.raises(ValueError, match="this index's has"):
        EdgeIndex.of(graph).advance(applied)
    with pytest.raises(ValueError, match="vertex rows must lie in"):
        index.out_edges(np.array([g.num_nodes]))


@pytest.mark.parametrize("kind", ["sage", "gcn", "sage_max"])
def test_plan_through_the_index_is_the_plan_over_every_edge(graph, kind):  # noqa: F811
    rng = np.random.default_rng(1)
    model = model_of(kind, graph.feature_dim, 2)
    conv = model.convs[0]
    g, index = graph, EdgeIndex.of(graph)
    for update in [inserts(g, rng, 20), *updates_in_order(g)[:2]]:
        applied = apply(update, g)
        new_index = index.advance(applied)
        changed = np.unique(rng.choice(applied.graph.num_nodes, 9))
        plans = [
            plan_layer(
                conv,
                Side.of(conv, g, None, index=old_i),
                Side.of(conv, applied.graph, None, index=new_i),
                applied,
                changed,
            )
            for old_i, new_i in ((None, None), (index, new_index))
        ]
        fields = ("targets", "scratch", "delta_targets", "scratch_edges", "added", "removed", "loops_new", "loops_old")
        for field in fields:
            want, got = getattr(plans[0], field), getattr(plans[1], field)
            pairs = zip(want, got, strict=True) if isinstance(want, tuple) else [(want, got)]
            for a, b in pairs:
                assert (a is None and b is None) or np.array_equal(a, b), (kind, field)
        if kind == "gcn":
            assert len(plans[1].loops_new[0]), "the case covers the self-loop policy's loops"
        g, index = applied.graph, new_index
