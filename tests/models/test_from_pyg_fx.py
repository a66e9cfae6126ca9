"""Model.from_pyg on hand-written model classes (models.pyg_fx): the forward is traced with torch.fx
and mapped onto the chain normal form. The classes are the examples' (examples/models/, written
the way PyG's tutorials write models) and a few more written here; each converted model equals
the class's eval forward (1e-5 relative) through Model.forward's partitioned propagate and after a
save/load round trip. What is not a chain (a
residual add), cannot be traced (control flow on tensor values), is graph-level (pooling over a
`batch` vector) or is unknown is refused, naming the source line and why."""

import logging

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as gnn
from gat_cora import GAT as TutorialGAT
from gcn_cora import GCN as TutorialGCN
from jk_cora import JKNet
from residual_cora import ResGNN
from sage_cora import SAGE
from torch_geometric.nn import GCNConv, SAGEConv
from torch_test_graphs import randomize, rel_err

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.models import Model

PARTS = (1, 3, 7)
CLASSES = 5


class WeightedGCN(TutorialGCN):
    def forward(self, x, edge_index, edge_weight=None):
        x = F.relu(self.conv1(x, edge_index, edge_weight))
        x = F.dropout(x, training=self.training)
        return self.conv2(x, edge_index, edge_weight)


class SAGEWithHead(SAGE):
    """The example's SAGE with a max aggregation in its second conv."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__(in_channels, hidden_channels, out_channels)
        self.conv2 = SAGEConv(hidden_channels, hidden_channels, aggr="max")


class Block(torch.nn.Module):
    """A plain submodule (not a leaf): fx traces through its forward."""

    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x):
        return F.leaky_relu(self.norm(x), negative_slope=0.2)


class Normalized(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.lin_in = torch.nn.Linear(in_channels, hidden_channels)
        self.conv1 = GCNConv(hidden_channels, hidden_channels)
        self.bn1 = torch.nn.BatchNorm1d(hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, hidden_channels)
        self.block = Block(hidden_channels)
        self.conv3 = GCNConv(hidden_channels, out_channels)
        self.norm3 = gnn.LayerNorm(out_channels, mode="node")

    def forward(self, x, edge_index):
        x = torch.tanh(self.lin_in(x))
        x = self.conv1(x, edge_index)
        x = self.bn1(x).relu()
        x = self.conv2(x, edge_index)
        x = self.block(x)
        x = self.conv3(x, edge_index)
        x = F.gelu(self.norm3(x))
        return F.normalize(x, p=2, dim=-1)


class ResidualInput(TutorialGCN):
    """The conv's input and a value saved before the pre ops: a residual over the raw features
    (a Linear first, the GCN widths are the hidden width) and one over the first conv's output."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__(hidden_channels, hidden_channels, hidden_channels)
        self.lin = torch.nn.Linear(in_channels, hidden_channels)
        self.skip = torch.nn.Linear(in_channels, hidden_channels)  # unused: never traced
        self.head = torch.nn.Linear(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        x = self.lin(x)
        h = self.conv1(x, edge_index)
        h = F.elu(h) + h
        h = self.conv2(h, edge_index) + x
        return self.head(h)


class ConcatGAT(torch.nn.Module):
    """torch.cat of two rounds' outputs (a GAT's and a SAGE's) along the features, then LayerNorm."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = gnn.GATConv(in_channels, hidden_channels, heads=2)
        self.conv2 = SAGEConv(2 * hidden_channels, out_channels)
        self.norm = torch.nn.LayerNorm(2 * hidden_channels + out_channels)

    def forward(self, x, edge_index):
        h1 = F.elu(self.conv1(x, edge_index))
        h2 = self.conv2(h1, edge_index)
        return self.norm(torch.cat([h1, h2], dim=-1))


MODELS = {
    "tutorial_gcn": (lambda f: TutorialGCN(f, 16, CLASSES), "logits"),
    "weighted_gcn": (lambda f: WeightedGCN(f, 16, CLASSES), "logits"),
    "sage_head": (lambda f: SAGEWithHead(f, 16, CLASSES), "logits"),
    "gat": (lambda f: TutorialGAT(f, 8, CLASSES, heads=2), "logits"),
    "norms": (lambda f: Normalized(f, 16, 8), "embedding"),
    # skip connections (layers/dag.py): residual adds, jumping knowledge, a concatenation
    "residual": (lambda f: ResGNN(f, 16, CLASSES), "logits"),
    "residual_input": (lambda f: ResidualInput(f, 16, CLASSES), "logits"),
    "jk_cat": (lambda f: JKNet(f, 8, CLASSES), "logits"),
    "jk_max": (lambda f: JKNet(f, 8, CLASSES, mode="max"), "logits"),
    "concat_gat": (lambda f: ConcatGAT(f, 8, CLASSES), "embedding"),
}


def _reference(module, graph, weighted):
    with torch.no_grad():
        if weighted:
            return module(graph.x, graph.edge_index, graph.edge_weight)
        return module(graph.x, graph.edge_index)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_traced_class_equals_pyg_and_round_trips(name, graph, tmp_path, caplog):
    build, output = MODELS[name]
    module = randomize(build(graph.num_features), seed=len(name))
    weighted = name == "weighted_gcn"
    expected = _reference(module, graph, weighted)
    caplog.set_level(logging.INFO, logger="sparkgnn.models.from_pyg")
    model = Model.from_pyg(module)
    assert model.output == output, caplog.messages
    weight = graph.edge_weight if weighted else None
    for parts in PARTS:
        actual = model(graph.x, graph.edge_index, weight, parts=parts, seed=parts)
        assert rel_err(actual, expected) <= 1e-5, (name, parts, rel_err(actual, expected))
    model.save(tmp_path / "m")
    loaded = Model.load(tmp_path / "m")
    assert loaded.describe() == model.describe()
    assert rel_err(loaded(graph.x, graph.edge_index, weight, parts=3), expected) <= 1e-5


def test_the_tutorial_models_map_onto_the_chain(synthetic):
    spec = Model.from_pyg(randomize(TutorialGCN(synthetic.num_features, 16, CLASSES))).describe()
    assert [c["kind"] for c in spec["convs"]] == ["gcn", "gcn"]
    assert spec["convs"][0]["use_edge_weight"] is False  # the forward passes no edge weights
    assert spec["post"] == [[{"op": "activation", "name": "relu"}], [{"op": "activation", "name": "log_softmax"}]]
    weighted = Model.from_pyg(randomize(WeightedGCN(synthetic.num_features, 16, CLASSES))).describe()
    assert [c["use_edge_weight"] for c in weighted["convs"]] == [True, True]
    norms = Model.from_pyg(randomize(Normalized(synthetic.num_features, 16, 8))).describe()
    assert [op["op"] for op in norms["pre"]] == ["linear", "activation"]
    assert [[op["op"] for op in post] for post in norms["post"]] == [
        ["batchnorm", "activation"],
        ["layernorm", "activation"],
        ["layernorm", "activation", "normalize"],
    ]


class Branch(TutorialGCN):
    """Two convs reading the same input side by side: the second does not read the first's result."""

    def forward(self, x, edge_index):
        a = self.conv1(x, edge_index)
        return a + self.conv2(x, edge_index)


class ScaledResidual(TutorialGCN):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__(in_channels, in_channels, in_channels)

    def forward(self, x, edge_index):
        x = self.conv1(x, edge_index).relu()
        return x + 0.5 * self.conv2(x, edge_index)


class LSTMJumpingKnowledge(JKNet):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__(in_channels, hidden_channels, out_channels, mode="max")
        self.jump = gnn.JumpingKnowledge("lstm", channels=hidden_channels, num_layers=3)


class CatOverNodes(TutorialGCN):
    def forward(self, x, edge_index):
        x = self.conv1(x, edge_index).relu()
        return torch.cat([x, self.conv2(x, edge_index)], dim=0)


class ControlFlow(TutorialGCN):
    def forward(self, x, edge_index):
        x = self.conv1(x, edge_index).relu()
        if x.sum() > 0:
            x = x * 2
        return self.conv2(x, edge_index)


class GraphLevel(TutorialGCN):
    def forward(self, x, edge_index, batch):
        x = self.conv1(x, edge_index).relu()
        x = self.conv2(x, edge_index)
        return gnn.global_mean_pool(x, batch)


class UnknownOp(TutorialGCN):
    def forward(self, x, edge_index):
        x = self.conv1(x, edge_index).relu()
        return torch.cumsum(self.conv2(x, edge_index), dim=1)


class SoftmaxOverNodes(TutorialGCN):
    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index), edge_index).softmax(dim=0)


