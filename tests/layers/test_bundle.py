"""Model batching at the layer level (layers/bundle.py, models/batching.py): the batched model's
decomposed forward equals each model alone, for every layer type, partition counts 1, 3, 8 and
both modes; shared payloads and aggregations are really shared; the concat aggregator is exact."""

import pytest
import torch
import torch_geometric.nn as gnn
import torch_geometric.nn.aggr as A
import torch_test_graphs as graphs

from sparkgnn.layers import BundleConv, ConcatAggregator, get_aggregator
from sparkgnn.layers.bundle import share_ids
from sparkgnn.models import Model
from sparkgnn.models.batching import batch_models

TOL = 1e-5
F = 24  # the synthetic graph's feature width


def _model(build, seed):
    torch.manual_seed(seed)
    return Model.from_pyg(graphs.randomize(build(), seed))


# Models that can share an edge list, by mix: no self loops (SAGE of every aggregator, GIN),
# GCN's add_remaining_self_loops, GAT's replaced self loops.
MIXES = {
    "sage_gin": [
        lambda: gnn.GraphSAGE(F, 16, 2, out_channels=5),
        lambda: gnn.GraphSAGE(F, 16, 2, out_channels=5),
        lambda: gnn.GraphSAGE(F, 12, 3, out_channels=4, aggr="max"),
        lambda: gnn.GIN(F, 16, 2, out_channels=5, train_eps=True),
    ],
    "sage_aggregators": [
        lambda: gnn.GraphSAGE(F, 8, 2, aggr=A.PowerMeanAggregation(p=2.0), out_channels=3),
        lambda: gnn.GraphSAGE(F, 8, 2, aggr="var", out_channels=3),
        lambda: gnn.GraphSAGE(F, 8, 2, aggr=A.StdAggregation(), out_channels=3),
        lambda: gnn.GraphSAGE(F, 8, 2, aggr="min", out_channels=3),
        lambda: gnn.GraphSAGE(F, 8, 2, aggr="sum", out_channels=3),
    ],
    "gcn": [
        lambda: gnn.GCN(F, 16, 2, out_channels=5),
        lambda: gnn.GCN(F, 8, 3, out_channels=5),
        lambda: gnn.GCN(F, 16, 2, out_channels=7, norm="batch_norm"),
    ],
    "gat": [
        lambda: gnn.GAT(F, 8, 2, out_channels=5, heads=2),
        lambda: gnn.GAT(F, 8, 3, out_channels=5, heads=3, concat=False),
    ],
    # messages reading the destination: GATv2's replaced self loops; ResGated and LE (no loops,
    # LE with edge weights) next to SAGE
    "gatv2": [
        lambda: gnn.GAT(F, 8, 2, out_channels=5, heads=2, v2=True),
        lambda: gnn.GAT(F, 8, 2, out_channels=5, heads=2, v2=True, share_weights=True),
        lambda: gnn.GAT(F, 8, 2, out_channels=5, heads=2),
    ],
    "resgated_le": [
        lambda: _seq_dst_readers(F),
        lambda: _seq_dst_readers(F),
        lambda: gnn.GraphSAGE(F, 16, 2, out_channels=5),
    ],
}


def _seq_dst_readers(f):
    return gnn.Sequential(
        "x, edge_index, edge_weight",
        [
            (gnn.ResGatedGraphConv(f, 16), "x, edge_index -> x"),
            torch.nn.ReLU(),
            (gnn.LEConv(16, 5), "x, edge_index, edge_weight -> x"),
        ],
    )


@pytest.mark.parametrize("pre_transform", [None, False, True])
@pytest.mark.parametrize("mix", sorted(MIXES))
def test_batched_forward_equals_each_model_alone(synthetic, mix, pre_transform):
    x = synthetic.x.abs() if mix == "sage_aggregators" else synthetic.x  # power mean: powers, not clamps
    models = [_model(build, seed) for seed, build in enumerate(MIXES[mix])]
    batch = batch_models(models)
    assert batch.model.output == "embedding"
    for parts in (1, 3, 8):
        out = batch.model.forward(
            x, synthetic.edge_index, synthetic.edge_weight, parts=parts, pre_transform=pre_transform
        )
        assert out.shape[1] == sum(m.out_dim for m in models)
        for model, got in zip(models, batch.split(out), strict=True):
            alone = model.forward(
                x, synthetic.edge_index, synthetic.edge_weight, parts=parts, pre_transform=pre_transform
            )
            assert graphs.rel_err(got, alone) <= TOL, (mix, parts, model.spec["source"])


