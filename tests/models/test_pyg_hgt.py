"""PyG's HGTConv converted to typed rounds (models/pyg_hgt.py through models/from_pyg_hetero.py):
the converted model equals PyG's forward (float32, 1e-5) under any partitioning, on a typed graph
with self loops, parallel edges, isolated vertices and a type without features, in the shapes PyG
users write (dict comprehensions over HGT's result, the result passed whole to the next HGTConv, a
Linear head on one type, a type no relation points into); it saves, loads and fingerprints; an
HGTConv called with other relations than it was built for, or given to the homogeneous converter, is
refused in one line."""

import os
import sys

import pytest
import torch
from torch_geometric.data import HeteroData
from torch_geometric.nn import HGTConv, Linear

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.models import Model
from sparkgnn.models.hetero import HeteroModel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pe"))
from typed_testkit import WRITES, hgt_module, pyg_data, ready  # noqa: E402


def _assert_equal(module, d: HeteroData, parts=(1, 3, 8)) -> HeteroModel:
    reference = module(d.x_dict, d.edge_index_dict)
    model = HeteroModel.from_pyg(module, d.metadata())
    if not isinstance(reference, dict):
        reference = {model.outputs[0]: reference}
    assert model.outputs == list(reference)
    for p in parts:
        got = model(d.x_dict, d.edge_index_dict, parts=p, seed=p)
        for t, ref in reference.items():
            torch.testing.assert_close(got[t], ref, rtol=1e-5, atol=1e-5)
    return model


@pytest.mark.parametrize("heads", [1, 2, 4])
def test_two_hgt_rounds_equal_pyg(heads):
    d = pyg_data()
    model = _assert_equal(hgt_module(d, heads=heads), d)
    rounds = model.describe()["rounds"]
    assert [r["aggr"] for r in rounds] == ["softmax", "softmax"] and len(rounds[0]["convs"]) == 5
    # the first round keeps the width (8): its output op gates with the carried input row
    assert rounds[0]["post"]["paper"][0] == {"op": "hgt_output", "channels": 8, "carry": 8}
    assert rounds[1]["post"]["paper"] == [{"op": "hgt_output", "channels": 4, "carry": 0}]


class _Dblp(torch.nn.Module):
    """PyG's examples/hetero/hgt_dblp.py: in-place relu, HGT's result passed whole, a Linear head."""

    def __init__(self, metadata):
        super().__init__()
        self.lin_dict = torch.nn.ModuleDict({t: Linear(-1, 8) for t in metadata[0]})
        self.convs = torch.nn.ModuleList([HGTConv(8, 8, metadata, heads=2) for _ in range(2)])
        self.lin = Linear(8, 3)

    def forward(self, x_dict, edge_index_dict):
        x_dict = {t: self.lin_dict[t](x).relu_() for t, x in x_dict.items()}
        for conv in self.convs:
            x_dict = conv(x_dict, edge_index_dict)
        return self.lin(x_dict["author"])


def test_pygs_hgt_example_shape_equals_pyg_and_saves(tmp_path):
    d = pyg_data()
    model = _assert_equal(ready(_Dblp(d.metadata()), d), d)
    assert model.outputs == ["author"] and model.output == "logits"
    model.save(tmp_path / "m")
    loaded = HeteroModel.load(tmp_path / "m")
    assert loaded.fingerprint() == model.fingerprint()
    torch.testing.assert_close(
        loaded(d.x_dict, d.edge_index_dict, parts=3)["author"], model(d.x_dict, d.edge_index_dict)["author"]
    )


def test_a_type_no_relation_points_into_gets_no_hgt_output():
    d = pyg_data()
    for et in list(d.edge_types):
        if et[2] != "paper":  # author and field are sources only
            del d[et]
    meta = d.metadata()
    net = torch.nn.Module()
    net.lin = torch.nn.ModuleDict({t: Linear(-1, 8) for t in meta[0]})
    net.conv = HGTConv(8, 8, meta, heads=2)
    net.forward = lambda x_dict, ei: net.conv({t: net.lin[t](x) for t, x in x_dict.items()}, ei)
    model = _assert_equal(ready(net, d), d)
    assert model.outputs == ["paper"]


def test_hgt_called_with_other_relations_than_it_was_built_for_or_without_types_is_refused():
    d = pyg_data()
    meta = d.metadata()
    net = torch.nn.Module()
    net.lin = torch.nn.ModuleDict({t: Linear(-1, 8) for t in meta[0]})
    net.conv = HGTConv(8, 8, meta, heads=2)
    net.forward = lambda x_dict, ei: net.conv(
        {t: net.lin[t](x) for t, x in x_dict.items()}, {e: v for e, v in ei.items() if e != WRITES}
    )
    ready(net, d)
    with pytest.raises(UnsupportedModelError, match=r"HGTConv\) is called with relations .* but built for") as info:
        HeteroModel.from_pyg(net, meta)
    assert "\n" not in str(info.value)
    with pytest.raises(UnsupportedModelError, match="a typed conv .* HeteroModel.from_pyg converts it") as info:
        Model.from_pyg(net.conv)
    assert "\n" not in str(info.value)
