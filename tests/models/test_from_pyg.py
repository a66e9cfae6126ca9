"""Model.from_pyg's output rule (models.from_pyg.infer_output): a classifier head gives "logits"
(and a `pred` column), anything else "embedding"; the choice is logged; output= always wins."""

import logging

import pytest
import torch
import torch_geometric.nn as gnn

from sparkgnn.models import Model

F = 10


@pytest.mark.parametrize(
    ("make", "expected", "why"),
    [
        (lambda: gnn.GraphSAGE(F, 8, 2, out_channels=3), "logits", "out_channels=3"),
        (lambda: gnn.GCN(F, 8, 2, out_channels=16), "logits", "out_channels=16"),  # wider head: still PyG's head
        (lambda: gnn.GIN(F, 8, 2), "embedding", "without out_channels"),
        (lambda: gnn.GAT(F, 8, 2, heads=2), "embedding", "without out_channels"),
        (lambda: gnn.GCNConv(F, 4), "logits", "conv narrowing 10 -> 4"),
        (lambda: gnn.GCNConv(F, 16), "embedding", "does not narrow (10 -> 16)"),
        (
            lambda: torch.nn.Sequential(gnn.SAGEConv(F, 16), torch.nn.ReLU(), gnn.SAGEConv(16, 3)),
            "logits",
            "conv narrowing 16 -> 3",
        ),
        (
            lambda: torch.nn.Sequential(gnn.SAGEConv(F, 16), torch.nn.ReLU(), gnn.SAGEConv(16, 8), torch.nn.ReLU()),
            "embedding",
            "ends in ActivationOp",
        ),
        (
            lambda: torch.nn.Sequential(
                gnn.GCNConv(F, 16), torch.nn.ReLU(), torch.nn.Dropout(), torch.nn.Linear(16, 3)
            ),
            "logits",
            "Linear narrowing 16 -> 3",
        ),
    ],
    ids=[
        "sage_head",
        "gcn_wide_head",
        "gin_hidden",
        "gat_hidden",
        "conv_narrow",
        "conv_wide",
        "seq_head",
        "seq_relu",
        "seq_linear",
    ],  # fmt: skip
)
def test_output_is_inferred_from_the_last_layer_and_logged(make, expected, why, caplog):
    caplog.set_level(logging.INFO, logger="sparkgnn.models.from_pyg")
    model = Model.from_pyg(make().eval())
    assert model.output == expected
    (line,) = [m for m in caplog.messages if "output=" in m]
    assert f"output={expected!r}" in line and why in line, line


def test_explicit_output_wins_and_logs_nothing(caplog):
    caplog.set_level(logging.INFO, logger="sparkgnn.models.from_pyg")
    assert Model.from_pyg(gnn.GIN(F, 8, 2).eval(), output="logits").output == "logits"
    assert Model.from_pyg(gnn.GCN(F, 8, 2, out_channels=3).eval(), output="embedding").output == "embedding"
    assert not [m for m in caplog.messages if "output=" in m]


def test_num_layers_counts_written_layers_and_num_rounds_the_engine_rounds():
    plain = Model.from_pyg(gnn.GraphSAGE(F, 8, 3, out_channels=2).eval())
    assert plain.num_layers == plain.num_rounds == 3
    spec = {
        "format": "sparkgnn.Model",
        "version": 1,
        "output": "embedding",
        "in_dim": F,
        "pre": [],
        "convs": [
            {"kind": "sage", "in_dim": F, "out_dim": 6, "aggr": "moments", "aggr_options": {"n": [2, 3]}},
            {"kind": "sage", "in_dim": 6, "out_dim": 4, "aggr": "mean"},
        ],
        "post": [[{"op": "activation", "name": "relu"}], []],
    }
    moments = Model(spec)
    assert moments.num_layers == 2 and moments.num_rounds == 3 == len(moments.conv_list())  # moments: two rounds
