"""plan_info is pure data for the torch-free planner and agrees with what the layers do."""

import json

import torch
import torch_geometric.nn as gnn

import sparkgnn
from sparkgnn.models import Model

KEYS = {
    "index",
    "kind",
    "in_dim",
    "out_dim",
    "aggregator",
    "src_width",
    "dst_width",
    "msg_width",
    "state_width",
    "needs_dst_in_message",
    "can_pre_transform",
    "self_loops",
    "uses_edge_weight",
    "required_stats",
    "decomposable",
    "range_wise",
}


def _pure(obj):
    if isinstance(obj, dict):
        return all(isinstance(k, str) and _pure(v) for k, v in obj.items())
    if isinstance(obj, list):
        return all(_pure(v) for v in obj)
    return obj is None or isinstance(obj, (bool, int, float, str))


def test_plan_info_content():
    pyg = gnn.Sequential(
        "x, edge_index, edge_weight",
        [
            (gnn.GCNConv(100, 16), "x, edge_index, edge_weight -> x"),
            torch.nn.ReLU(),
            (gnn.SAGEConv(16, 8, aggr="max"), "x, edge_index -> x"),
            torch.nn.ReLU(),
            (gnn.GATConv(8, 4, heads=3), "x, edge_index -> x"),
            torch.nn.ReLU(),
            (gnn.GINConv(torch.nn.Sequential(torch.nn.Linear(12, 6), torch.nn.ReLU())), "x, edge_index -> x"),
            (gnn.SAGEConv(6, 5, aggr="std"), "x, edge_index -> x"),
        ],
    )
    model = Model.from_pyg(pyg)
    info = model.plan_info()
    assert json.loads(json.dumps(info)) == info and _pure(info)
    assert [i["index"] for i in info] == list(range(5))
    for i, entry in enumerate(info):
        assert KEYS <= set(entry), KEYS - set(entry)
        assert entry["decomposable"] is True
        conv = model.conv(i)
        for mode, pre in (("raw", False), ("pre_transform", True)):
            assert entry["src_width"][mode] == conv.src_width(pre)
            assert entry["msg_width"][mode] == conv.msg_width(pre)
            assert entry["state_width"][mode] == conv.state_width(pre)
    gcn, sage, gat, gin, std = info
    assert gcn["kind"] == "gcn" and gcn["self_loops"] == "remaining"
    assert gcn["uses_edge_weight"] and gcn["required_stats"] == ["gcn_degree"]
    assert gcn["src_width"] == {"raw": 100, "pre_transform": 16} and gcn["can_pre_transform"]
    assert sage["aggregator"] == "max" and not sage["can_pre_transform"]
    assert sage["src_width"] == {"raw": 16, "pre_transform": 16} and sage["self_loops"] == "none"
    assert gat["needs_dst_in_message"] and gat["dst_width"] == 3 and gat["self_loops"] == "replace"
    assert gat["aggregator"] == "softmax" and gat["msg_width"]["raw"] == 3 + 12
    assert gat["state_width"]["pre_transform"] == 3 + 3 + 12
    assert gat["src_width"] == {"raw": 8, "pre_transform": 15}
    assert gin["aggregator"] == "sum" and gin["src_width"] == {"raw": 12, "pre_transform": 6}
    assert std["aggregator"] == "std" and std["state_width"]["raw"] == 2 * 6 + 1
    assert not std["uses_edge_weight"] and std["required_stats"] == []
    # range-wise: sparse-product aggregations (sum / mean) whose update and post read one row
    assert [entry["range_wise"] for entry in info] == [True, False, False, True, False]


def test_a_post_op_that_is_not_row_wise_makes_the_layer_whole():
    model = Model.from_pyg(gnn.GraphSAGE(16, 32, 2))
    assert [entry["range_wise"] for entry in model.plan_info()] == [True, True]
    model.post_list()[0].ops[0].row_wise = False  # e.g. a norm over all rows
    assert [entry["range_wise"] for entry in model.plan_info()] == [False, True]


def test_spec_and_lazy_export():
    model = sparkgnn.Model.from_pyg(gnn.GCN(10, 8, 2, out_channels=3))
    assert isinstance(model, Model)
    spec = model.spec
    assert json.loads(json.dumps(spec)) == spec and _pure(spec)
    assert spec["output"] == "logits" and spec["in_dim"] == 10 and spec["out_dim"] == 3
    assert [c["kind"] for c in spec["convs"]] == ["gcn", "gcn"]
    assert spec["post"][0] == [{"op": "activation", "name": "relu"}] and spec["post"][1] == []
    assert spec["source"].endswith("GCN")


def test_nested_torch_containers_flatten():
    seq = torch.nn.Sequential(
        gnn.GCNConv(6, 4),
        torch.nn.Sequential(torch.nn.ReLU(), gnn.GCNConv(4, 3)),
        torch.nn.ModuleList([torch.nn.Linear(3, 2)]),
    )
    model = Model.from_pyg(seq)
    assert model.num_layers == 2 and model.out_dim == 2
