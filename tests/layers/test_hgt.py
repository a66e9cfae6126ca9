"""HGT's typed-round pieces (layers/hgt.py): relations' partial softmax states merged across
relations (in any order, or folded at once) equal one softmax over all of a node's in-edges,
whatever the partitioning of each relation's edges; rows without in-edges stay finite and merge
as nothing; the output op gates with the carried row; rounds mixing HGT relations with other
aggregations are refused."""

import pytest
import torch
from torch_geometric.utils import softmax

from sparkgnn.layers.base import propagate
from sparkgnn.layers.hetero import HeteroRound, RelationAggregator
from sparkgnn.layers.hgt import HGTOutputOp, HGTRelationLayer
from sparkgnn.layers.nodeops import build_node_op
from sparkgnn.layers.sage import SAGELayer

HEADS, F, IN = 2, 4, 4
FMIN = torch.finfo(torch.float32).min


def _layer(seed: int) -> HGTRelationLayer:
    layer = HGTRelationLayer(IN, F, HEADS)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return layer.requires_grad_(False)


def _reference(layers, x, edges, n):
    """One softmax over every relation's in-edges of each node, as PyG's HGTConv.message computes it,
    then the weighted value sum (heads concatenated) and the destination's own row."""
    logits, values, index = [], [], []
    for layer, (src, dst) in zip(layers, edges, strict=True):
        kv = layer._key_value(x[src])
        q = layer.prepare_dst(x[dst], {}).view(-1, HEADS, F // HEADS)
        k = kv[:, :F].view(-1, HEADS, F // HEADS)
        logits.append((q * k).sum(-1) * layer.p_rel / (F // HEADS) ** 0.5)
        values.append(kv[:, F:].view(-1, HEADS, F // HEADS))
        index.append(dst)
    index_all = torch.cat(index)
    alpha = softmax(torch.cat(logits), index_all, num_nodes=n)
    out = torch.zeros(n, HEADS, F // HEADS).index_add_(0, index_all, torch.cat(values) * alpha.unsqueeze(-1))
    return torch.cat([out.view(n, F), x], dim=1)


def test_relation_states_merged_in_any_order_or_folded_equal_one_softmax_over_all_in_edges():
    g = torch.Generator().manual_seed(0)
    n = 7
    x = torch.randn(n, IN, generator=g)
    edges = [  # node 6 has no in-edges at all, node 5 only in the third relation
        (torch.tensor([0, 1, 2, 2, 3]), torch.tensor([1, 1, 0, 0, 2])),  # a parallel edge
        (torch.tensor([4, 0, 3]), torch.tensor([3, 3, 3])),
        (torch.tensor([1, 2, 4, 5]), torch.tensor([5, 0, 4, 2])),
    ]
    layers = [_layer(i) for i in range(3)]
    states = [
        propagate(layer, x, src, dst, parts=3, seed=i, pre_transform=bool(i % 2))
        for i, (layer, (src, dst)) in enumerate(zip(layers, edges, strict=True))
    ]
    assert all(torch.isfinite(s).all() for s in states)  # no in-edges: the lowest float, not -inf
    assert all(s.shape == (n, 2 * HEADS + F + IN) for s in states)
    assert float(states[0][6, 0]) == FMIN
    want = _reference(layers, x, edges, n)
    agg = RelationAggregator("softmax", heads=HEADS, channels=F)
    for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        torch.testing.assert_close(agg.combine(states, order), want, rtol=1e-5, atol=1e-6)
    rows = torch.cat([states[2], states[0], states[1]])
    group = torch.arange(n).repeat(3)
    perm = torch.randperm(len(rows), generator=g)
    torch.testing.assert_close(agg.fold(rows[perm], group[perm], n), want, rtol=1e-5, atol=1e-6)
    assert torch.equal(agg.combine(states)[6], torch.cat([torch.zeros(F), x[6]]))


def test_output_op_applies_gelu_the_linear_map_and_the_skip_gate_and_rebuilds_from_config():
    op = HGTOutputOp(F, carry=F).requires_grad_(False)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in op.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    row = torch.randn(3, 2 * F, generator=g)
    a = torch.nn.functional.linear(torch.nn.functional.gelu(row[:, :F]), op.weight, op.bias)
    s = op.skip.sigmoid()
    torch.testing.assert_close(op(row), s * a + (1 - s) * row[:, F:])
    again = build_node_op(op.config()).requires_grad_(False)
    again.load_state_dict(op.state_dict())
    torch.testing.assert_close(again(row), op(row))
    assert op.out_dim(2 * F) == F and HGTOutputOp(F).out_dim(F) == F
    with pytest.raises(ValueError, match="hgt_output expects width 8, got 4"):
        op.out_dim(F)
    with pytest.raises(ValueError, match="carry 0 or channels"):
        HGTOutputOp(F, carry=3)


def test_rounds_mixing_hgt_relations_with_other_aggregations_are_refused():
    writes, cites = ("author", "writes", "paper"), ("paper", "cites", "paper")
    with pytest.raises(ValueError, match="their round's aggregation must be softmax"):
        HeteroRound(convs={writes: _layer(0)}, aggr="sum")
    with pytest.raises(ValueError, match="merges HGT relations only"):
        HeteroRound(convs={writes: _layer(0), cites: SAGELayer(IN, F)}, aggr="softmax")
    with pytest.raises(ValueError, match="different heads / widths"):
        HeteroRound(convs={writes: _layer(0), cites: HGTRelationLayer(IN, F, 1)}, aggr="softmax")
    rnd = HeteroRound(convs={writes: _layer(0), cites: _layer(1)}, aggr="softmax")
    assert rnd.out_dims({"author": IN, "paper": IN}) == {"paper": F + IN}  # before its output op
    assert HeteroRound(rnd.config()).relation_aggr.heads == HEADS
    with pytest.raises(ValueError, match="channels .6. must be divisible by heads .4."):
        HGTRelationLayer(IN, 6, 4)
