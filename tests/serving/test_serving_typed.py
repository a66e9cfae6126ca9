"""Typed serving (serving/typed.py): FULL equals PyG's forward of the to_hetero model on G plus
the typed queries and request edges; EXACT, from the typed PE store, equals FULL and recomputes
only the vertices the request changed; malformed requests, a missing or foreign store and
relations typed serving cannot answer are refused in one line."""

import os
import re
import sys

import numpy as np
import pytest
import torch
from torch_geometric.nn import GCNConv, HeteroConv

from sparkgnn.errors import SparkGNNError, StalePEStore, UnsupportedModelError
from sparkgnn.models.hetero import HeteroModel
from sparkgnn.pe.local import precompute_local
from sparkgnn.serving.typed import TypedQueryEngine, TypedRequest, TypedRequestError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pe"))
from typed_testkit import IDS, hgt_module, pyg_data, ready, to_hetero_sage, typed_graph  # noqa: E402

WRITES, WRITTEN_BY, CITES, TOPIC = (
    ("author", "writes", "paper"),
    ("paper", "written_by", "author"),
    ("paper", "cites", "paper"),
    ("paper", "has_topic", "field"),
)
P = IDS["paper"]


def _request():
    """Papers 1000, 1001 and author 100 (queries); G's paper row 2 gets an edge from a query and
    feeds query 1001, so EXACT must recompute it."""
    g = torch.Generator().manual_seed(3)
    x_paper, x_author = torch.randn(2, 6, generator=g), torch.randn(1, 4, generator=g)
    edges = {  # (ids in the request, union rows for PyG: queries after G's rows)
        WRITES: (([100, 2], [1000, 1001]), ([6, 2], [8, 9])),
        WRITTEN_BY: (([1000], [100]), ([8], [6])),
        CITES: (([1000, P[3], 1001, P[2]], [P[2], 1001, 1000, 1001]), ([8, 3, 9, 2], [2, 9, 8, 9])),
        TOPIC: (([1001], [3]), ([9], [3])),
    }
    request = TypedRequest(
        nodes={"paper": ([1000, 1001], x_paper.numpy()), "author": ([100], x_author.numpy())},
        edges={et: ids for et, (ids, _) in edges.items()},
    )
    union = pyg_data()
    union["paper"].x = torch.cat([union["paper"].x, x_paper])
    union["author"].x = torch.cat([union["author"].x, x_author])
    for et, (_, rows) in edges.items():
        union[et].edge_index = torch.cat([union[et].edge_index, torch.tensor(rows)], 1)
    return request, union


