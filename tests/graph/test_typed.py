"""Typed graphs in memory and on disk: PyG round trip, fingerprint, validation naming the type,
and the homogeneous jobs refusing a typed directory."""

import json
import os
import shutil

import pytest
import torch
from torch_geometric.data import HeteroData

from sparkgnn.errors import GraphValidationError
from sparkgnn.graph import Graph, read_graph_dir, read_typed_graph_dir, write_graph_dir, write_typed_graph_dir
from sparkgnn.graph.typed import TypedEdges, TypedGraphData, node_table
from sparkgnn.pe.identity import graph_fingerprint

WRITES, CITES, REV = ("author", "writes", "paper"), ("paper", "cites", "paper"), ("paper", "rev_writes", "author")


def _hetero() -> HeteroData:
    """Types of different widths, one without features, a self loop and a parallel edge,
    an isolated author, edge weights and edge attributes."""
    torch.manual_seed(0)
    data = HeteroData()
    data["paper"].x = torch.randn(5, 4)
    data["paper"].y = torch.tensor([0, 1, 2, -1, 1])
    data["paper"].train_mask = torch.tensor([1, 1, 0, 0, 0], dtype=torch.bool)
    data["paper"].val_mask = torch.tensor([0, 0, 1, 0, 0], dtype=torch.bool)
    data["paper"].test_mask = torch.tensor([0, 0, 0, 0, 1], dtype=torch.bool)
    data["author"].num_nodes = 4
    data["field"].x = torch.randn(2, 3)
    data[WRITES].edge_index = torch.tensor([[0, 1, 2, 2], [0, 0, 4, 4]])
    data[CITES].edge_index = torch.tensor([[0, 1, 1], [1, 1, 3]])
    data[CITES].edge_weight = torch.rand(3)
    data[REV].edge_index = torch.tensor([[0, 4], [0, 2]])
    data[REV].edge_attr = torch.randn(2, 3)
    data["paper", "has_topic", "field"].edge_index = torch.tensor([[0, 3], [1, 1]])
    return data


def _assert_same(a: HeteroData, b: HeteroData) -> None:
    assert a.metadata() == b.metadata()
    for key in (*a.node_types, *a.edge_types):
        assert sorted(a[key].keys()) == sorted(b[key].keys()), key
        for attr in a[key].keys():
            left, right = a[key][attr], b[key][attr]
            assert torch.equal(left, right) if torch.is_tensor(left) else left == right, (key, attr)


def test_from_pyg_write_read_to_pyg_round_trip(tmp_path):
    data = _hetero()
    graph = TypedGraphData.from_pyg(data, name="toy")
    meta = write_typed_graph_dir(graph, str(tmp_path / "g"))
    assert meta["node_types"] == ["paper", "author", "field"]
    assert meta["edge_types"][0] == list(WRITES)
    assert meta["types"]["author"]["feature_dim"] == 0 and meta["types"]["paper"]["num_classes"] == 3
    assert os.path.isdir(tmp_path / "g" / "edges" / "author__writes__paper")
    back = read_typed_graph_dir(str(tmp_path / "g"))
    assert back.fingerprint == graph.fingerprint == meta["fingerprint"]
    _assert_same(back.to_pyg(), data)
    # a directory whose graph.json no longer vouches for the files gets the same fingerprint computed
    doc = json.loads((tmp_path / "g" / "graph.json").read_text())
    doc["data_stamp"] = "0" * 32
    (tmp_path / "g" / "graph.json").write_text(json.dumps(doc))
    assert read_typed_graph_dir(str(tmp_path / "g")).fingerprint == graph.fingerprint


def test_fingerprint_covers_every_type_and_ignores_listing_order():
    graph = TypedGraphData.from_pyg(_hetero())
    reordered = TypedGraphData(dict(reversed(graph.nodes.items())), dict(reversed(graph.edges.items())))
    assert reordered.fingerprint == graph.fingerprint
    changed = _hetero()
    changed["field"].x[1, 2] += 1.0
    assert TypedGraphData.from_pyg(changed).fingerprint != graph.fingerprint
    renamed = dict(graph.edges)
    renamed[("paper", "cited_by", "paper")] = renamed.pop(CITES)
    assert TypedGraphData(graph.nodes, renamed).fingerprint != graph.fingerprint


