"""Batch inference on typed graphs (engine/typed.py): `sparkgnn.infer` and batch_inference.py
equal PyG's forward of the same to_hetero / HeteroConv model (float32, 1e-5) on a small typed
graph with self loops, parallel edges, isolated vertices, non-dense ids and a type without
features; `types` computes only what the named output types read; a model for other metadata,
and PE precompute / refresh / serving on typed inputs, are refused in one line."""

import os
import sys

import numpy as np
import pytest
import torch
from torch_geometric.data import HeteroData
from torch_geometric.nn import GATConv, HeteroConv, Linear, SAGEConv, to_hetero

from sparkgnn import infer
from sparkgnn.errors import SparkGNNError, UnsupportedModelError
from sparkgnn.graph import TypedEdges, TypedGraphData, write_typed_graph_dir
from sparkgnn.graph.typed import node_table
from sparkgnn.models.hetero import HeteroModel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "spark_jobs"))
import batch_inference  # noqa: E402

PAPER_IDS = np.arange(8) * 5 + 3  # non-dense ids: the rows' ids in the graph directory


def _pyg_data() -> HeteroData:
    """paper (6 features), author (4), field (no features: PyG is fed a constant column); paper 7,
    author 5 and field 3 have no edges; cites has a self loop and parallel edges."""
    g = torch.Generator().manual_seed(7)
    d = HeteroData()
    d["paper"].x = torch.randn(8, 6, generator=g)
    d["author"].x = torch.randn(6, 4, generator=g)
    d["field"].x = torch.ones(4, 1)
    writes = torch.tensor([[0, 0, 1, 2, 3, 4, 4], [0, 0, 1, 2, 3, 4, 5]])
    topic = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 1, 1, 2, 2]])
    d["author", "writes", "paper"].edge_index = writes
    d["paper", "written_by", "author"].edge_index = writes.flip(0)
    d["paper", "cites", "paper"].edge_index = torch.tensor([[0, 1, 1, 2, 3, 3, 5, 6], [1, 2, 2, 2, 4, 4, 5, 0]])
    d["paper", "has_topic", "field"].edge_index = topic
    d["field", "topic_of", "paper"].edge_index = topic.flip(0)
    return d


def _typed(d: HeteroData) -> TypedGraphData:
    ids = {"paper": PAPER_IDS, "author": np.arange(6), "field": np.arange(4)}
    nodes = {
        "paper": node_table(ids["paper"], d["paper"].x.numpy()),
        "author": node_table(ids["author"], d["author"].x.numpy()),
        "field": node_table(ids["field"]),  # no features
    }
    edges = {}
    for s, r, t in d.edge_types:
        ei = d[s, r, t].edge_index.numpy()
        edges[(s, r, t)] = TypedEdges(ids[s][ei[0]], ids[t][ei[1]])
    return TypedGraphData(nodes, edges, name="typed-small")


class _Sage(torch.nn.Module):
    """A per-type input Linear, then `layers` SAGE convs (what to_hetero is given in PyG's examples)."""

    def __init__(self, layers: int):
        super().__init__()
        self.lin = Linear(-1, 8)
        self.convs = torch.nn.ModuleList([SAGEConv((-1, -1), 8) for _ in range(layers - 1)] + [SAGEConv((-1, -1), 3)])

    def forward(self, x, edge_index):
        x = self.lin(x).relu()
        for conv in self.convs[:-1]:
            x = conv(x, edge_index).relu()
        return self.convs[-1](x, edge_index)


class _Mixed(torch.nn.Module):
    """HeteroConv stacks mixing SAGE and GAT (GAT's self loops on the paper-paper relation)."""

    def __init__(self, metadata, aggr):
        super().__init__()
        self.lin = torch.nn.ModuleDict({t: Linear(-1, 8) for t in metadata[0]})

        def conv(i, e):
            return SAGEConv(8, 8) if i % 2 else GATConv(8, 8, heads=2, concat=False, add_self_loops=e[0] == e[2])

        self.convs = torch.nn.ModuleList(
            [HeteroConv({e: conv(i, e) for i, e in enumerate(metadata[1])}, aggr=aggr) for _ in range(2)]
        )
        self.out = Linear(8, 2)

    def forward(self, x_dict, edge_index_dict):
        x_dict = {t: self.lin[t](x).relu() for t, x in x_dict.items()}
        for conv in self.convs:
            x_dict = {t: x.relu() for t, x in conv(x_dict, edge_index_dict).items()}
        return self.out(x_dict["paper"])


