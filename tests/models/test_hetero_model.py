"""Typed models (models/hetero.py, models/from_pyg_hetero.py): PyG's to_hetero output, HeteroConv
stacks and RGCN models convert to a HeteroModel whose partition-split forward equals PyG's eval
forward (float32, 1e-5) on IMDB's real types and on a synthetic typed graph with self loops,
parallel edges, isolated vertices and a type without features (fed a constant column, as PyG
users do); saved models load (weights_only) to the same fingerprint; what does not fit is
refused in one line."""

import os
import sys

import numpy as np
import pytest
import torch
from torch_geometric.data import HeteroData
from torch_geometric.nn import (
    FastRGCNConv,
    GATConv,
    GCNConv,
    GraphConv,
    HeteroConv,
    HGTConv,
    Linear,
    RGCNConv,
    SAGEConv,
    to_hetero,
)

from sparkgnn.errors import ModelLoadError, UnsupportedModelError
from sparkgnn.models import Model
from sparkgnn.models.hetero import HeteroModel, refuse_typed

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pe"))
from typed_testkit import pyg_data as _synthetic  # noqa: E402  (the typed graph the typed tests share)


@pytest.fixture(scope="module")
def imdb() -> HeteroData:
    """IMDB with its real types, built from the bundled files' global ids (movies < 4661,
    directors 4661..6930, actors >= 6931), director / actor -> movie and the reverse relations."""
    from sparkgnn.datasets.imdb import load_imdb

    g = load_imdb(reverse=False)
    order = np.argsort(g.ids)
    x = torch.from_numpy(np.asarray(g.x)[order])
    d = HeteroData()
    bounds = {"movie": (0, 4661), "director": (4661, 6931), "actor": (6931, len(order))}
    for t, (lo, hi) in bounds.items():
        d[t].x = x[lo:hi]
    src, dst = torch.from_numpy(g.edge_src), torch.from_numpy(g.edge_dst)
    for t, rel in (("director", "directed"), ("actor", "acted_in")):
        lo, hi = bounds[t]
        sel = (src >= lo) & (src < hi)
        ei = torch.stack([src[sel] - lo, dst[sel]])
        d[t, rel, "movie"].edge_index = ei
        d["movie", f"rev_{rel}", t].edge_index = ei.flip(0)
    return d


class _Net(torch.nn.Module):
    """A per-type input Linear, then two convs: what to_hetero is given in PyG's examples."""

    def __init__(self, conv, hidden=8, out=3):
        super().__init__()
        self.lin = Linear(-1, hidden)
        self.dropout = torch.nn.Dropout(0.5)
        self.conv1 = conv(hidden)
        self.conv2 = SAGEConv((-1, -1), out)

    def forward(self, x, edge_index):
        x = self.dropout(self.lin(x).relu())
        x = self.conv1(x, edge_index).relu()
        return self.conv2(x, edge_index)


class _HeteroConvNet(torch.nn.Module):
    """HeteroConv stacks mixing SAGE and GAT, per-type code between them, one output type."""

    def __init__(self, metadata, aggr, hidden=8):
        super().__init__()
        self.lin = torch.nn.ModuleDict({t: Linear(-1, hidden) for t in metadata[0]})

        def conv(i, e):
            return SAGEConv(hidden, hidden) if i % 2 else GATConv(hidden, hidden, heads=1, add_self_loops=e[0] == e[2])

        self.convs = torch.nn.ModuleList(
            [HeteroConv({e: conv(i, e) for i, e in enumerate(metadata[1])}, aggr=aggr) for _ in range(2)]
        )
        self.out = Linear(hidden, 2)

    def forward(self, x_dict, edge_index_dict):
        x_dict = {t: self.lin[t](x).relu() for t, x in x_dict.items()}
        for conv in self.convs:
            x_dict = conv(x_dict, edge_index_dict)
            x_dict = {t: x.relu() for t, x in x_dict.items()}
        return self.out(x_dict["paper"])


class _BakedDropout(_Net):
    """F.dropout(training=self.training): to_hetero traces a training model, so the flag is fixed True."""

    def __init__(self):
        super().__init__(lambda h: SAGEConv((-1, -1), h))

    def forward(self, x, edge_index):
        x = torch.nn.functional.dropout(self.lin(x), p=0.5, training=self.training)
        return self.conv2(self.conv1(x, edge_index), edge_index)


