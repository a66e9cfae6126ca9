"""The generic fallback (layers/generic.py): a conv sparkgnn has no native layer for runs as its own
module over whole in-edge neighbourhoods and equals PyG when the destinations are split over 1, 3 and
8 partitions; the locality probe refuses convs that are not local (written here: a global
statistic, 2-hop reads, a source's own degree); the model saves and reloads without pickle, and
what cannot be rebuilt, or is outside the allowed packages, is refused with the reason."""

import json

import pytest
import torch
import torch_geometric.nn as gnn
import torch_test_graphs as graphs
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.utils import degree

from sparkgnn.errors import ModelLoadError, UnsupportedModelError
from sparkgnn.layers.generic import GenericConv, require_states
from sparkgnn.models import Model
from sparkgnn.planner import compile as compile_plan
from sparkgnn.planner.errors import PlanError

F_IN = 24
TOL = 1e-5

GENERIC = {
    "cluster_gcn": lambda: gnn.ClusterGCNConv(F_IN, 8, diag_lambda=0.3),
    "feast_heads": lambda: gnn.FeaStConv(F_IN, 8, heads=3),
    "mf": lambda: gnn.MFConv(F_IN, 8, max_degree=6),
    "film": lambda: gnn.FiLMConv(F_IN, 8),
    "general_attention": lambda: gnn.GeneralConv(F_IN, 8, heads=2, attention=True, skip_linear=True),
}


class InDegreeMean(MessagePassing):
    """Local: scales each message by 1 / in-degree of its destination, computed from edge_index."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__(aggr="add")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lin = torch.nn.Linear(in_channels, out_channels)

    def forward(self, x, edge_index):
        deg = degree(edge_index[1], x.shape[0]).clamp(min=1)
        return self.propagate(edge_index, x=self.lin(x), norm=1.0 / deg[edge_index[1]]) + x[:, :1]

    def message(self, x_j, norm):
        return norm.view(-1, 1) * x_j


class GlobalNorm(MessagePassing):
    """Not local: divides by the mean norm of ALL node features (a global statistic)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__(aggr="add")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lin = torch.nn.Linear(in_channels, out_channels)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x)) / x.norm(dim=1).mean()


class TwoHop(MessagePassing):
    """Not local: propagates twice, so a vertex reads its sources' in-neighbours (2-hop)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__(aggr="mean")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lin = torch.nn.Linear(in_channels, out_channels)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.propagate(edge_index, x=self.lin(x)))


class SourceDegree(MessagePassing):
    """Not local: normalises by the source's in-degree (GCN-style), which a partition does not see."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__(aggr="add")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lin = torch.nn.Linear(in_channels, out_channels)

    def forward(self, x, edge_index):
        deg = degree(edge_index[1], x.shape[0]).clamp(min=1)
        return self.propagate(edge_index, x=self.lin(x), norm=deg[edge_index[0]].rsqrt())

    def message(self, x_j, norm):
        return norm.view(-1, 1) * x_j


class WithModule(InDegreeMean):
    """Local, but its constructor takes a module with weights: nothing JSON can rebuild."""

    def __init__(self, in_channels: int, out_channels: int, head: torch.nn.Module):
        super().__init__(in_channels, out_channels)
        self.head = head


def _convert(conv):
    return Model.from_pyg(graphs.randomize(conv, seed=3), output="embedding")


@pytest.mark.parametrize("case", sorted(GENERIC))
def test_generic_conv_equals_pyg_split_over_partitions(case, synthetic):
    conv = graphs.randomize(GENERIC[case](), seed=len(case))
    model = Model.from_pyg(conv, output="embedding")
    assert model.conv(0).kind == "generic" and isinstance(model.conv(0), GenericConv)
    with torch.no_grad():
        expected = conv(synthetic.x, synthetic.edge_index)
    for parts in (1, 3, 8):
        actual = model(synthetic.x, synthetic.edge_index, parts=parts, seed=parts)
        assert graphs.rel_err(actual, expected) <= TOL, (case, parts)


