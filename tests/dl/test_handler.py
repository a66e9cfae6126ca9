"""The DL handler refuses bad tasks with errors that name the problem (a worker keeps serving)."""

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch_geometric.nn import GraphSAGE

from sparkgnn.arrowvec import to_fixed_list
from sparkgnn.dl.handler import build_handler
from sparkgnn.dl.model_store import register
from sparkgnn.errors import ModelLoadError, SparkGNNError
from sparkgnn.models import Model


@pytest.fixture()
def served(tmp_path):
    torch.manual_seed(0)
    model = Model.from_pyg(GraphSAGE(4, 3, 2).eval(), output="embedding")
    fingerprint = register(model, str(tmp_path))
    return build_handler(str(tmp_path), threads=1), fingerprint, model


def _own(rows: np.ndarray) -> pa.Table:
    return pa.table({"h": to_fixed_list(rows.astype(np.float32))})


def test_layer_step_matches_the_model(served):
    handler, fingerprint, model = served
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    src, dst = np.array([0, 1, 2, 3, 4, 0]), np.array([1, 2, 3, 4, 0, 2])
    header = {"op": "layer_step", "model": fingerprint, "layer": 0, "aggregate": "edges", "emit": "none"}
    tables = {"own": _own(x), "edges": pa.table({"src": src, "dst": dst})}
    _, out = handler(header, tables)
    h = np.stack(out["own"].column("h").to_numpy(zero_copy_only=False))
    with torch.no_grad():
        expected = model.post(0, model.conv(0).update(torch.from_numpy(x), _mean(x, src, dst), {}, False)).numpy()
    np.testing.assert_allclose(h, expected, rtol=1e-5, atol=1e-6)


def _mean(x, src, dst):
    agg = np.zeros_like(x)
    count = np.zeros(len(x), np.float32)
    np.add.at(agg, dst, x[src])
    np.add.at(count, dst, 1)
    return torch.from_numpy(agg / np.maximum(count, 1)[:, None])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"op": "explode"}, "unknown op 'explode'"),
        ({"model": "0" * 64}, "unknown model fingerprint"),
        ({"model": "../" * 8 + "etc"}, r"model fingerprint '\.\./.*' is not a model fingerprint \(64"),
        ({"model": ["0" * 64]}, "is not a model fingerprint"),
        ({"aggregate": "telepathy"}, "unknown aggregate stage 'telepathy'"),
        ({"layer": 7}, "layer 7 out of range"),
    ],
)
def test_bad_headers_are_named(served, change, message):
    handler, fingerprint, _ = served
    header = {"op": "layer_step", "model": fingerprint, "layer": 0, "aggregate": "edges", "emit": "none", **change}
    tables = {"own": _own(np.zeros((2, 4))), "edges": pa.table({"src": [0], "dst": [1]})}
    with pytest.raises((SparkGNNError, ModelLoadError), match=message):
        handler(header, tables)


def test_nan_and_wrong_width_and_bad_ids_are_named(served):
    handler, fingerprint, _ = served
    header = {"op": "layer_step", "model": fingerprint, "layer": 0, "aggregate": "edges", "emit": "none"}
    edges = pa.table({"src": [0], "dst": [1]})
    with pytest.raises(SparkGNNError, match="NaN"):
        handler(header, {"own": _own(np.array([[np.nan, 0, 0, 0], [0, 0, 0, 0]])), "edges": edges})
    with pytest.raises(SparkGNNError, match="expects 4-wide inputs"):
        handler(header, {"own": _own(np.zeros((2, 5))), "edges": edges})
    with pytest.raises(SparkGNNError, match="outside"):
        handler(header, {"own": _own(np.zeros((2, 4))), "edges": pa.table({"src": [0], "dst": [9]})})


def test_finite_inputs_whose_sum_overflows_are_accepted_and_inf_is_refused(served):
    # The NaN/Inf check sums first (one reduction); a float32 overflow of finite values must not
    # be mistaken for an Inf, and a single Inf among them must still be found.
    handler, fingerprint, _ = served
    header = {"op": "layer_step", "model": fingerprint, "layer": 0, "aggregate": "edges", "emit": "none"}
    edges = pa.table({"src": np.array([0]), "dst": np.array([1])})
    big = np.full((2, 4), 3e38, dtype=np.float32)
    _, out = handler(header, {"own": _own(big), "edges": edges})
    assert out["own"].num_rows == 2
    big[1, 2] = np.inf
    with pytest.raises(SparkGNNError, match=r"NaN/Inf values in rows \[1\]"):
        handler(header, {"own": _own(big), "edges": edges})
