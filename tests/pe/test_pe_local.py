"""Single-machine precompute writes the store format the Spark job writes: h^(l) equals the
model's layers, the state merged with nothing reproduces h^(l), the store opens verified, and a
rerun keeps committed layers."""

import os
import sys

import numpy as np
import torch
from torch_geometric.nn import GAT, GCN

from sparkgnn.layers.base import compute_stats, propagate
from sparkgnn.models import Model
from sparkgnn.pe import PEStore
from sparkgnn.pe.local import precompute_local

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "serving"))
from serving_testkit import pyg_model  # noqa: E402


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


class _EdgeNet(torch.nn.Module):
    """Convs that read edge features: TransformerConv and GENConv with edge_dim, then PNAConv."""

    def __init__(self, f: int, d: int):
        super().__init__()
        from torch_geometric.nn import GENConv, PNAConv, TransformerConv

        self.conv1 = TransformerConv(f, 4, heads=2, edge_dim=d)
        self.conv2 = GENConv(8, 6, edge_dim=d)
        self.conv3 = PNAConv(6, 3, ["mean", "max", "std"], ["identity", "amplification"], torch.tensor([1, 4, 2]))

    def forward(self, x, edge_index, edge_attr):
        x = self.conv1(x, edge_index, edge_attr).relu()
        x = self.conv2(x, edge_index, edge_attr)
        return self.conv3(x, edge_index)


def test_edge_features_are_read_by_the_precompute(graph_data, tmp_path):
    import dataclasses

    import pytest

    attr = np.random.default_rng(2).normal(size=(graph_data.num_edges, 3)).astype(np.float32)
    data = dataclasses.replace(graph_data, edge_attr=attr)
    torch.manual_seed(4)
    net = _EdgeNet(data.feature_dim, 3).eval()
    ei = torch.from_numpy(np.stack([data.edge_src, data.edge_dst]))
    with torch.no_grad():
        expected = net(torch.from_numpy(data.x), ei, torch.from_numpy(attr)).numpy()
    model = Model.from_pyg(net)
    store = precompute_local(data, model, str(tmp_path / "store"))
    h3, s3 = store.lookup(data.ids, 3, states=True)
    np.testing.assert_allclose(h3, expected, rtol=1e-5, atol=1e-5)
    # the stored state of an edge-feature layer reproduces its rows
    h1, s2 = store.lookup(data.ids, 1)[0], store.lookup(data.ids, 2, states=True)[1]
    conv = model.conv(1)  # the GENConv (0-based), whose state is layer 2's
    with torch.no_grad():
        h2 = model.post(1, conv.update(torch.from_numpy(h1), conv.aggregator.finalize(torch.from_numpy(s2)), {}, False))
    np.testing.assert_allclose(h2.numpy(), store.lookup(data.ids, 2)[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"read edge features \(edge_attr, width 3\) but graph .* has none"):
        precompute_local(graph_data, model, str(tmp_path / "other"))
    assert not (tmp_path / "other").exists()


def test_a_dag_model_stores_each_round_s_row_with_its_carried_columns(graph_data, tmp_path):
    """Residual and JumpingKnowledge models: layer l holds the row after round l, [main | the
    slots later rounds read] (the next round's in_dim wide), its state reproduces that row, and
    the last layer is the PyG module's output; a chain model's layers stay one value wide."""
    data = graph_data
    ei = torch.from_numpy(np.stack([data.edge_src, data.edge_dst]))
    for kind in ("residual", "jk_cat"):
        pyg = pyg_model(kind, data.feature_dim, 3, out=3, seed=2)
        model = Model.from_pyg(pyg)
        assert model.is_dag
        store = precompute_local(data, model, str(tmp_path / kind))
        widths = [model.conv(l).in_dim for l in range(1, 3)] + [model.out_dim]
        assert store.manifest["dims"] == widths and widths[0] == 2 * 16  # the hidden value and its copy
        h = model.pre(torch.from_numpy(data.x))
        for l in range(3):
            conv = model.conv(l)
            stats = compute_stats(conv, ei[0], ei[1], None, data.num_nodes)
            stored, state = store.lookup(data.ids, l + 1, states=True)
            with torch.no_grad():
                again = model.post(l, conv.update(h, conv.aggregator.finalize(torch.from_numpy(state)), stats, False))
                h = model.post(l, propagate(conv, h, ei[0], ei[1], None))
            np.testing.assert_allclose(stored, h.numpy(), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(again.numpy(), h.numpy(), rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            want = pyg(torch.from_numpy(data.x), ei).numpy()
        np.testing.assert_allclose(store.lookup(data.ids, 3)[0], want, rtol=1e-5, atol=1e-5)
    chain = Model.from_pyg(pyg_model("sage", data.feature_dim, 3, out=3))
    assert precompute_local(data, chain, str(tmp_path / "chain")).manifest["dims"] == [16, 16, 3]


def test_a_chebconv_store_holds_pyg_s_output_after_each_conv(graph_data, tmp_path):
    """ChebConv(K) is K - 1 rounds whose rows carry [T_k | T_{k-1} | running sum]: on a graph with
    an isolated vertex, a vertex without in-edges, a self loop (get_laplacian drops it) and parallel
    edges, weighted and not, each round's stored state reproduces its row, and the row after each
    conv's last round is PyG's output of that conv (ReLU between them), the last the module's."""
    import dataclasses

    import torch_geometric.nn as gnn
    from serving_testkit import randomize

    rng = np.random.default_rng(4)
    weighted = dataclasses.replace(graph_data, weight=rng.uniform(0.25, 2.0, graph_data.num_edges).astype(np.float32))
    ei = torch.from_numpy(np.stack([graph_data.edge_src, graph_data.edge_dst]))
    f = graph_data.feature_dim
    for name, data, norm, K in (("sym", graph_data, "sym", 3), ("rw_weighted", weighted, "rw", 2)):
        args = "x, edge_index, edge_weight" if data.weight is not None else "x, edge_index"
        convs = [gnn.ChebConv(f, 6, K=K, normalization=norm), gnn.ChebConv(6, 3, K=K, normalization=norm)]
        pyg = gnn.Sequential(args, [(convs[0], f"{args} -> x"), torch.nn.ReLU(), (convs[1], f"{args} -> x")])
        pyg = randomize(pyg, K)
        model = Model.from_pyg(pyg)
        assert model.num_rounds == 2 * (K - 1)
        assert model.conv(0).uses_edge_weight == (data.weight is not None)
        store = precompute_local(data, model, str(tmp_path / name))
        w = None if data.weight is None else torch.from_numpy(data.weight)
        x = torch.from_numpy(data.x)
        with torch.no_grad():
            first = convs[0](x, ei, w).relu()
            want = [first, convs[1](first, ei, w)]
        h = model.pre(x)
        for l in range(model.num_rounds):
            conv = model.conv(l)
            stats = compute_stats(conv, ei[0], ei[1], w, data.num_nodes)
            stored, state = store.lookup(data.ids, l + 1, states=True)
            with torch.no_grad():
                again = model.post(l, conv.update(h, conv.aggregator.finalize(torch.from_numpy(state)), stats, False))
                h = torch.from_numpy(stored)
            np.testing.assert_allclose(again.numpy(), stored, rtol=1e-5, atol=1e-5)
            if (l + 1) % (K - 1) == 0:  # a conv's last round: its output
                np.testing.assert_allclose(stored, want[l // (K - 1)].numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
