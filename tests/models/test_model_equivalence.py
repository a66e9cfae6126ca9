"""Whole models: Model.from_pyg(m).forward(x, edge_index, parts=p) equals m.eval()(x, edge_index)
for p in {1, 2, 7}, for 2- and 3-layer BasicGNNs and Sequential stacks of every supported layer,
on the corner-case synthetic graph and on Cora."""

import pytest
import torch
import torch_geometric.nn as gnn
import torch_geometric.nn.aggr as A
import torch_test_graphs as graphs  # noqa: E402

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.models import Model

rel_err = graphs.rel_err
TOL = 1e-5
PARTS = (1, 2, 7)
NUM_CLASSES = 7


randomize = graphs.randomize


def basic(name, layers, f):
    common = dict(in_channels=f, hidden_channels=16, num_layers=layers, dropout=0.5)
    return {
        "GCN": lambda: gnn.GCN(out_channels=NUM_CLASSES, **common),
        "GCN_bn_actfirst": lambda: gnn.GCN(norm="batch_norm", act_first=True, act="elu", **common),
        "SAGE_mean": lambda: gnn.GraphSAGE(out_channels=NUM_CLASSES, **common),
        "SAGE_max": lambda: gnn.GraphSAGE(aggr="max", norm="batch_norm", **common),
        "SAGE_powermean": lambda: gnn.GraphSAGE(aggr=A.PowerMeanAggregation(p=2.0), out_channels=NUM_CLASSES, **common),
        "SAGE_var": lambda: gnn.GraphSAGE(aggr="var", out_channels=NUM_CLASSES, **common),
        "SAGE_std": lambda: gnn.GraphSAGE(aggr=A.StdAggregation(), act="leaky_relu", **common),
        "GIN": lambda: gnn.GIN(out_channels=NUM_CLASSES, train_eps=True, **common),
        "GIN_bn": lambda: gnn.GIN(norm="batch_norm", **common),
        "GAT_concat": lambda: gnn.GAT(heads=4, out_channels=NUM_CLASSES, **common),
        "GAT_mean": lambda: gnn.GAT(heads=2, concat=False, out_channels=NUM_CLASSES, **common),
    }[name]()


BASIC = [
    "GCN",
    "GCN_bn_actfirst",
    "SAGE_mean",
    "SAGE_max",
    "SAGE_powermean",
    "SAGE_var",
    "SAGE_std",
    "GIN",
    "GIN_bn",
    "GAT_concat",
    "GAT_mean",
]


def _inputs(graph, name):
    # power-mean aggregation of a model's *first* layer sees raw features: keep them >= 0 so
    # the test exercises the power, not only the clamp
    return graph.x.abs() if "powermean" in name.lower() else graph.x


def _check(model_pyg, graph, x, weighted=False, output="logits"):
    w = graph.edge_weight if weighted else None
    with torch.no_grad():
        if weighted:
            ref = model_pyg(x, graph.edge_index, w)
        else:
            ref = model_pyg(x, graph.edge_index)
    model = Model.from_pyg(model_pyg, output=output)
    for parts in PARTS:
        out = model(x, graph.edge_index, w, parts=parts, seed=parts)
        assert out.dtype == torch.float32
        err = rel_err(out, ref)
        assert err <= TOL, (graph.name, parts, err)
    return model, ref


# PyG's StdAggregation is discontinuous (sqrt(var) jumps from 0 to sqrt(1e-5) at var = 1e-5).
# Stacking std layers lets float32 summation-order differences from earlier layers (inherent to
# any partitioned execution) push a few near-threshold entries across that jump, so a 3-layer
# all-std stack is checked layer by layer below (test_deep_std_layerwise) and end to end with a
# std first layer (test_std_first_layer_then_others).
BASIC_CASES = [(n, l) for n in BASIC for l in (2, 3) if (n, l) != ("SAGE_std", 3)]


@pytest.mark.parametrize("name,layers", BASIC_CASES)
def test_basic_gnn(name, layers, graph):
    m = randomize(basic(name, layers, graph.num_features), seed=layers)
    model, _ = _check(m, graph, _inputs(graph, name))
    assert model.num_layers == layers
    assert model.in_dim == graph.num_features