def test_user_local_conv_in_a_model_class(synthetic):
    """A conv written by the user that computes its normalisation from the destinations' in-degree
    is local: the probe passes and it runs in a traced model next to a native conv."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = InDegreeMean(F_IN, 16)
            self.conv2 = gnn.SAGEConv(16, 4)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    net = graphs.randomize(Net(), seed=1)
    model = Model.from_pyg(net, output="embedding")
    assert [c.kind for c in model.conv_list()] == ["generic", "sage"]
    with torch.no_grad():
        expected = net(synthetic.x, synthetic.edge_index)
    assert graphs.rel_err(model(synthetic.x, synthetic.edge_index, parts=3), expected) <= TOL


class GenericSkips(torch.nn.Module):
    """A generic conv whose input is carried through its round to a residual add, and a
    JumpingKnowledge('max') over it and a native conv (layers/dag.py CarryRound)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(F_IN, 8)
        self.conv1 = gnn.FeaStConv(8, 8, heads=2)
        self.conv2 = gnn.GCNConv(8, 8)
        self.jump = gnn.JumpingKnowledge("max")

    def forward(self, x, edge_index):
        x = self.lin(x).relu()
        h1 = x + self.conv1(x, edge_index).relu()
        h2 = self.conv2(h1, edge_index).relu()
        return self.jump([h1, h2])


def test_generic_conv_carries_skip_columns(synthetic, tmp_path):
    net = graphs.randomize(GenericSkips(), seed=4)
    model = Model.from_pyg(net, output="embedding")
    assert model.plan_info()[0]["whole_neighbourhoods"] is True
    with torch.no_grad():
        expected = net(synthetic.x, synthetic.edge_index)
    for parts in (1, 3, 8):
        actual = model(synthetic.x, synthetic.edge_index, parts=parts, seed=parts)
        assert graphs.rel_err(actual, expected) <= TOL, parts
    model.save(tmp_path / "m")
    loaded = Model.load(tmp_path / "m")
    assert torch.equal(
        loaded(synthetic.x, synthetic.edge_index, parts=3), model(synthetic.x, synthetic.edge_index, parts=3)
    )
    with pytest.raises(UnsupportedModelError, match="layer 0 .*whole in-edge neighbourhoods"):
        require_states(model, "the PE precompute")


@pytest.mark.parametrize("cls", [GlobalNorm, TwoHop, SourceDegree], ids=lambda c: c.__name__)
def test_probe_refuses_non_local_convs_by_name(cls):
    with pytest.raises(UnsupportedModelError) as info:
        _convert(cls(F_IN, 8))
    msg = str(info.value)
    assert f"model ({cls.__name__})" in msg and "not local" in msg and "probe graph" in msg, msg
    assert "\n" not in msg


def test_forward_needing_more_inputs_is_refused():
    with pytest.raises(UnsupportedModelError, match=r"PointNetConv.*forward\(\) needs \['edge_index'\]"):
        _convert(gnn.PointNetConv())


def test_plan_runs_generic_layers_on_replicate_only():
    model = _convert(gnn.FeaStConv(F_IN, 8))
    layers = model.plan_info()
    assert layers[0]["whole_neighbourhoods"] is True
    stats = {"num_vertices": 1000, "num_edges": 8000, "feature_dim": F_IN, "partitions": 3}
    stats.update(mirror_rows=900, combine_rows=2000, in_mirror_rows=900, max_partition_edges=3000)
    task = {"strategy": "auto", "cores": 2, "memory_per_task_bytes": 1 << 30}
    assert compile_plan(layers, stats, task).layers[0].strategy == "replicate"
    for strategy in ("edge_join", "combine"):
        with pytest.raises(PlanError, match="whole in-edge neighbourhood.*only replicate"):
            compile_plan(layers, stats, {**task, "strategy": strategy})


