"""FULL equals PyG's forward on the whole union graph G + Q + request edges; NS is seeded and
equals FULL when no sampling happens (edge attributes included); the GCN degree trap is real
(subgraph degrees differ)."""

import numpy as np
import pytest
import torch
from serving_testkit import pyg_model

from sparkgnn.models import Model
from sparkgnn.serving import ModeError, QueryEngine, Request
from sparkgnn.serving.modes import BREAKDOWN_KEYS, MODES

KINDS = ["gcn", "sage", "gin", "gat"]


def union_forward(pyg, G, r: Request, kind: str) -> np.ndarray:
    """The reference: PyG's own module on the whole union graph, read at Q."""
    n = G.num_nodes
    order = np.argsort(r.qid)

    def union(ids):
        g, found = G.id_index.lookup(ids)
        return np.where(found, g, n + order[np.searchsorted(r.qid[order], ids).clip(0, len(order) - 1)])

    ei = torch.from_numpy(
        np.stack([np.concatenate([G.edge_src, union(r.src)]), np.concatenate([G.edge_dst, union(r.dst)])])
    )
    x = torch.from_numpy(np.concatenate([G.x, r.x]))
    kw = {}
    if G.weight is not None and kind == "gcn":
        kw["edge_weight"] = torch.from_numpy(np.concatenate([G.weight, np.ones(len(r.src), np.float32)]))
    with torch.no_grad():
        return pyg(x, ei, **kw)[n:].numpy()


def rel(a, b):
    return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("kind", KINDS + ["gatv2", "resgated", "le", "graphconv", "sage_project", "sgconv", "lgconv"])
@pytest.mark.parametrize("which", ["cora", "skewed"])
def test_full_equals_pyg_on_union_graph(which, kind, layers, request):
    wl = request.getfixturevalue(f"{which}_workload")
    G = wl.graph_G
    pyg = pyg_model(kind, G.feature_dim, layers, seed=layers)
    engine = QueryEngine(G, Model.from_pyg(pyg), mode="full")
    for r in wl.requests[::2]:
        a = engine.answer(r)
        ref = union_forward(pyg, G, r, kind)
        assert rel(a.h, ref) < 1e-5, (which, kind, layers, r.request_id)
        np.testing.assert_array_equal(a.qid, r.qid)
        np.testing.assert_array_equal(a.pred, ref.argmax(1))
        assert set(BREAKDOWN_KEYS) <= set(a.breakdown)
        assert a.breakdown["bytes_fetched"] == (a.breakdown["nodes_touched"] - r.batch_size) * G.feature_dim * 4


def test_subgraph_degrees_would_be_wrong_for_gcn(skewed_workload):
    """Why FULL takes degrees from the union graph: NS without sampling but with subgraph
    degrees (PyG NeighborLoader semantics) differs from the exact answer for GCN, not for SAGE."""
    wl = skewed_workload
    G, r = wl.graph_G, wl.requests[0]
    big = (10**6,) * 2
    for kind, differs in [("gcn", True), ("sage", False)]:
        model = Model.from_pyg(pyg_model(kind, G.feature_dim, 2))
        full = QueryEngine(G, model, mode="full").answer(r).h
        sub = QueryEngine(G, model, mode="ns", fanouts=big, ns_norm="sampled").answer(r).h
        assert (rel(sub, full) > 1e-3) == differs, kind


@pytest.mark.parametrize("kind", KINDS)
def test_ns_equals_full_without_sampling(skewed_workload, kind):
    wl = skewed_workload
    G = wl.graph_G
    max_in = int(np.bincount(G.edge_dst).max()) + max(r.num_edges for r in wl.requests)
    model = Model.from_pyg(pyg_model(kind, G.feature_dim, 3))
    full = QueryEngine(G, model, mode="full")
    ns = QueryEngine(G, model, mode="ns", fanouts=(max_in,) * 3)
    for r in wl.requests:
        assert rel(ns.answer(r).h, full.answer(r).h) < 1e-5


def test_ns_seeded_and_samples(skewed_workload):
    wl = skewed_workload
    G = wl.graph_G
    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2))
    a = QueryEngine(G, model, mode="ns", fanouts=(3, 2), seed=7)
    b = QueryEngine(G, model, mode="ns", fanouts=(3, 2), seed=7)
    c = QueryEngine(G, model, mode="ns", fanouts=(3, 2), seed=8)
    full = QueryEngine(G, model, mode="full")
    r = wl.requests[-1]
    ha, hb, hc = a.answer(r).h, b.answer(r).h, c.answer(r).h
    np.testing.assert_array_equal(ha, hb)
    np.testing.assert_array_equal(ha, a.answer(r).h)  # same request, same sample
    assert not np.array_equal(ha, hc)
    fa, ff = a.answer(r).breakdown, full.answer(r).breakdown
    assert fa["nodes_touched"] < ff["nodes_touched"] and fa["bytes_fetched"] < ff["bytes_fetched"]
    assert a.mode.fanouts == (3, 2) and QueryEngine(G, model, mode="ns").mode.fanouts == (25, 10)


