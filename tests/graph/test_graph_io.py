"""On-disk format: round trips (fixed_size_list and plain lists), graph.json, fingerprint."""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _graph_helpers import write_raw

from sparkgnn.errors import OutputError
from sparkgnn.graph import GraphData, fingerprint_arrays, read_graph_dir, write_graph_dir


def _assert_same(a: GraphData, b: GraphData):
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.src_ids, b.src_ids)
    np.testing.assert_array_equal(a.dst_ids, b.dst_ids)
    for name in ("weight", "y", "split"):
        left, right = getattr(a, name), getattr(b, name)
        assert (left is None) == (right is None)
        if left is not None:
            np.testing.assert_array_equal(left, right)


def test_round_trip_fixed_size_list(small_graph, tmp_path):
    meta = write_graph_dir(small_graph, tmp_path / "g", rows_per_file=4)
    schema = pq.read_schema(next((tmp_path / "g" / "vertices").glob("*.parquet")))
    assert pa.types.is_fixed_size_list(schema.field("x").type)
    assert len(list((tmp_path / "g" / "edges").glob("*.parquet"))) == 2  # 7 edges, 4 per file
    back = read_graph_dir(tmp_path / "g")
    _assert_same(small_graph, back)
    assert back.x.flags["C_CONTIGUOUS"] and back.name == "small"
    on_disk = json.loads((tmp_path / "g" / "graph.json").read_text())
    for key in (
        "num_vertices",
        "num_edges",
        "feature_dim",
        "has_weight",
        "has_labels",
        "num_classes",
        "name",
        "fingerprint",
    ):
        assert on_disk[key] == meta[key]
    assert (on_disk["num_vertices"], on_disk["num_edges"], on_disk["feature_dim"]) == (6, 7, 4)
    assert on_disk["num_classes"] == 3 and on_disk["fingerprint"] == small_graph.fingerprint


@pytest.mark.parametrize("value_type", [pa.float32(), pa.float64(), pa.int64()])
def test_reads_plain_list_vectors(tmp_path, value_type):
    """A directory written by another tool (x as list<float|double|int>, no graph.json)."""
    x = [[1, 0, 2], [0, 1, 1], [3, 3, 0]]
    path = write_raw(
        tmp_path,
        {"id": [5, 6, 7], "x": x},
        {"src": [5, 6], "dst": [6, 7], "weight": [1.0, 2.0]},
        vertex_types={"x": pa.list_(value_type)},
    )
    g = read_graph_dir(path)
    assert g.x.dtype == np.float32 and g.x.tolist() == x
    assert g.dst_ids.tolist() == [6, 7] and g.weight.dtype == np.float32
    assert g.name == os.path.basename(path)
    assert g.fingerprint == fingerprint_arrays(
        [5, 6, 7], np.array(x, np.float32), [5, 6], [6, 7], np.array([1.0, 2.0], np.float32)
    )


def test_fingerprint_tracks_content_not_layout(small_graph, tmp_path):
    fp = small_graph.fingerprint
    # same content, other row order and file layout -> same fingerprint
    perm = np.array([3, 0, 5, 1, 4, 2])
    shuffled = GraphData.from_edge_ids(
        small_graph.ids[perm],
        small_graph.x[perm],
        small_graph.src_ids[::-1],
        small_graph.dst_ids[::-1],
        weight=small_graph.weight[::-1],
    )
    assert shuffled.fingerprint == fp
    assert write_graph_dir(small_graph, tmp_path / "a", rows_per_file=2)["fingerprint"] == fp
    # any content change -> another fingerprint
    x = small_graph.x.copy()
    x[2, 1] += 1e-6
    changes = [
        dict(x=x),
        dict(weight=small_graph.weight * 2),
        dict(weight=None),
        dict(dst=np.roll(small_graph.dst_ids, 1)),
        dict(src=small_graph.src_ids[:-1], dst=small_graph.dst_ids[:-1], weight=small_graph.weight[:-1]),
    ]
    for change in changes:
        args = dict(x=small_graph.x, src=small_graph.src_ids, dst=small_graph.dst_ids, weight=small_graph.weight)
        args.update(change)
        other = GraphData.from_edge_ids(small_graph.ids, args["x"], args["src"], args["dst"], weight=args["weight"])
        assert other.fingerprint != fp, change
    # labels and splits do not change embeddings, so they do not change the fingerprint
    relabelled = GraphData.from_edge_ids(
        small_graph.ids,
        small_graph.x,
        small_graph.src_ids,
        small_graph.dst_ids,
        weight=small_graph.weight,
        y=np.zeros(6),
    )
    assert relabelled.fingerprint == fp


