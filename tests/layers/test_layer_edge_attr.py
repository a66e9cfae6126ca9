"""Convs that read edge features (GINEConv, GATConv / GATv2Conv with edge_dim), converted from
PyG, equal PyG's eval forward on the corner-case graph (self loops, duplicated self loops,
parallel edges, isolated vertices) with random edge attributes, the aggregation split over 1, 3
and 7 random partitions, in both payload modes; the self-loop fill is PyG's fill_value="mean"."""

import pytest
import torch
import torch_geometric.nn as gnn
import torch_test_graphs as graphs
from torch_geometric.utils import add_self_loops, remove_self_loops

from sparkgnn.layers import propagate
from sparkgnn.layers.selfloops import apply_self_loops
from sparkgnn.models import Model
from sparkgnn.models.pyg_convs import conv_layer

TOL = 1e-5
D = 5


def _mlp(i, o):
    return torch.nn.Sequential(torch.nn.Linear(i, 16), torch.nn.ReLU(), torch.nn.Linear(16, o))


CONVS = {
    "gine_edge_dim": lambda f: gnn.GINEConv(_mlp(f, 8), train_eps=True, edge_dim=D),
    "gine_same_width": lambda f: gnn.GINEConv(torch.nn.Linear(f, 8)),
    "gat": lambda f: gnn.GATConv(f, 6, heads=3, edge_dim=D),
    "gat_mean_heads_no_loops": lambda f: gnn.GATConv(f, 6, heads=2, concat=False, edge_dim=D, add_self_loops=False),
    "gat_residual": lambda f: gnn.GATConv(f, 6, heads=2, edge_dim=D, residual=True),
    "gatv2": lambda f: gnn.GATv2Conv(f, 6, heads=3, edge_dim=D),
    "gatv2_shared": lambda f: gnn.GATv2Conv(f, 6, heads=2, edge_dim=D, share_weights=True, concat=False),
    "transformer": lambda f: gnn.TransformerConv(f, 4, heads=3, edge_dim=D),
    "transformer_mean_beta": lambda f: gnn.TransformerConv(f, 5, heads=2, concat=False, beta=True, edge_dim=D),
}


def _attr(graph, width):
    return torch.randn(graph.edge_index.shape[1], width, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("name", sorted(CONVS))
def test_edge_attr_conv_equals_pyg(name, synthetic):
    conv = CONVS[name](synthetic.num_features)
    graphs.randomize(conv)
    conv.eval()
    attr = _attr(synthetic, synthetic.num_features if name == "gine_same_width" else D)
    with torch.no_grad():
        expected = conv(synthetic.x, synthetic.edge_index, attr)
    layer = conv_layer(conv, "conv")
    assert layer.edge_attr_dim == attr.shape[1]
    for parts in (1, 3, 7):
        for pre in (False, True):
            out = propagate(
                layer, synthetic.x, *synthetic.edge_index, parts=parts, seed=parts, pre_transform=pre, edge_attr=attr
            )
            assert graphs.rel_err(out, expected) <= TOL, (name, parts, pre)


def test_replace_mean_fills_loops_like_pyg(synthetic):
    attr = _attr(synthetic, D)
    ei, ea = remove_self_loops(synthetic.edge_index, attr)
    ei, ea = add_self_loops(ei, ea, fill_value="mean", num_nodes=synthetic.num_nodes)
    src, dst, got = apply_self_loops(*synthetic.edge_index, attr, synthetic.num_nodes, "replace_mean")
    assert torch.equal(torch.stack([src, dst]), ei)
    assert graphs.rel_err(got, ea) <= TOL
    isolated = synthetic.num_nodes - 1  # the graph's last vertices touch no edge: their loop reads 0
    assert torch.equal(got[-1], torch.zeros(D)) and int(dst[-1]) == isolated


class _Net(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.conv1 = gnn.GATv2Conv(f, 8, heads=2, edge_dim=D)
        self.conv2 = gnn.GINEConv(_mlp(16, 4), edge_dim=D)

    def forward(self, x, edge_index, edge_attr):
        x = self.conv1(x, edge_index, edge_attr).relu()
        return self.conv2(x, edge_index, edge_attr=edge_attr)


def test_model_class_with_edge_attr_converts_saves_and_refuses_missing_attr(synthetic, tmp_path):
    net = _Net(synthetic.num_features)
    graphs.randomize(net)
    net.eval()
    attr = _attr(synthetic, D)
    with torch.no_grad():
        expected = net(synthetic.x, synthetic.edge_index, attr)
    model = Model.from_pyg(net)
    assert model.edge_attr_dim == D
    assert graphs.rel_err(model(synthetic.x, synthetic.edge_index, parts=3, edge_attr=attr), expected) <= TOL
    model.save(tmp_path / "m")
    again = Model.load(tmp_path / "m")
    assert graphs.rel_err(again(synthetic.x, synthetic.edge_index, edge_attr=attr), expected) <= TOL
    with pytest.raises(ValueError, match=r"read edge features \(edge_attr, width 5\) but forward's input has none"):
        model(synthetic.x, synthetic.edge_index)
    with pytest.raises(ValueError, match="reads edge_attr of width 5 but forward's input has width 2"):
        model(synthetic.x, synthetic.edge_index, edge_attr=attr[:, :2])