@pytest.mark.parametrize("layers", [2, 3])
def test_gcn_with_edge_weights(layers, graph):
    m = randomize(basic("GCN", layers, graph.num_features), seed=11)
    _check(m, graph, graph.x, weighted=True)


JK_CASES = [
    ("cat", lambda f: gnn.GCN(f, 16, 3, out_channels=NUM_CLASSES, jk="cat", norm="batch_norm")),
    ("max", lambda f: gnn.GraphSAGE(f, 16, 2, out_channels=NUM_CLASSES, jk="max", act_first=True)),
    ("last", lambda f: gnn.GIN(f, 16, 2, out_channels=NUM_CLASSES, jk="last")),
    ("cat_one_layer", lambda f: gnn.GAT(f, 8, 1, out_channels=NUM_CLASSES, jk="cat", heads=2)),
]


@pytest.mark.parametrize("mode,make", JK_CASES, ids=[c[0] for c in JK_CASES])
def test_basic_gnn_jumping_knowledge(mode, make, graph):
    """BasicGNN(jk=...) normalises and activates every layer, combines their outputs and applies
    PyG's Linear head: the converted chain (save / combine ops) equals PyG's forward."""
    model, _ = _check(randomize(make(graph.num_features), seed=5), graph, graph.x)
    assert model.output == "logits"


def test_basic_gnn_jk_lstm_is_refused():
    with pytest.raises(UnsupportedModelError, match="jk='lstm'.*LSTM"):
        Model.from_pyg(gnn.GCN(8, 16, 2, jk="lstm").eval())


def _convs(kind, f, layers):
    dims = [f] + [16] * (layers - 1) + [NUM_CLASSES]
    out = []
    for i in range(layers):
        a, b = dims[i], dims[i + 1]
        out.append(
            {
                "gcn": lambda: gnn.GCNConv(a, b),
                "sage": lambda: gnn.SAGEConv(a, b, aggr="max" if i % 2 else "mean"),
                "gin": lambda: gnn.GINConv(
                    torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.ReLU(), torch.nn.Linear(b, b)), train_eps=True
                ),
                "gat": lambda: gnn.GATConv(a, b // 2 if i < layers - 1 else b, heads=2, concat=i < layers - 1),
            }[kind]()
        )
    return out


KINDS = ["gcn", "sage", "gin", "gat"]


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_pyg_sequential_with_head(kind, layers, graph):
    f = graph.num_features
    convs = _convs(kind, f, layers)
    mods = []
    for i, c in enumerate(convs):
        mods.append((c, "x, edge_index -> x"))
        if i < layers - 1:
            mods += [torch.nn.ReLU(inplace=True), torch.nn.Dropout(0.4)]
    mods += [torch.nn.Tanh(), torch.nn.Linear(NUM_CLASSES, 3)]
    m = randomize(gnn.Sequential("x, edge_index", mods), seed=3)
    model, _ = _check(m, graph, graph.x)
    assert model.out_dim == 3
    assert len(model.post_ops[layers - 1]) == 2  # tanh + head


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_torch_containers(kind, layers, graph):
    """torch.nn.Sequential / ModuleList stacks mean: convs take (x, edge_index), node-wise
    modules take x, in order."""
    f = graph.num_features
    convs = _convs(kind, f, layers)
    items = []
    for i, c in enumerate(convs):
        items.append(c)
        if i < layers - 1:
            items += [torch.nn.BatchNorm1d(16), torch.nn.PReLU()]
    items.append(torch.nn.LogSoftmax(dim=-1))
    for container in (torch.nn.Sequential, torch.nn.ModuleList):
        m = randomize(container(*items) if container is torch.nn.Sequential else container(items), seed=5)

        class Ref(torch.nn.Module):
            def forward(self, x, ei):
                for mod in m:
                    x = mod(x, ei) if isinstance(mod, gnn.MessagePassing) else mod(x)
                return x

        x = graph.x
        with torch.no_grad():
            ref = Ref()(x, graph.edge_index)
        model = Model.from_pyg(m)
        for parts in PARTS:
            assert rel_err(model(x, graph.edge_index, parts=parts), ref) <= TOL