def test_refuses_to_overwrite_unless_asked(small_graph, tmp_path):
    write_graph_dir(small_graph, tmp_path)
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(OutputError):
        write_graph_dir(small_graph, tmp_path)
    write_graph_dir(small_graph, tmp_path, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    assert read_graph_dir(tmp_path).num_edges == 7
    os.remove(tmp_path / "graph.json")  # vertices/ and edges/ without graph.json: not ours to replace
    with pytest.raises(OutputError, match="no graph.json.*overwrite will not replace it"):
        write_graph_dir(small_graph, tmp_path, overwrite=True)


def test_a_graph_json_fingerprint_that_is_not_hex_is_refused(small_graph, tmp_path):
    from sparkgnn.errors import GraphValidationError
    from sparkgnn.pe.identity import graph_fingerprint
    from sparkgnn.pe.layout import store_dir

    write_graph_dir(small_graph, tmp_path)
    meta = json.loads((tmp_path / "graph.json").read_text())
    meta["fingerprint"] = "../../../home/someone"  # would be joined into PE store paths
    (tmp_path / "graph.json").write_text(json.dumps(meta))
    for read in (read_graph_dir, graph_fingerprint):
        with pytest.raises(GraphValidationError, match=r"graph.json: fingerprint '\.\./.*' is not a graph fingerprint"):
            read(str(tmp_path))
    with pytest.raises(GraphValidationError, match="PE store: graph fingerprint"):
        store_dir(str(tmp_path / "store"), "../x", "0" * 64)
    with pytest.raises(Exception, match="PE store: model fingerprint '/etc' is not a model fingerprint"):
        store_dir(str(tmp_path / "store"), "0" * 32, "/etc")


def test_empty_edges_round_trip(tmp_path):
    g = GraphData(np.array([4, 2]), np.ones((2, 3)), np.empty(0), np.empty(0), name="lonely")
    write_graph_dir(g, tmp_path)
    back = read_graph_dir(tmp_path)
    assert back.num_nodes == 2 and back.num_edges == 0 and back.feature_dim == 3


def _with_edge_attr(data: GraphData, width: int = 3, seed: int = 0) -> GraphData:
    attr = np.random.default_rng(seed).standard_normal((data.num_edges, width)).astype(np.float32)
    return GraphData.from_edge_ids(
        data.ids, data.x, data.src_ids, data.dst_ids, weight=data.weight, name=data.name, edge_attr=attr
    )


def test_edge_attr_round_trip_and_fingerprint(small_graph, tmp_path):
    data = _with_edge_attr(small_graph)
    meta = write_graph_dir(data, tmp_path / "g", rows_per_file=4)
    schema = pq.read_schema(next((tmp_path / "g" / "edges").glob("*.parquet")))
    assert schema.field("edge_attr").type == pa.list_(pa.float32(), 3)
    assert meta["edge_attr_dim"] == 3 and data.meta()["edge_attr_dim"] == 3
    back = read_graph_dir(tmp_path / "g")
    np.testing.assert_array_equal(back.edge_attr, data.edge_attr)
    assert back.fingerprint == data.fingerprint == meta["fingerprint"]
    # the fingerprint covers the attributes: without them, or with one value changed, it differs
    assert small_graph.fingerprint != data.fingerprint
    changed = data.edge_attr.copy()
    changed[4, 1] += 1.0
    other = fingerprint_arrays(data.ids, data.x, data.src_ids, data.dst_ids, data.weight, changed)
    assert other != data.fingerprint
    os.remove(tmp_path / "g" / "graph.json")  # recomputed from the content, same value
    assert read_graph_dir(tmp_path / "g").fingerprint == data.fingerprint
    assert back.to_pyg().edge_attr.shape == (data.num_edges, 3)


def test_edge_attr_defects_are_named(tmp_path):
    edges = {"src": [1, 2, 3], "dst": [2, 3, 4], "edge_attr": [[0.5, 1.0], [2.0], [float("nan"), 1.0]]}
    path = write_raw(tmp_path / "bad", {"id": [1, 2, 3, 4], "x": [[1.0]] * 4}, edges)
    with pytest.raises(Exception, match=r"edge_attr vector whose length is not 2; first: \(2 -> 3\) \(len 1\)"):
        read_graph_dir(path)
    edges["edge_attr"] = [[0.5, 1.0], [2.0, 0.0], [float("nan"), 1.0]]
    path = write_raw(tmp_path / "nan", {"id": [1, 2, 3, 4], "x": [[1.0]] * 4}, edges)
    with pytest.raises(Exception, match=r"1 edges have NaN/Inf \(or null\) edge_attr values; first: \(3 -> 4\)"):
        read_graph_dir(path)
    with pytest.raises(Exception, match="edge_attr has shape"):
        GraphData(np.arange(2), np.zeros((2, 1)), np.array([0]), np.array([1]), edge_attr=np.zeros((1, 0))).validate()
