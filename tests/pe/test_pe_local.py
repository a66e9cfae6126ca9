"""Single-machine precompute writes the store format the Spark job writes: h^(l) equals the
model's layers, the state merged with nothing reproduces h^(l), the store opens verified, and a
rerun keeps committed layers."""

import numpy as np
import torch
from torch_geometric.nn import GAT, GCN

from sparkgnn.layers.base import compute_stats
from sparkgnn.models import Model
from sparkgnn.pe import PEStore
from sparkgnn.pe.local import precompute_local


def test_layers_states_and_reopen(graph_data, tmp_path):
    data = graph_data
    for build in (GCN, GAT):
        torch.manual_seed(4)
        model = Model.from_pyg(build(data.feature_dim, 8, 2, out_channels=3).eval())
        root = str(tmp_path / build.__name__)
        store = precompute_local(data, model, root)
        ei = torch.from_numpy(np.stack([data.edge_src, data.edge_dst]))
        w = None if data.weight is None else torch.from_numpy(data.weight)
        out = model.forward(torch.from_numpy(data.x), ei, w).numpy()
        h2, s2 = store.lookup(data.ids, 2, states=True)
        np.testing.assert_allclose(h2, out, rtol=1e-5, atol=1e-5)
        h1, _ = store.lookup(data.ids, 1)
        conv = model.conv(1)
        stats = compute_stats(conv, ei[0], ei[1], w if conv.uses_edge_weight else None, data.num_nodes)
        with torch.no_grad():
            again = model.post(
                1, conv.update(torch.from_numpy(h1), conv.aggregator.finalize(torch.from_numpy(s2)), stats, False)
            )
        np.testing.assert_allclose(again.numpy(), out, rtol=1e-5, atol=1e-5)
        assert store.manifest["layers_complete"] == [1, 2] and store.with_states
        before = store.manifest["updated"]
        again_store = precompute_local(data, model, root)  # resume: nothing to do
        assert again_store.manifest["rows"] == store.manifest["rows"]
        assert PEStore.open(root, model=model, graph=data).layers == [1, 2]
        assert before <= again_store.manifest["updated"]