def test_full_equals_pyg_on_the_union_graph_and_exact_equals_full(tmp_path):
    d = pyg_data()
    graph = typed_graph(d)
    module, model = to_hetero_sage(d, layers=2, aggr="mean")
    store = precompute_local(graph, model, tmp_path / "store")
    request, union = _request()
    with torch.no_grad():
        reference = module(union.x_dict, union.edge_index_dict)
    full = TypedQueryEngine(graph, model, mode="full").answer(request)
    exact = TypedQueryEngine(graph, model, mode="exact", store=store).answer(request)
    assert sorted(full.h) == ["author", "paper"]
    assert model.output == "logits" and all(torch.equal(full.pred[t], full.h[t].argmax(-1)) for t in full.h)
    np.testing.assert_allclose(full.h["paper"].numpy(), reference["paper"][8:].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(full.h["author"].numpy(), reference["author"][6:].numpy(), rtol=1e-5, atol=1e-5)
    for t in full.h:
        np.testing.assert_allclose(exact.h[t].numpy(), full.h[t].numpy(), rtol=1e-5, atol=1e-5)
    # EXACT recomputes paper row 2 only (round 1); FULL every vertex of G the answer reads
    assert exact.breakdown["nodes_recomputed"] == 1 < full.breakdown["nodes_recomputed"]


def test_hgt_full_equals_pyg_on_the_union_graph_and_exact_and_the_store_equal_it(tmp_path):
    # HGT's softmax spans every relation into a type: the local rounds merge the relations'
    # partial softmax states per node, over G's in-edges and the request's
    d = pyg_data()
    graph = typed_graph(d)
    module = hgt_module(d)
    model = HeteroModel.from_pyg(module, d.metadata())
    store = precompute_local(graph, model, tmp_path / "store")
    with torch.no_grad():
        on_g = module(d.x_dict, d.edge_index_dict)
    for t, ref in on_g.items():
        np.testing.assert_allclose(store.lookup(t, graph.nodes[t].ids, 2), ref.numpy(), rtol=1e-5, atol=1e-5)
    request, union = _request()
    with torch.no_grad():
        reference = module(union.x_dict, union.edge_index_dict)
    full = TypedQueryEngine(graph, model, mode="full").answer(request)
    exact = TypedQueryEngine(graph, model, mode="exact", store=store).answer(request)
    assert sorted(full.h) == ["author", "paper"]
    np.testing.assert_allclose(full.h["paper"].numpy(), reference["paper"][8:].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(full.h["author"].numpy(), reference["author"][6:].numpy(), rtol=1e-5, atol=1e-5)
    for t in full.h:
        np.testing.assert_allclose(exact.h[t].numpy(), full.h[t].numpy(), rtol=1e-5, atol=1e-5)
    assert exact.breakdown["nodes_recomputed"] < full.breakdown["nodes_recomputed"]


def test_bad_requests_stores_and_relations_are_refused_in_one_line(tmp_path):
    d = pyg_data()
    graph = typed_graph(d)
    _, model = to_hetero_sage(d, layers=1)
    engine = TypedQueryEngine(graph, model)
    x = np.zeros((1, 6), np.float32)
    for request, message in (
        (TypedRequest({"venue": ([1], None)}), r"node type 'venue' is unknown \(node types: paper, author, field\)"),
        (TypedRequest({"paper": ([P[0]], x)}), r"node type 'paper': query ids \[3\] name vertices of G"),
        (TypedRequest({"paper": ([1], np.zeros((1, 5)))}), r"x has shape \(1, 5\), expected \[1, 6\]"),
        (TypedRequest({"field": ([9], np.ones((1, 1)))}), "node type 'field' has no features in G"),
        (TypedRequest({"paper": ([1], x)}, {(("paper", "likes", "paper")): ([1], [P[0]])}), "relation .* is unknown"),
        (TypedRequest({"paper": ([1], x)}, {CITES: ([P[0]], [P[1]])}), "edges between two vertices of G"),
        (TypedRequest({"paper": ([1], x)}, {CITES: ([1], [77])}), r"endpoints \[77\] are neither queries nor"),
    ):
        with pytest.raises(TypedRequestError) as info:
            engine.answer(request)
        assert "\n" not in str(info.value)
        assert re.search(message, str(info.value)), str(info.value)
    with pytest.raises(SparkGNNError, match="mode 'exact' reuses a typed PE store: pass store="):
        TypedQueryEngine(graph, model, mode="exact")
    _, other = to_hetero_sage(d, layers=2)
    foreign = precompute_local(graph, other, tmp_path / "store")
    with pytest.raises(StalePEStore, match="does not belong to this engine: its model fingerprint differs"):
        TypedQueryEngine(graph, model, mode="exact", store=foreign)
    gcn = ready(_Gcn(d.metadata()), d)
    with pytest.raises(UnsupportedModelError, match=r"relation \('paper', 'cites', 'paper'\) \(gcn\) needs node stat"):
        TypedQueryEngine(graph, HeteroModel.from_pyg(gcn, d.metadata()))


class _Gcn(torch.nn.Module):
    """HeteroConv: GCN on the paper-paper relation (degrees), SAGE elsewhere."""

    def __init__(self, metadata):
        super().__init__()
        from torch_geometric.nn import Linear, SAGEConv

        self.lin = torch.nn.ModuleDict({t: Linear(-1, 4) for t in metadata[0]})
        self.conv = HeteroConv({e: GCNConv(4, 4) if e == CITES else SAGEConv(4, 4) for e in metadata[1]})

    def forward(self, x_dict, edge_index_dict):
        return self.conv({t: self.lin[t](x) for t, x in x_dict.items()}, edge_index_dict)["paper"]
