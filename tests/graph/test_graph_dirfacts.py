"""graph.json is trusted only while it describes the files beside it; unreadable directories are
refused with their names (graph/dirfacts.py)."""

import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _graph_helpers import GOOD_EDGES, GOOD_VERTICES, write_raw

from sparkgnn.errors import GraphValidationError
from sparkgnn.graph import Graph, GraphData, read_graph_dir, write_graph_dir
from sparkgnn.graph.dirfacts import STAMP_KEY, check_graph_dir, read_trusted_meta
from sparkgnn.pe.identity import graph_fingerprint


def _graph(seed: int = 0, edges: int = 30) -> GraphData:
    rng = np.random.default_rng(seed)
    return GraphData(
        ids=np.arange(12) * 5,
        x=rng.normal(size=(12, 3)).astype(np.float32),
        edge_src=rng.integers(0, 12, edges),
        edge_dst=rng.integers(0, 12, edges),
        name="g",
    )


def _replace_edges(path: str, data: GraphData) -> None:
    """Rewrite edges/ the way a user (or another tool) would, leaving graph.json alone."""
    shutil.rmtree(os.path.join(path, "edges"))
    os.makedirs(os.path.join(path, "edges"))
    pq.write_table(pa.table({"src": data.src_ids, "dst": data.dst_ids}), os.path.join(path, "edges", "part-0.parquet"))


def test_writer_records_a_stamp_that_matches(tmp_path):
    path = str(tmp_path / "g")
    meta = write_graph_dir(_graph(), path)
    assert meta[STAMP_KEY]
    trusted, why = read_trusted_meta(path)
    assert why is None and trusted["fingerprint"] == meta["fingerprint"]


def test_changed_edges_drop_the_cached_fingerprint(tmp_path):
    path = str(tmp_path / "g")
    old = write_graph_dir(_graph(0), path)
    new = _graph(1)
    _replace_edges(path, new)
    trusted, why = read_trusted_meta(path)
    assert "changed after graph.json was written" in why
    assert "fingerprint" not in trusted and "validated" not in trusted
    # every reader now fingerprints the content: the new edges, not graph.json's stale value
    on_disk = GraphData(ids=new.ids, x=_graph(0).x, edge_src=new.edge_src, edge_dst=new.edge_dst).fingerprint
    assert read_graph_dir(path).fingerprint == on_disk != old["fingerprint"]
    assert graph_fingerprint(path) == on_disk


def test_spark_load_revalidates_a_changed_directory(spark, tmp_path):
    path = str(tmp_path / "g")
    write_graph_dir(_graph(0), path)
    shutil.rmtree(os.path.join(path, "edges"))
    os.makedirs(os.path.join(path, "edges"))
    pq.write_table(
        pa.table({"src": pa.array([0, 999], pa.int64()), "dst": pa.array([5, 5], pa.int64())}),
        os.path.join(path, "edges", "part-0.parquet"),
    )
    with pytest.raises(GraphValidationError, match="src that is not a vertex id; first: \\(999 -> 5\\)"):
        Graph.load(spark, path)  # graph.json says validated, but its stamp no longer matches


def test_spark_fingerprint_follows_the_content(spark, tmp_path):
    path = str(tmp_path / "g")
    write_graph_dir(_graph(0), path)
    new = _graph(1)
    _replace_edges(path, new)
    assert Graph.load(spark, path).fingerprint == read_graph_dir(path).fingerprint


def test_foreign_directory_without_graph_json_has_a_fingerprint(tmp_path):
    path = write_raw(tmp_path / "foreign", GOOD_VERTICES, GOOD_EDGES)
    assert graph_fingerprint(path) == read_graph_dir(path).fingerprint


@pytest.mark.parametrize(
    "remove, expected",
    [
        ("edges", "no edges/ folder"),
        ("vertices", "no vertices/ folder"),
    ],
)
def test_missing_folder_is_named(tmp_path, remove, expected):
    path = str(tmp_path / "g")
    write_graph_dir(_graph(), path)
    shutil.rmtree(os.path.join(path, remove))
    with pytest.raises(GraphValidationError, match=expected):
        read_graph_dir(path)


def test_missing_folder_is_named_by_spark_load(spark, tmp_path):
    path = str(tmp_path / "g")
    write_graph_dir(_graph(), path)
    shutil.rmtree(os.path.join(path, "edges"))
    with pytest.raises(GraphValidationError, match="no edges/ folder"):
        Graph.load(spark, path)


@pytest.mark.parametrize("damage", ["truncate", "empty"])
def test_unreadable_parquet_file_is_named(tmp_path, damage):
    path = str(tmp_path / "g")
    write_graph_dir(_graph(), path)
    folder = os.path.join(path, "vertices")
    victim = os.path.join(folder, sorted(os.listdir(folder))[0])
    with open(victim, "r+b") as fh:
        fh.truncate(os.path.getsize(victim) // 2 if damage == "truncate" else 0)
    with pytest.raises(GraphValidationError) as info:
        check_graph_dir(path)
    assert f"vertices/{os.path.basename(victim)}: not a readable Parquet file" in str(info.value)


def test_nonexistent_directory(tmp_path):
    with pytest.raises(GraphValidationError, match="does not exist"):
        check_graph_dir(str(tmp_path / "nope"))


def test_rewritten_graph_json_keeps_working(tmp_path):
    """Only the stamp matters, not graph.json's own mtime: editing the name keeps the cache."""
    path = str(tmp_path / "g")
    meta = write_graph_dir(_graph(), path)
    with open(os.path.join(path, "graph.json")) as fh:
        doc = json.load(fh)
    doc["name"] = "renamed"
    with open(os.path.join(path, "graph.json"), "w") as fh:
        json.dump(doc, fh)
    trusted, why = read_trusted_meta(path)
    assert why is None and trusted["fingerprint"] == meta["fingerprint"]


def test_failed_writer_leaves_the_previous_graph(tmp_path):
    from sparkgnn.graph import GraphDirWriter

    path = str(tmp_path / "g")
    before = write_graph_dir(_graph(0), path)
    listing = sorted(os.listdir(path))
    with pytest.raises(RuntimeError, match="disk full"):
        with GraphDirWriter(path, 3, overwrite=True) as writer:
            writer.write_vertices(np.arange(4), np.zeros((4, 3), np.float32))
            raise RuntimeError("disk full (simulated)")
    assert sorted(os.listdir(path)) == listing  # no staging folder, nothing half-written
    assert read_graph_dir(path).fingerprint == before["fingerprint"]


def test_spark_save_refuses_then_replaces_only_when_asked(spark, tmp_path):
    from sparkgnn.errors import OutputError

    path = str(tmp_path / "g")
    first = write_graph_dir(_graph(0), path)
    graph = Graph.from_graph_data(spark, _graph(1))
    with pytest.raises(OutputError, match="already holds a graph"):
        graph.save(path)
    assert read_graph_dir(path).fingerprint == first["fingerprint"]
    meta = graph.save(path, overwrite=True)
    assert sorted(os.listdir(path)) == ["edges", "graph.json", "vertices"]
    assert read_trusted_meta(path)[1] is None and read_graph_dir(path).fingerprint == meta["fingerprint"]
