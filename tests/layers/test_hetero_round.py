"""Typed rounds (layers/hetero.py): bipartite relations equal PyG's convs on (x_src, x_dst) under
any partitioning, the cross-relation merge is exact in any order, and what a relation between
two types cannot run is refused naming the relation."""

import pytest
import torch
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers.hetero import HeteroRound, RelationAggregator, edge_key, parse_edge_key
from sparkgnn.models.pyg_convs import conv_layer

WRITES = ("author", "writes", "paper")
CITES = ("paper", "cites", "paper")


def _graph():
    g = torch.Generator().manual_seed(3)
    x = {"author": torch.randn(7, 5, generator=g), "paper": torch.randn(6, 5, generator=g)}
    edges = {
        # a parallel edge (0 -> 1 twice); paper 5 and author 6 have no edges in this relation
        WRITES: torch.tensor([[0, 0, 1, 2, 3, 4, 5], [1, 1, 0, 2, 3, 4, 0]]),
        # a self loop (3 -> 3)
        CITES: torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 3, 0]]),
    }
    return x, edges


@pytest.mark.parametrize("aggr", ["sum", "mean", "max", "min"])
def test_relation_aggregator_merges_in_any_order(aggr):
    outs = [torch.randn(4, 3, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    agg = RelationAggregator(aggr)
    expected = {
        "sum": sum(outs),
        "mean": sum(outs) / 3,
        "max": torch.stack(outs).amax(0),
        "min": torch.stack(outs).amin(0),
    }
    for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        torch.testing.assert_close(agg.combine(outs, order), expected[aggr], rtol=1e-6, atol=1e-6)


def test_relation_aggregator_refuses_unknown_name():
    with pytest.raises(ValueError, match="cross-relation aggregation 'cat'"):
        RelationAggregator("cat")


@pytest.mark.parametrize("parts", [1, 3, 8])
def test_round_equals_pyg_per_relation_and_mean(parts):
    torch.manual_seed(0)
    x, edges = _graph()
    sage = SAGEConv((5, 5), 4, aggr="max").eval()  # bipartite: root weight on the papers
    gat = GATConv(5, 4, heads=1).eval()  # within one type: self loops are added
    rnd = HeteroRound(convs={WRITES: conv_layer(sage, "sage"), CITES: conv_layer(gat, "gat")}, aggr="mean")
    out = rnd(x, edges, parts=parts, seed=parts)
    ref = (sage((x["author"], x["paper"]), edges[WRITES]) + gat(x["paper"], edges[CITES])) / 2
    assert set(out) == {"paper"}
    torch.testing.assert_close(out["paper"], ref, rtol=1e-5, atol=1e-5)
    config = rnd.config()
    assert config["aggr"] == "mean" and set(config["convs"]) == {edge_key(WRITES), edge_key(CITES)}
    rebuilt = HeteroRound(config)
    rebuilt.load_state_dict(rnd.state_dict())
    torch.testing.assert_close(rebuilt(x, edges, parts=parts)["paper"], ref, rtol=1e-5, atol=1e-5)


def test_bipartite_relation_refuses_self_loops_and_statistics():
    gcn = conv_layer(GCNConv(5, 4), "gcn")
    with pytest.raises(UnsupportedModelError, match=r"relation \('author', 'writes', 'paper'\) \(gcn\): self loops"):
        HeteroRound(convs={WRITES: gcn})
    HeteroRound(convs={CITES: gcn})  # within one type GCN is a homogeneous layer


def test_edge_keys_round_trip_and_refuse_bad_names():
    assert parse_edge_key(edge_key(WRITES)) == WRITES
    with pytest.raises(ValueError, match="is not 'src__rel__dst'"):
        parse_edge_key("author__paper")
    with pytest.raises(ValueError, match="without '.' or '__'"):
        HeteroRound(convs={("a.b", "r", "a.b"): conv_layer(SAGEConv(5, 4), "sage")})