def _ready(module, d):
    torch.manual_seed(0)
    module(d.x_dict, d.edge_index_dict)  # materialise lazy parameters
    return module.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def typed_dir(tmp_path_factory):
    d = _pyg_data()
    path = str(tmp_path_factory.mktemp("typed") / "graph")
    write_typed_graph_dir(_typed(d), path)
    return path, d


def _rows(frame, node_type: str) -> np.ndarray:
    rows = sorted((r.id, r.h) for r in frame.collect())
    ids = PAPER_IDS if node_type == "paper" else np.arange(len(rows))
    assert [i for i, _ in rows] == sorted(ids.tolist())
    return np.asarray([h for _, h in rows], np.float32)


def test_to_hetero_sage_equals_pyg_at_three_partitions(spark, typed_dir, tmp_path):
    path, d = typed_dir
    module = _ready(to_hetero(_Sage(1), d.metadata(), aggr="mean"), d)  # one round: 5 relation runs
    reference = module(d.x_dict, d.edge_index_dict)
    # the PyG module itself: converted for the graph's metadata
    result = infer(spark, path, module, partitions=3, work_dir=str(tmp_path / "work"))
    assert sorted(result.frames) == sorted(reference)
    for t, ref in reference.items():
        np.testing.assert_allclose(_rows(result.frames[t], t), ref.numpy(), rtol=1e-5, atol=1e-5)
    assert not os.listdir(tmp_path / "work" / "typed_runs")  # the run's intermediate values are removed


def test_two_round_hetero_conv_sage_gat_via_batch_inference_equals_pyg(spark, typed_dir, tmp_path, capsys):
    path, d = typed_dir
    module = _ready(_Mixed(d.metadata(), "max"), d)
    reference = module(d.x_dict, d.edge_index_dict)
    HeteroModel.from_pyg(module, d.metadata()).save(tmp_path / "model")
    out = tmp_path / "out"
    argv = ["--graph", path, "--model", str(tmp_path / "model"), "--out", str(out), "--partitions", "1"]
    assert batch_inference.main([*argv, "--types", "paper", "--work-dir", str(tmp_path / "work")]) == 0
    assert "wrote 8 rows of node type paper" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["paper"]
    got = _rows(spark.read.parquet(str(out / "paper")), "paper")
    np.testing.assert_allclose(got, reference.numpy(), rtol=1e-5, atol=1e-5)


def test_needed_types_walk_the_rounds_back_from_the_requested_types():
    from sparkgnn.engine.typed import needed_types

    d = _pyg_data()
    model = HeteroModel.from_pyg(_ready(to_hetero(_Sage(2), d.metadata(), aggr="sum"), d), d.metadata())
    # the last round needs field only for itself; field reads paper (has_topic) and its own root term
    assert needed_types(model, ["paper", "author"]) == [{"paper", "author", "field"}, {"paper", "author"}]
    assert needed_types(model, ["field"]) == [{"paper", "field"}, {"field"}]
    with pytest.raises(Exception, match=r"types \['venue'\] are not outputs of the model"):
        needed_types(model, ["venue"])


def test_mismatched_model_and_homogeneous_jobs_are_refused_in_one_line(spark, typed_dir, tmp_path):
    from sparkgnn import precompute, refresh
    from sparkgnn.serving.engine import serving_model

    path, d = typed_dir
    other = HeteroData()
    for t in ("paper", "author"):
        other[t].x = d[t].x
    other["author", "writes", "paper"].edge_index = d["author", "writes", "paper"].edge_index
    other["paper", "written_by", "author"].edge_index = d["paper", "written_by", "author"].edge_index
    foreign = HeteroModel.from_pyg(_ready(to_hetero(_Sage(1), other.metadata()), other), other.metadata())
    with pytest.raises(UnsupportedModelError) as info:
        infer(spark, path, foreign, out=str(tmp_path / "out"))
    assert "does not match graph 'typed-small'" in str(info.value) and "\n" not in str(info.value)
    assert not os.path.exists(tmp_path / "out")
    with pytest.raises(SparkGNNError, match="^ids on a typed graph are not supported yet; use types="):
        infer(spark, path, foreign, ids=[3])
    foreign.save(tmp_path / "model")
    store = str(tmp_path / "store")
    for call in (
        lambda: precompute(spark, path, foreign, store=store),
        lambda: precompute(spark, path, str(tmp_path / "model"), store=store),
        lambda: refresh(spark, path, foreign, store=store, updates=str(tmp_path / "updates")),
    ):
        with pytest.raises(UnsupportedModelError, match="^PE precompute and refresh: typed graphs and models are not"):
            call()
    with pytest.raises(UnsupportedModelError, match="^the serving engines run homogeneous graphs only so far"):
        serving_model(str(tmp_path / "model"))
    assert not os.path.exists(store)