def test_sampling_is_without_replacement_and_capped():
    from sparkgnn.serving.compgraph import sample_in_edges

    dst = np.repeat(np.arange(4), [1, 5, 30, 0][:4])
    src = np.arange(len(dst))
    s, d, _ = sample_in_edges(src, dst, None, 4, np.random.default_rng(0))
    counts = np.bincount(d, minlength=4)
    assert counts.tolist() == [1, 4, 4, 0]
    assert len(np.unique(s)) == len(s)


def test_registry_and_option_errors(cora_workload):
    G = cora_workload.graph_G
    model = Model.from_pyg(pyg_model("gcn", G.feature_dim, 2))
    assert {"full", "ns"} <= set(MODES)
    with pytest.raises(ModeError, match="unknown serving mode 'nope'"):
        QueryEngine(G, model, mode="nope")
    with pytest.raises(ModeError, match="does not take option"):
        QueryEngine(G, model, mode="full", gamma=0.1)
    with pytest.raises(ModeError, match="one positive fanout per layer"):
        QueryEngine(G, model, mode="ns", fanouts=(5,))


def test_invalid_request_is_refused_by_the_engine(cora_workload):
    from sparkgnn.serving import RequestError

    G = cora_workload.graph_G
    engine = QueryEngine(G, Model.from_pyg(pyg_model("gcn", G.feature_dim, 2)))
    with pytest.raises(RequestError, match="already vertex ids"):
        engine.answer(Request("bad", G.ids[:2], G.x[:2], [], []))


def test_request_without_edges_and_with_query_self_loops(skewed_workload):
    """Isolated queries (no request edge) and edges among queries only, incl. a q -> q loop."""
    wl = skewed_workload
    G = wl.graph_G
    pyg = pyg_model("gcn", G.feature_dim, 2)
    engine = QueryEngine(G, Model.from_pyg(pyg), mode="full")
    q = np.array([10**9, 10**9 + 1])
    x = np.random.default_rng(0).standard_normal((2, G.feature_dim)).astype(np.float32)
    for src, dst in [([], []), ([q[0], q[1]], [q[1], q[1]])]:
        r = Request("iso", q, x, src, dst)
        a = engine.answer(r)
        assert rel(a.h, union_forward(pyg, G, r, "gcn")) < 1e-5
        assert a.breakdown["bytes_fetched"] == 0 and a.breakdown["nodes_recomputed"] == 0


def test_engine_takes_the_graph_inputs_infer_takes(skewed_workload, spark, tmp_path):
    """A GraphData, a graph directory, a Spark Graph and a saved model directory give the same engine;
    the options after the model are keyword-only, and a graph of another type is refused."""
    from sparkgnn import QueryEngine as exported
    from sparkgnn.graph import Graph
    from sparkgnn.graph.writer import write_graph_dir
    from sparkgnn.serving.engine import EngineSetupError

    assert exported is QueryEngine
    wl = skewed_workload
    G = wl.graph_G
    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2))
    model.save(str(tmp_path / "model"))
    write_graph_dir(G, str(tmp_path / "g"))
    r = wl.requests[0]
    expected = QueryEngine(G, model, mode="full").answer(r).h
    for graph in (str(tmp_path / "g"), Graph.from_graph_data(spark, G)):
        engine = QueryEngine(graph, str(tmp_path / "model"), mode="full")
        assert engine.context.graph.fingerprint == G.fingerprint
        np.testing.assert_array_equal(engine.answer(r).h, expected)
    with pytest.raises(TypeError, match="positional"):
        QueryEngine(G, model, "full")
    with pytest.raises(EngineSetupError, match="cannot serve a dict: pass a GraphData"):
        QueryEngine({"x": G.x}, model)


@pytest.mark.parametrize("gat_first", [False, True])
def test_ns_carries_edge_attributes_and_equals_full_when_it_samples_every_in_edge(gat_first):
    import dataclasses

    from serving_testkit import skewed_graph
    from test_serving_reuse_modes import _attr_requests, _EdgeFeatureNet

    base = skewed_graph()
    rng = np.random.default_rng(1)
    G = dataclasses.replace(base, edge_attr=rng.normal(size=(base.num_edges, 3)).astype(np.float32))
    model = Model.from_pyg(_EdgeFeatureNet.build(G.feature_dim, 3, gat_first))
    full = QueryEngine(G, model, mode="full")
    every = int(np.bincount(G.edge_dst).max()) + 16  # above any in-degree, request edges included
    ns = QueryEngine(G, model, mode="ns", fanouts=(every, every), context=full.context)
    sampled = QueryEngine(G, model, mode="ns", fanouts=(2, 2), seed=3, context=full.context)
    for r in _attr_requests(G, 3, seed=2, into_g=True):
        assert rel(ns.answer(r).h, full.answer(r).h) < 1e-5, r.request_id
        # the sampled edges keep their own attributes: other request attributes, another answer
        moved = dataclasses.replace(r, edge_attr=r.edge_attr + 1.0)
        assert not np.allclose(sampled.answer(r).h, sampled.answer(moved).h)