def _ready(model, data):
    torch.manual_seed(0)
    model(data.x_dict, data.edge_index_dict)  # materialise lazy parameters
    return model.eval()


def _assert_equal(model, data, parts=(1, 3, 8)):
    reference = model(data.x_dict, data.edge_index_dict)
    converted = HeteroModel.from_pyg(model, data.metadata())
    if not isinstance(reference, dict):
        reference = {converted.outputs[0]: reference}
    assert converted.outputs == list(reference)
    for p in parts:
        got = converted(data.x_dict, data.edge_index_dict, parts=p, seed=p)
        for t, ref in reference.items():
            torch.testing.assert_close(got[t], ref, rtol=1e-5, atol=1e-5)
    return converted


@pytest.mark.parametrize("aggr", ["sum", "mean", "max"])
def test_to_hetero_sage_equals_pyg(aggr):
    data = _synthetic()
    model = _ready(to_hetero(_Net(lambda h: SAGEConv((-1, -1), h)), data.metadata(), aggr=aggr), data)
    converted = _assert_equal(model, data)
    assert [r.relation_aggr.name for r in converted.round_list()] == [aggr, aggr]
    assert converted.in_dims == {"paper": 6, "author": 4, "field": 1}


def test_to_hetero_gat_and_graphconv_equal_pyg():
    data = _synthetic()
    gat = to_hetero(_Net(lambda h: GATConv((-1, -1), h // 2, heads=2, add_self_loops=False)), data.metadata())
    _assert_equal(_ready(gat, data), data)
    gc = to_hetero(_Net(lambda h: GraphConv((-1, -1), h, aggr="mean")), data.metadata(), aggr="mean")
    _assert_equal(_ready(gc, data), data)


@pytest.mark.parametrize("aggr", ["sum", "mean", "max", "min"])
def test_hetero_conv_stack_equals_pyg(aggr):
    data = _synthetic()
    converted = _assert_equal(_ready(_HeteroConvNet(data.metadata(), aggr), data), data)
    assert converted.outputs == ["paper"] and converted.output == "logits"
    kinds = {e: c.kind for e, c in converted.round_list()[0].conv_items()}
    assert kinds[("paper", "cites", "paper")] == "gat" and kinds[("paper", "written_by", "author")] == "sage"


def test_to_hetero_on_imdb_equals_pyg(imdb):
    model = _ready(to_hetero(_Net(lambda h: SAGEConv((-1, -1), h), hidden=16), imdb.metadata(), aggr="sum"), imdb)
    converted = _assert_equal(model, imdb, parts=(1, 3, 8))
    assert converted.outputs == ["movie", "director", "actor"]


@pytest.mark.parametrize(
    "conv, options",
    [(RGCNConv, {"num_bases": 2}), (RGCNConv, {"num_blocks": 2}), (FastRGCNConv, {}), (RGCNConv, {"aggr": "add"})],
)
def test_rgcn_on_homogeneous_form_equals_pyg(conv, options):
    """RGCN runs on HeteroData.to_homogeneous() (relation k = metadata edge type k); the typed
    model's outputs, concatenated in node-type order, are its output."""
    data = _synthetic()
    for t in data.node_types:  # RGCN reads one width for every type
        data[t].x = torch.nn.functional.pad(data[t].x, (0, 6 - data[t].x.shape[1]))
    data["author", "likes", "author"].edge_index = torch.tensor([[0, 1], [1, 1]])
    homogeneous = data.to_homogeneous()
    relations = len(data.edge_types)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = conv(6, 8, relations, **options)
            self.conv2 = conv(8, 4, relations, **options)

        def forward(self, x, edge_index, edge_type):
            return self.conv2(self.conv1(x, edge_index, edge_type).relu(), edge_index, edge_type)

    torch.manual_seed(0)
    model = Net().eval()
    reference = model(homogeneous.x, homogeneous.edge_index, homogeneous.edge_type)
    converted = HeteroModel.from_pyg(model, data.metadata())
    for p in (1, 3):
        out = converted(data.x_dict, data.edge_index_dict, parts=p, seed=p)
        torch.testing.assert_close(torch.cat([out[t] for t in data.node_types]), reference, rtol=1e-5, atol=1e-5)


def test_save_load_fingerprint(tmp_path):
    data = _synthetic()
    converted = HeteroModel.from_pyg(_ready(_HeteroConvNet(data.metadata(), "mean"), data), data.metadata())
    converted.save(tmp_path / "m")
    loaded = HeteroModel.load(tmp_path / "m")
    assert loaded.fingerprint() == converted.fingerprint() and loaded.describe() == converted.describe()
    torch.testing.assert_close(
        loaded(data.x_dict, data.edge_index_dict, parts=3)["paper"],
        converted(data.x_dict, data.edge_index_dict)["paper"],
    )
    with pytest.raises(ModelLoadError, match="invalid model spec"):
        Model.load(tmp_path / "m")  # a typed model is not a homogeneous one
    from sparkgnn.engine.api import coerce_model  # what model batching and refresh load models with

    for typed in (loaded, str(tmp_path / "m"), tmp_path / "m"):
        refused = "^PE refresh and model batching run homogeneous graphs only so far"
        with pytest.raises(UnsupportedModelError, match=refused):
            coerce_model(typed)
    refuse_typed(Model.from_pyg(SAGEConv(4, 2)), "infer")  # a homogeneous model passes


def test_metadata_and_width_mismatches_are_refused():
    data = _synthetic()
    converted = HeteroModel.from_pyg(_ready(_HeteroConvNet(data.metadata(), "sum"), data), data.metadata())
    edges = dict(data.edge_index_dict)
    del edges[("paper", "cites", "paper")]
    with pytest.raises(UnsupportedModelError, match=r"the graph lacks edge types \[\('paper', 'cites', 'paper'\)\]"):
        converted(data.x_dict, edges)
    with pytest.raises(UnsupportedModelError, match=r"the model does not know node types \['venue'\]"):
        converted.check_metadata((data.node_types + ["venue"], data.edge_types))
    x = dict(data.x_dict, author=torch.randn(6, 5))
    with pytest.raises(ValueError, match=r"node type 'author': features of shape \(6, 5\), the model expects \[N, 4\]"):
        converted(x, data.edge_index_dict)


def test_unsupported_typed_models_are_refused():
    data = _synthetic()
    meta = data.metadata()
    # relation convs reading two widths: no per-type projection first
    raw = torch.nn.Module()
    raw.conv = HeteroConv({e: SAGEConv((-1, -1), 4) for e in meta[1]})
    raw.forward = lambda x_dict, edge_index_dict: raw.conv(x_dict, edge_index_dict)
    _ready(raw, data)
    with pytest.raises(UnsupportedModelError, match=r"input width is unknown .* pass in_dims"):
        HeteroModel.from_pyg(raw, meta)
    dims = {t: data[t].num_features for t in meta[0]}
    with pytest.raises(UnsupportedModelError, match="reads 4-wide 'author' rows and 6-wide 'paper' rows"):
        HeteroModel.from_pyg(raw, meta, in_dims=dims)
    cat = _HeteroConvNet(meta, "cat")
    for t, x in data.x_dict.items():  # materialise the input Linears (PyG's own forward fails after the cat)
        cat.lin[t](x)
    with pytest.raises(UnsupportedModelError, match="relations merged by cat"):
        HeteroModel.from_pyg(cat, meta)
    hgt = torch.nn.Module()  # HGT straight on the raw features: its relations read two widths
    hgt.conv = HGTConv(-1, 4, meta, heads=1)
    hgt.forward = lambda x_dict, edge_index_dict: hgt.conv(x_dict, edge_index_dict)
    with pytest.raises(UnsupportedModelError, match="input width is unknown .lazy.: run the model once first"):
        HeteroModel.from_pyg(hgt, meta)
    with pytest.raises(UnsupportedModelError, match="reads 4-wide 'author' rows and 6-wide 'paper' rows"):
        HeteroModel.from_pyg(_ready(hgt, data), meta)
    with pytest.raises(UnsupportedModelError, match="dropout with training=True fixed in the traced code"):
        HeteroModel.from_pyg(_ready(to_hetero(_BakedDropout(), meta), data), meta)
    gcn = torch.nn.Module()
    gcn.lin = torch.nn.ModuleDict({t: torch.nn.Linear(data[t].num_features, 4) for t in meta[0]})
    gcn.conv = HeteroConv({("author", "writes", "paper"): GCNConv(4, 4, add_self_loops=False)})
    gcn.forward = lambda x_dict, ei_dict: gcn.conv({t: gcn.lin[t](x) for t, x in x_dict.items()}, ei_dict)
    with pytest.raises(UnsupportedModelError, match=r"'writes', 'paper'\) \(gcn\): needs node statistics"):
        HeteroModel.from_pyg(gcn, meta)