def test_raw_sage_models_ship_and_aggregate_x_once(synthetic):
    models = [_model(lambda: gnn.GraphSAGE(F, 16, 2, out_channels=5), seed) for seed in range(3)]
    layer = batch_models(models).model.plan_info()[0]
    assert layer["kind"] == "bundle" and layer["in_dim"] == F  # one track: every model reads x itself
    assert layer["src_width"]["raw"] == F and layer["msg_width"]["raw"] == F
    assert layer["aggregator"] == "mean" and layer["state_width"]["raw"] == F + 1  # one count column
    assert layer["message_scaled"] and layer["range_wise"]  # native aggregates and the sums path apply
    # transform-then-propagate: each model's own transform (different weights), one fused mean
    assert layer["src_width"]["pre_transform"] == 3 * 16 and layer["state_width"]["pre_transform"] == 3 * 16 + 1


def test_an_identical_prefix_runs_once(synthetic):
    first = _model(lambda: gnn.GraphSAGE(F, 16, 2, out_channels=5), 0)
    second = _model(lambda: gnn.GraphSAGE(F, 16, 2, out_channels=5), 1)
    second.conv(0).load_state_dict(first.conv(0).state_dict())  # same layer 1, another layer 2
    batch = batch_models([first, second])
    assert batch.model.conv(0).kind == "sage"  # layer 1 is the shared layer itself
    assert batch.model.conv(1).in_dim == 16  # one h^(1) for both models
    out = batch.model.forward(synthetic.x, synthetic.edge_index, parts=3)
    for model, got in zip((first, second), batch.split(out), strict=True):
        assert graphs.rel_err(got, model.forward(synthetic.x, synthetic.edge_index, parts=3)) <= TOL


def test_shorter_models_pass_through_and_weights_decide_sharing():
    a = _model(lambda: gnn.GraphSAGE(F, 8, 2, out_channels=4), 0)
    b = _model(lambda: gnn.GraphSAGE(F, 8, 3, out_channels=4), 1)
    layer3 = batch_models([a, b]).model.conv(2)
    assert isinstance(layer3, BundleConv) and layer3.member(0) is None  # a's output rides along
    assert layer3.out_dim == 4 + 4
    # equal weights share a pre-transformed payload, different ones do not
    members = [((0, F), a.conv(0)), ((0, F), b.conv(0)), ((0, F), a.conv(0))]
    assert share_ids(members, True) == [[0, 0], [1, 1], [0, 0]]
    assert share_ids(members, False) == [[0, 0], [0, 0], [0, 0]]


def test_bundle_refuses_members_needing_other_edge_lists():
    sage = _model(lambda: gnn.GraphSAGE(F, 8, 2), 0).conv(0)
    gcn = _model(lambda: gnn.GCN(F, 8, 2), 1).conv(0)
    with pytest.raises(ValueError, match="self-loop"):
        BundleConv.from_convs(2 * F, [((0, F), sage), ((F, 2 * F), gcn)])


def test_a_declared_share_must_be_sound():
    sage = _model(lambda: gnn.GraphSAGE(F, 8, 2), 0).conv(0)
    gin = _model(lambda: gnn.GIN(F, 8, 2), 0).conv(0)
    members = [{"input": [0, F], "conv": sage.config()}, {"input": [0, F], "conv": gin.config()}]
    wrong = {"raw": [[0, 0], [0, 0]], "pre_transform": [[0, 0], [1, 1]]}  # mean and sum in one aggregation
    with pytest.raises(ValueError, match="cannot share an aggregation"):
        BundleConv(F, members, wrong)


def test_concat_aggregator_equals_its_parts():
    g = torch.Generator().manual_seed(0)
    parts = [{"name": "mean", "options": {}, "width": 3}, {"name": "max", "options": {}, "width": 2}]
    agg = ConcatAggregator([parts, [{"name": "sum", "options": {}, "width": 4}]])
    m = torch.randn(50, 5, generator=g)
    index = torch.randint(0, 7, (50,), generator=g)
    state = agg.merge(
        torch.cat([agg.partial(m[:20], index[:20], 7), agg.partial(m[20:], index[20:], 7)]),
        torch.cat([torch.arange(7)] * 2),
        7,
    )
    mean, mx = get_aggregator("mean"), get_aggregator("max")
    expected = torch.cat(
        [mean.finalize(mean.partial(m[:, :3], index, 7)), mx.finalize(mx.partial(m[:, 3:], index, 7))], 1
    )
    assert torch.allclose(agg.finalize(state), expected, atol=1e-6)
    assert agg.state_width(5) == 3 + 1 + 2 and agg.state_width(4) == 4  # each layout by its width
    assert not agg.invertible and not agg.from_sums
    with pytest.raises(ValueError, match="differ"):
        ConcatAggregator([parts, [{"name": "sum", "options": {}, "width": 5}]])
