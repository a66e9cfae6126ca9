"""models/batching.py: a batched model round-trips through save/load (config + state_dict, the
workers' weights_only path) to the same fingerprint and results; models that cannot be one model
are refused with the reason, or grouped into batches that can."""

import pytest
import torch
import torch_geometric.nn as gnn
import torch_test_graphs as graphs

from sparkgnn.models import Model
from sparkgnn.models.batching import BatchError, batch_models, plan_batches, why_incompatible

F = 24


def _model(build, seed=0):
    torch.manual_seed(seed)
    return Model.from_pyg(graphs.randomize(build(), seed))


def test_a_batched_model_round_trips_through_save_and_load(synthetic, tmp_path):
    models = [
        _model(lambda: gnn.GraphSAGE(F, 16, 2, out_channels=5, norm="batch_norm"), 0),
        _model(lambda: gnn.GraphSAGE(F, 16, 3, out_channels=5, aggr="max"), 1),
        _model(lambda: gnn.GIN(F, 16, 2, out_channels=5), 2),
    ]
    batch = batch_models(models, ["a", "b", "c"])
    batch.model.save(str(tmp_path / "batched"))
    loaded = Model.load(str(tmp_path / "batched"))
    assert loaded.fingerprint() == batch.model.fingerprint()
    assert loaded.spec["source"] == "batch[a, b, c]"
    args = (synthetic.x, synthetic.edge_index, synthetic.edge_weight)
    assert torch.equal(loaded.forward(*args, parts=3), batch.model.forward(*args, parts=3))


def test_models_with_pre_stacks_get_parallel_pre_ops(synthetic):
    # b with a Linear + ReLU before its first conv; a without: layer 1 reads [x | relu(x W + b)]
    a = _model(lambda: gnn.GraphSAGE(F, 8, 2, out_channels=3), 0)
    b = _model(lambda: gnn.GraphSAGE(F, 8, 2, out_channels=3), 1)
    spec = b.describe()
    spec["pre"] = [{"op": "linear", "in_dim": F, "out_dim": F, "bias": True}, {"op": "activation", "name": "relu"}]
    c = Model(spec)
    state = {**b.state_dict(), "pre_ops.ops.0.weight": torch.randn(F, F) * 0.2, "pre_ops.ops.0.bias": torch.randn(F)}
    c.load_state_dict(state)
    batch = batch_models([a, c])
    assert batch.model.pre_ops.config()[0]["op"] == "parallel"
    out = batch.model.forward(synthetic.x, synthetic.edge_index, parts=3)
    for model, got in zip((a, c), batch.split(out), strict=True):
        assert graphs.rel_err(got, model.forward(synthetic.x, synthetic.edge_index, parts=3)) <= 1e-5


def test_models_reading_other_widths_are_refused_by_name():
    a = _model(lambda: gnn.GraphSAGE(F, 8, 2))
    b = _model(lambda: gnn.GraphSAGE(F + 1, 8, 2))
    with pytest.raises(BatchError, match=r"same input width.*left: 24, right: 25"):
        batch_models([a, b], ["left", "right"])


def test_models_needing_other_self_loops_are_refused_or_grouped():
    sage = _model(lambda: gnn.GraphSAGE(F, 8, 2))
    gcn = _model(lambda: gnn.GCN(F, 8, 2))
    gin = _model(lambda: gnn.GIN(F, 8, 2))
    names = ["sage", "gcn", "gin"]
    assert "self-loop" in why_incompatible([sage, gcn], names[:2])
    with pytest.raises(BatchError, match=r"sage, gcn cannot share one edge list.*self-loop"):
        batch_models([sage, gcn], names[:2])
    assert plan_batches([sage, gcn, gin], names) == [[0, 2], [1]]


def test_gcn_statistics_with_and_without_edge_weights_cannot_share():
    weighted = _model(lambda: gnn.GCN(F, 8, 2))
    spec = weighted.describe()
    for conv in spec["convs"]:
        conv["use_edge_weight"] = False
    unweighted = Model(spec)
    assert "edge weights" in why_incompatible([weighted, unweighted], ["w", "u"])


def test_names_must_be_distinct():
    a = _model(lambda: gnn.GraphSAGE(F, 8, 2))
    with pytest.raises(BatchError, match="distinct"):
        batch_models([a, a], ["m", "m"])


@pytest.mark.parametrize(
    "builds",
    [
        [
            lambda: gnn.GraphConv(F, 6, aggr="mean"),
            lambda: gnn.GraphConv(F, 6, aggr="max"),
            lambda: gnn.SAGEConv(F, 6, project=True),
        ],
        [lambda: gnn.SGConv(F, 5, K=2), lambda: gnn.GCN(F, 8, 2, out_channels=5)],
    ],
    ids=["graphconv_sage_project", "sgconv_rounds_with_gcn"],
)
def test_new_kinds_batch_to_the_results_of_each_model_alone(builds, synthetic, tmp_path):
    """GraphConv and SAGEConv(project=True) share by their own signatures; SGConv's rounds are
    GCN rounds, so they bundle with a GCN model's layers."""
    models = [_model(build, seed) for seed, build in enumerate(builds)]
    assert plan_batches(models, [str(i) for i in range(len(models))]) == [list(range(len(models)))]
    batch = batch_models(models)
    batch.model.save(str(tmp_path / "batched"))
    loaded = Model.load(str(tmp_path / "batched"))
    args = (synthetic.x, synthetic.edge_index, synthetic.edge_weight)
    out = loaded.forward(*args, parts=3)
    for model, got in zip(models, batch.split(out), strict=True):
        assert graphs.rel_err(got, model.forward(*args, parts=3)) <= 1e-5