def test_pyg_sequential_gcn_edge_weight_routing(synthetic):
    """In torch_geometric.nn.Sequential a GCNConv only uses weights when its signature passes
    them; sparkgnn follows the signature per layer."""
    f = synthetic.num_features
    m = randomize(
        gnn.Sequential(
            "x, edge_index, edge_weight",
            [
                (gnn.GCNConv(f, 16), "x, edge_index, edge_weight -> x"),
                torch.nn.ReLU(),
                (gnn.GCNConv(16, 8), "x, edge_index -> x"),
            ],
        )
    )
    model, _ = _check(m, synthetic, synthetic.x, weighted=True)
    assert model.conv(0).uses_edge_weight and not model.conv(1).uses_edge_weight


def test_embedding_output_and_predict(synthetic):
    m = randomize(basic("GCN", 2, synthetic.num_features))
    emb = Model.from_pyg(m, output="embedding")
    assert emb.output == "embedding"
    with pytest.raises(ValueError):
        emb.predict(synthetic.x, synthetic.edge_index)
    logits = Model.from_pyg(m)
    pred = logits.predict(synthetic.x, synthetic.edge_index, parts=2)
    with torch.no_grad():
        assert torch.equal(pred, m(synthetic.x, synthetic.edge_index).argmax(-1))


def test_model_copies_weights_and_stays_eval(synthetic):
    m = randomize(basic("GAT_concat", 2, synthetic.num_features))
    model = Model.from_pyg(m)
    before = model(synthetic.x, synthetic.edge_index)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)
    m.train()
    model.train()
    assert not model.training and all(not mod.training for mod in model.modules())
    assert torch.equal(model(synthetic.x, synthetic.edge_index), before)
    assert all(p.dtype == torch.float32 for p in model.state_dict().values())


def test_structure_accessors(synthetic):
    f = synthetic.num_features
    m = randomize(
        gnn.Sequential(
            "x, edge_index",
            [
                (torch.nn.Linear(f, 12), "x -> x"),
                torch.nn.ReLU(),
                (gnn.SAGEConv(12, 8), "x, edge_index -> x"),
                torch.nn.ELU(),
                (gnn.GCNConv(8, 4), "x, edge_index -> x"),
                torch.nn.Linear(4, 2),
            ],
        )
    )
    model = Model.from_pyg(m)
    assert model.num_layers == 2 and model.in_dim == f and model.out_dim == 2
    assert model.pre(synthetic.x).shape == (synthetic.num_nodes, 12)
    assert model.conv(0).kind == "sage" and model.conv(1).kind == "gcn"
    h = torch.randn(5, 8)
    assert torch.allclose(model.post(0, h), torch.nn.functional.elu(h))
    assert model.post(1, torch.randn(5, 4)).shape == (5, 2)
    with torch.no_grad():
        ref = m(synthetic.x, synthetic.edge_index)
    assert rel_err(model(synthetic.x, synthetic.edge_index, parts=7), ref) <= TOL


def test_deep_std_layerwise(graph):
    """Every layer of a 3-layer std GraphSAGE equals PyG's layer given the same input."""
    m = randomize(basic("SAGE_std", 3, graph.num_features), seed=3)
    model = Model.from_pyg(m)
    h = graph.x
    ei = graph.edge_index
    from sparkgnn.layers import propagate

    for l in range(3):
        with torch.no_grad():
            ref = m.convs[l](h, ei)
            if l < 2:
                ref = m.act(ref)
        for parts in PARTS:
            out = model.post(l, propagate(model.conv(l), h, ei[0], ei[1], parts=parts, seed=parts))
            assert rel_err(out, ref) <= TOL, (graph.name, l, parts)
        h = ref


def test_std_first_layer_then_others(graph):
    f = graph.num_features
    m = randomize(
        gnn.Sequential(
            "x, edge_index",
            [
                (gnn.SAGEConv(f, 16, aggr="std"), "x, edge_index -> x"),
                torch.nn.ReLU(),
                (gnn.SAGEConv(16, 16, aggr="mean"), "x, edge_index -> x"),
                torch.nn.ReLU(),
                (gnn.SAGEConv(16, NUM_CLASSES, aggr="var"), "x, edge_index -> x"),
            ],
        ),
        seed=9,
    )
    _check(m, graph, graph.x)