def test_state_based_jobs_refuse_a_generic_model_in_one_line(synthetic, tmp_path):
    from sparkgnn.graph.data import GraphData
    from sparkgnn.pe.local import precompute_local
    from sparkgnn.pe.refresh import refresh_local
    from sparkgnn.serving import QueryEngine

    model = _convert(gnn.FeaStConv(F_IN, 8))
    with pytest.raises(UnsupportedModelError) as info:
        require_states(model, "the PE precompute")
    assert "layer 0 (torch_geometric.nn.conv.feast_conv.FeaStConv)" in str(info.value)
    assert "\n" not in str(info.value)
    n = synthetic.num_nodes
    graph = GraphData(
        ids=torch.arange(n).numpy(),
        x=synthetic.x.numpy(),
        edge_src=synthetic.edge_index[0].numpy(),
        edge_dst=synthetic.edge_index[1].numpy(),
    )
    with pytest.raises(UnsupportedModelError, match="the PE precompute needs every layer's merged"):
        precompute_local(graph, model, str(tmp_path / "store"))
    with pytest.raises(UnsupportedModelError, match="a PE store refresh needs"):
        refresh_local(graph, None, model, str(tmp_path / "store"))
    with pytest.raises(UnsupportedModelError, match="serving mode 'exact' needs"):
        QueryEngine(graph, model, mode="exact")


def test_save_load_round_trip_without_pickle(synthetic, tmp_path):
    conv = graphs.randomize(gnn.GeneralConv(F_IN, 8, heads=2, attention=True), seed=2)
    model = Model.from_pyg(torch.nn.Sequential(conv, torch.nn.ReLU(), gnn.FeaStConv(8, 4)), output="embedding")
    model.save(tmp_path / "m")
    spec = json.loads((tmp_path / "m" / "model.json").read_text())["spec"]
    assert spec["convs"][0]["conv_class"] == "torch_geometric.nn.conv.general_conv.GeneralConv"
    assert spec["convs"][0]["arguments"]["attention"] is True and spec["convs"][0]["arguments"]["heads"] == 2
    loaded = Model.load(tmp_path / "m")
    assert loaded.fingerprint() == model.fingerprint()
    x, ei = synthetic.x, synthetic.edge_index
    assert torch.equal(loaded(x, ei, parts=3), model(x, ei, parts=3))


def test_load_refuses_what_cannot_be_rebuilt(tmp_path):
    """A user's conv class loads only when the loader allows its module; a conv whose constructor
    arguments have no JSON form is refused at conversion, naming the argument; a saved class that
    no longer reproduces the saved output is refused at load."""
    model = _convert(InDegreeMean(F_IN, 8))
    model.save(tmp_path / "user")
    with pytest.raises(ModelLoadError, match=rf"outside the allowed packages.*allow_modules=\['{__name__}'\]"):
        Model.load(tmp_path / "user")
    loaded = Model.load(tmp_path / "user", allow_modules=[__name__])
    assert loaded.fingerprint() == model.fingerprint()

    with pytest.raises(UnsupportedModelError, match=r"WithModule.*constructor argument head=.*no JSON form"):
        _convert(WithModule(F_IN, 8, torch.nn.Linear(8, 8)))

    conv = model.conv(0)
    assert isinstance(conv, GenericConv)
    with torch.no_grad():
        conv.module.lin.bias.add_(1.0)  # weights that no longer give the recorded probe output
    with pytest.raises(UnsupportedModelError, match="does not reproduce the saved conv's output"):
        conv.verify()


def test_a_generic_model_runs_in_its_own_batch():
    """Model batching shares per-edge messages; the generic conv has none, so it is never bundled."""
    from torch_geometric.nn import GCNConv

    from sparkgnn.models.batching import plan_batches, why_incompatible

    generic = _convert(gnn.FeaStConv(F_IN, 8))
    native = Model.from_pyg(torch.nn.Sequential(GCNConv(F_IN, 8)), output="embedding")
    reason = why_incompatible([generic, native], ["feast", "gcn"])
    assert reason is not None and "feast" in reason and "generic fallback" in reason
    assert sorted(map(sorted, plan_batches([generic, native], ["feast", "gcn"]))) == [[0], [1]]
