"""The typed PE refresh (pe/typed_refresh.py, through refresh_local): after a typed update that
inserts, deletes and re-featurises vertices of every type and inserts and deletes edges of every
relation, the refreshed typed store equals a fresh typed precompute of the updated graph (float32,
1e-5) at every round and node type, for to_hetero SAGE (sum, mean), a HeteroConv stack mixing
SAGE and GAT and HGT (a softmax across relations); a second refresh on top of the first too. A bad
update or an unrefreshable model is refused in one line, nothing written."""

import os
import sys

import numpy as np
import pytest
import torch
from torch_geometric.nn import GATConv, GCNConv, HeteroConv, Linear, SAGEConv

from sparkgnn.errors import GraphUpdateError, UnsupportedModelError
from sparkgnn.graph.updates import GraphUpdate, TypedGraphUpdate, apply_typed
from sparkgnn.models.hetero import HeteroModel
from sparkgnn.pe.local import precompute_local
from sparkgnn.pe.refresh import refresh_local
from sparkgnn.pe.typed import TypedPEStore

sys.path.insert(0, os.path.dirname(__file__))
from typed_testkit import (  # noqa: E402
    CITES,
    WRITES,
    hgt_module,
    pyg_data,
    ready,
    to_hetero_sage,
    typed_graph,
    typed_update,
)


class _Mixed(torch.nn.Module):
    """HeteroConv rounds mixing SAGE and GAT (GAT's self loops on the paper-paper relation)."""

    def __init__(self, metadata, conv_cls=None):
        super().__init__()
        self.lin = torch.nn.ModuleDict({t: Linear(-1, 8) for t in metadata[0]})

        def conv(i, e):
            if conv_cls is not None and e == CITES:
                return conv_cls(8, 8)
            return SAGEConv(8, 8) if i % 2 else GATConv(8, 8, heads=2, concat=False, add_self_loops=e[0] == e[2])

        self.convs = torch.nn.ModuleList(
            [HeteroConv({e: conv(i, e) for i, e in enumerate(metadata[1])}, aggr="sum") for _ in range(2)]
        )
        self.out = Linear(8, 2)

    def forward(self, x_dict, edge_index_dict):
        x_dict = {t: self.lin[t](x).relu() for t, x in x_dict.items()}
        for conv in self.convs:
            x_dict = {t: x.relu() for t, x in conv(x_dict, edge_index_dict).items()}
        return self.out(x_dict["paper"])


def _model(kind: str):
    d = pyg_data()
    if kind == "mixed":
        return HeteroModel.from_pyg(ready(_Mixed(d.metadata()), d), d.metadata())
    if kind == "hgt":
        return HeteroModel.from_pyg(hgt_module(d), d.metadata())
    return to_hetero_sage(d, layers=2, aggr=kind)[1]


def _second_update() -> TypedGraphUpdate:
    """On top of typed_update(): the inserted paper 100 deleted again, a feature update of a
    vertex the first update inserted, an edge between two old vertices."""
    return TypedGraphUpdate(
        {
            "paper": GraphUpdate(vertex_delete_ids=[100]),
            "author": GraphUpdate(feature_update_ids=[50], feature_update_x=np.ones((1, 4))),
        },
        {WRITES: GraphUpdate(edge_insert_src=[5], edge_insert_dst=[38])},
    )


def _assert_equal_stores(got: TypedPEStore, want: TypedPEStore, graph) -> None:
    assert got.num_layers == want.num_layers
    for layer in range(1, want.num_layers + 1):
        assert sorted(got.types(layer)) == sorted(want.types(layer))
        for t in want.types(layer):
            ids = graph.nodes[t].ids
            np.testing.assert_allclose(
                got.lookup(t, ids, layer), want.lookup(t, ids, layer), rtol=1e-5, atol=1e-5, err_msg=f"{t} {layer}"
            )


@pytest.mark.parametrize("kind", ["sum", "mean", "mixed", "hgt"])
def test_the_refreshed_store_equals_a_precompute_of_the_updated_graph(tmp_path, kind):
    graph, model = typed_graph(pyg_data()), _model(kind)
    old = precompute_local(graph, model, tmp_path / "store")
    store, report = refresh_local(graph, typed_update(), model, tmp_path / "store")
    updated = apply_typed(typed_update(), graph).graph
    assert isinstance(store, TypedPEStore) and report.graph_fingerprint == updated.fingerprint
    _assert_equal_stores(store, precompute_local(updated, model, tmp_path / "fresh"), updated)
    assert store.manifest["refresh"]["chain"] == [graph.fingerprint, updated.fingerprint]
    assert report.layers[0]["targets"]["paper"] < updated.nodes["paper"].num_nodes  # only what changed
    # the old version stays as it was, next to the new one
    again = TypedPEStore.open(tmp_path / "store", model=model, graph=graph)
    np.testing.assert_array_equal(again.lookup("paper", [3], 2), old.lookup("paper", [3], 2))
    # a second update on the refreshed store
    twice, _ = refresh_local(updated, _second_update(), model, tmp_path / "store", store=store)
    final = apply_typed(_second_update(), updated).graph
    _assert_equal_stores(twice, precompute_local(final, model, tmp_path / "fresh2"), final)
    assert twice.manifest["refresh"]["chain"][-1] == final.fingerprint


def _listing(root) -> list[str]:
    return sorted(os.path.join(path, n) for path, _, names in os.walk(root) for n in names)


def test_bad_updates_and_models_are_refused_in_one_line_with_nothing_written(tmp_path):
    graph, model = typed_graph(pyg_data()), _model("mean")
    precompute_local(graph, model, tmp_path / "store")
    before = _listing(tmp_path / "store")
    bad = TypedGraphUpdate(edges={CITES: GraphUpdate(edge_insert_src=[3], edge_insert_dst=[4])})
    with pytest.raises(GraphUpdateError) as info:
        refresh_local(graph, bad, model, tmp_path / "store", out_graph=tmp_path / "graph")
    assert "\n" not in str(info.value)
    assert (
        "relation paper__cites__paper: edge_insert: 1 edges have an endpoint that is neither a vertex of type 'paper'"
        in str(info.value)
    )
    assert _listing(tmp_path / "store") == before and not os.path.exists(tmp_path / "graph")
    d = pyg_data()
    gcn = HeteroModel.from_pyg(ready(_Mixed(d.metadata(), GCNConv), d), d.metadata())
    with pytest.raises(UnsupportedModelError, match=r"typed PE refresh: round 1, relation \('paper', 'cites', 'pap"):
        refresh_local(graph, typed_update(), gcn, tmp_path / "store")
    assert _listing(tmp_path / "store") == before