def test_homogeneous_fingerprint_unchanged(small_graph, tmp_path):
    # the streaming writer (now built from the per-type sinks) still writes plain sgfp1
    meta = write_graph_dir(small_graph, str(tmp_path / "h"))
    assert meta["fingerprint"] == small_graph.fingerprint == read_graph_dir(str(tmp_path / "h")).fingerprint
    assert "node_types" not in meta


def _defect(graph: TypedGraphData, tmp_path) -> str:
    with pytest.raises(GraphValidationError) as err:
        write_typed_graph_dir(graph, str(tmp_path / "bad"))
    assert not os.path.exists(tmp_path / "bad")  # nothing written
    return str(err.value)


def test_validation_names_the_type(tmp_path):
    graph = TypedGraphData.from_pyg(_hetero())
    unknown = TypedGraphData(graph.nodes, {**graph.edges, ("venue", "hosts", "paper"): TypedEdges([0], [0])})
    assert "edge type venue__hosts__paper: node type 'venue' is unknown" in _defect(unknown, tmp_path)
    dangling = TypedGraphData(graph.nodes, {**graph.edges, WRITES: TypedEdges([0, 9], [0, 7])})
    message = _defect(dangling, tmp_path)
    assert "edge type author__writes__paper: 1 edges have a src that is not an id of node type 'author'" in message
    assert "1 edges have a dst that is not an id of node type 'paper'; first: (9 -> 7)" in message
    ragged = TypedGraphData({**graph.nodes, "field": node_table([0, 1], [[1.0, 2.0], [3.0]])}, graph.edges)
    assert "node type 'field': 1 vertices have a feature vector whose length is not" in _defect(ragged, tmp_path)
    bad_name = TypedGraphData({"pa__per": graph.nodes["paper"]}, {})
    assert "node type name 'pa__per' is not usable" in _defect(bad_name, tmp_path)


def test_directory_defects_are_refused_naming_the_type(tmp_path):
    path = tmp_path / "g"
    write_typed_graph_dir(TypedGraphData.from_pyg(_hetero()), str(path))
    shutil.rmtree(path / "edges" / "paper__cites__paper")
    with pytest.raises(GraphValidationError, match=r"edge type paper__cites__paper: no edges/paper__cites__paper/"):
        read_typed_graph_dir(str(path))

    path2 = tmp_path / "g2"
    write_typed_graph_dir(TypedGraphData.from_pyg(_hetero()), str(path2))
    doc = json.loads((path2 / "graph.json").read_text())
    doc["types"]["paper"]["feature_dim"] = 8  # graph.json and the files disagree on the width
    (path2 / "graph.json").write_text(json.dumps(doc))
    os.utime(path2 / "graph.json")
    shutil.copytree(path2 / "edges" / "author__writes__paper", path2 / "edges" / "author__edits__paper")
    with pytest.raises(GraphValidationError) as err:
        read_typed_graph_dir(str(path2))
    assert "edges/author__edits__paper/ holds an edge type that graph.json does not list" in str(err.value)


def test_width_mismatch_against_graph_json(tmp_path):
    path = tmp_path / "g"
    meta = write_typed_graph_dir(TypedGraphData.from_pyg(_hetero()), str(path))
    meta["types"]["paper"]["feature_dim"] = 8  # stamp still matches: graph.json is trusted
    (path / "graph.json").write_text(json.dumps(meta))
    with pytest.raises(
        GraphValidationError, match=r"node type 'paper': 5 vertices have a feature vector whose length is not 8"
    ):
        read_typed_graph_dir(str(path))


def test_homogeneous_jobs_refuse_a_typed_directory(tmp_path):
    path = str(tmp_path / "g")
    write_typed_graph_dir(TypedGraphData.from_pyg(_hetero()), path)
    for call in (lambda: read_graph_dir(path), lambda: Graph.load(None, path), lambda: graph_fingerprint(path)):
        with pytest.raises(GraphValidationError, match="holds a typed graph .* homogeneous graphs only"):
            call()


def test_from_pyg_refuses_an_edge_type_of_an_unknown_node_type():
    data = HeteroData()
    data["paper"].x = torch.randn(2, 2)
    data["author", "writes", "paper"].edge_index = torch.tensor([[0], [1]])
    with pytest.raises(GraphValidationError, match=r"author__writes__paper: node type 'author' is unknown"):
        TypedGraphData.from_pyg(data)
