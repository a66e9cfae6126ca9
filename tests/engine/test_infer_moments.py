"""Spark batch inference of the normalized-moments aggregator (OMEGA §6.2), which PyG lacks: the
model runs each moments layer as two rounds (the mean, then the centred power sums with the mean
shipped to the in-edges as a destination payload, OMEGA's AllGather), through the replicate, combine
and edge_join strategies, and must equal an independent float64 numpy reference (tests/moments_reference.py
explains the tolerance of roots near 0)."""

import numpy as np
import pytest
import torch
from engine_helpers import exact_or_transient, spark_output
from moments_reference import assert_close, assert_moments_close, moments_reference

from sparkgnn import infer
from sparkgnn.models import Model


def _model(f: int, hidden: int = 8) -> Model:
    """SAGE(moments, n=[2, 4]) + relu, then SAGE(moments, n=3) whose output is the aggregate
    itself (lin_l = I, no root term, no bias), so the odd root's tolerance applies entry by entry."""
    layers = [
        {"kind": "sage", "in_dim": f, "out_dim": hidden, "aggr": "moments", "aggr_options": {"n": [2, 4]}},
        {
            "kind": "sage",
            "in_dim": hidden,
            "out_dim": hidden,
            "aggr": "moments",
            "aggr_options": {"n": 3},
            "root_weight": False,
            "bias": False,
        },
    ]
    spec = {
        "format": "sparkgnn.Model",
        "version": 1,
        "output": "embedding",
        "in_dim": f,
        "pre": [],
        "convs": layers,
        "post": [[{"op": "activation", "name": "relu"}], []],
    }
    model = Model(spec)
    g = torch.Generator().manual_seed(9)
    state = {k: torch.randn(v.shape, generator=g) * 0.3 for k, v in model.state_dict().items()}
    state["convs.3.layer.weight_l"] = torch.eye(hidden)
    model.load_state_dict(state)
    return model


def _hidden(model: Model, data) -> np.ndarray:
    """The first layer's output in float64: the second layer's input, whose moments the output is."""
    first = model.layers[0]
    w_l, b, w_r = (t.numpy().astype(np.float64) for t in (first.weight_l, first.bias_l, first.weight_r))
    x = data.x.astype(np.float64)
    agg, _ = moments_reference(x, data.edge_src, data.edge_dst, [2, 4])
    return np.maximum(agg @ w_l.T + b + x @ w_r.T, 0)


@pytest.mark.parametrize(
    "strategy,partitions", [("replicate", 1), ("replicate", 3), ("combine", 1), ("combine", 3), ("edge_join", 3)]
)
def test_moments_spark_equals_reference(spark, graph_dirs, work_dir, tmp_path, strategy, partitions):
    path, data = graph_dirs["skewed"]  # isolated nodes, self loops, duplicate edges
    model = _model(data.feature_dim)
    hidden = _hidden(model, data)
    what = f"{strategy} P={partitions}"

    def attempt(rerun: int) -> np.ndarray:
        where = str(tmp_path / "again") if rerun else work_dir
        actual = spark_output(
            infer(spark, path, model, strategy=strategy, partitions=partitions, work_dir=where).frame, data
        )
        assert not np.isnan(actual).any(), "some vertices have no output row"
        assert_moments_close(actual, hidden, data.edge_src, data.edge_dst, 3, what)
        return actual

    actual = exact_or_transient(attempt, what)
    local = model(torch.from_numpy(data.x), data.edge_index_torch(), parts=partitions).numpy()
    _, slack = moments_reference(hidden, data.edge_src, data.edge_dst, 3)
    assert_close(actual, local.astype(np.float64), 2 * slack, "against Model.forward")