class RefusedConv(torch.nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.conv1 = gnn.ChebConv(in_channels, 4, K=2, normalization=None)

    def forward(self, x, edge_index):
        return self.conv1(x, edge_index)


class TwoOutputs(TutorialGCN):
    def forward(self, x, edge_index):
        x = self.conv2(self.conv1(x, edge_index).relu(), edge_index)
        return x, edge_index


REFUSALS = [
    # (class, substrings the message must contain: the source line and the reason)
    (Branch, ["`return a + self.conv2(x, edge_index)`", "conv2 does not read the previous op's result"]),
    (ScaledResidual, ["`return x + 0.5 * self.conv2(x, edge_index)`", "operator 'mul'", "not a supported"]),
    (LSTMJumpingKnowledge, ["model.jump (JumpingKnowledge)", "mode='lstm'", "'cat' and 'max' are supported"]),
    (CatOverNodes, ["torch.cat", "feature axis"]),
    (ControlFlow, ["test_from_pyg_fx.py", "`if x.sum() > 0:`", "control flow"]),
    (GraphLevel, ["GraphLevel", "'batch'", "graph-level"]),
    (UnknownOp, ["`return torch.cumsum(self.conv2(x, edge_index), dim=1)`", "torch.cumsum is not a supported"]),
    (SoftmaxOverNodes, ["softmax(dim=0)", "dim=0", "feature axis"]),
    (RefusedConv, ["model.conv1", "ChebConv", "normalization=None", "largest degree"]),
    (TwoOutputs, ["several values"]),
]


@pytest.mark.parametrize(("cls", "needles"), REFUSALS, ids=[c.__name__ for c, _ in REFUSALS])
def test_what_is_not_a_traceable_chain_is_refused_naming_line_and_reason(cls, needles):
    module = cls(8) if cls is RefusedConv else cls(8, 16, CLASSES)
    with pytest.raises(UnsupportedModelError) as info:
        Model.from_pyg(module.eval())
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, (needle, msg)
    assert msg.count("\n") == 0, msg  # one clear line


def test_skip_connections_ride_in_the_rows_only_while_a_later_op_reads_them(synthetic):
    """JK-cat over three SAGE rounds: each round's output is saved, carried through the next
    rounds' rows after the conv's input (the rounds' in_dim counts them, so the planner prices
    them) and dropped at the concatenation; the payloads shipped to edges stay the conv's own."""
    features = synthetic.num_features
    model = Model.from_pyg(randomize(JKNet(features, 8, CLASSES)))
    spec = model.describe()
    assert [[op["op"] for op in post] for post in spec["post"]] == [
        ["activation", "save"],
        ["activation", "save"],
        ["activation", "combine", "linear"],
    ]
    assert spec["post"][2][1] == {"op": "combine", "mode": "cat", "inputs": ["s0", "s1", "h"], "widths": [8, 8, 8]}
    info = model.plan_info()
    assert [i["in_dim"] for i in info] == [features, 8 + 8, 8 + 16]
    assert [i["out_dim"] for i in info] == [8, 8 + 8, 8 + 16]
    assert [i["src_width"]["raw"] for i in info] == [features, 8, 8]
    assert model.out_dim == CLASSES and model.is_dag
    assert not Model.from_pyg(randomize(TutorialGCN(features, 16, CLASSES))).is_dag
