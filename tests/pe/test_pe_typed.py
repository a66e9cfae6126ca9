"""The typed PE store (pe/typed.py) written by precompute_local on a typed graph: every stored
layer of every node type equals the PyG to_hetero model's intermediate output (float32, 1e-5); a
rerun keeps committed layers; a store opened for another model or graph is refused naming the
difference."""

import os
import sys

import numpy as np
import pytest
import torch

from sparkgnn.errors import StalePEStore, UnsupportedModelError
from sparkgnn.pe.local import precompute_local
from sparkgnn.pe.typed import TypedPEStore, type_dims

sys.path.insert(0, os.path.dirname(__file__))
from typed_testkit import pyg_data, pyg_intermediate, to_hetero_sage, typed_graph  # noqa: E402


def test_each_stored_layer_equals_the_to_hetero_models_intermediate_output(tmp_path):
    d = pyg_data()
    graph = typed_graph(d)
    module, model = to_hetero_sage(d, layers=2, aggr="mean")
    store = precompute_local(graph, model, tmp_path / "store")
    assert isinstance(store, TypedPEStore) and store.num_layers == 2
    assert type_dims(model) == {"paper": [8, 3], "author": [8, 3], "field": [8, 3]}
    for layer in (1, 2):
        reference = pyg_intermediate(module, d, layer, full=2, aggr="mean")
        assert sorted(store.types(layer)) == sorted(reference)
        for t, ref in reference.items():
            got = store.lookup(t, graph.nodes[t].ids, layer)  # non-dense paper ids
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, ref.numpy(), rtol=1e-5, atol=1e-5)
    # a rerun keeps every committed layer (same attempt folders)
    before = {t: s.manifest["paths"] for t, s in store.stores.items()}
    again = precompute_local(graph, model, tmp_path / "store")
    assert {t: s.manifest["paths"] for t, s in again.stores.items()} == before


def test_a_store_for_other_weights_or_another_graph_is_refused_naming_the_difference(tmp_path):
    d = pyg_data()
    graph = typed_graph(d)
    _, model = to_hetero_sage(d, layers=1)
    precompute_local(graph, model, tmp_path / "store")
    retrained = type(model)(model.spec)
    retrained.load_state_dict({k: v + 1 for k, v in model.state_dict().items()})
    with pytest.raises(StalePEStore, match="model weights differ: the store has typed PEs of the same architecture"):
        TypedPEStore.open(tmp_path / "store", model=retrained, graph=graph)
    d["paper"].x[0, 0] += 1.0
    with pytest.raises(StalePEStore, match="graph fingerprint differs: no typed PEs for graph"):
        TypedPEStore.open(tmp_path / "store", model=model, graph=typed_graph(d))
    with pytest.raises(UnsupportedModelError, match="a typed graph runs a typed model"):
        precompute_local(graph, torch.nn.Linear(2, 2), tmp_path / "other")
    assert not os.path.exists(tmp_path / "other")
