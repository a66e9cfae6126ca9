"""sparkgnn.files: paths as every process of a cluster sees them."""

import os

from sparkgnn.files import absolute


def test_local_paths_are_made_absolute_against_the_drivers_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute("data/graph") == os.path.join(str(tmp_path), "data", "graph")
    assert absolute("/already/absolute") == "/already/absolute"
    assert absolute("file:rel/dir") == "file://" + os.path.join(str(tmp_path), "rel", "dir")
    assert absolute("file:///abs/dir") == "file:///abs/dir"


def test_remote_uris_are_left_alone():
    for uri in ("s3://bucket/graph", "hdfs://nn:8020/work"):
        assert absolute(uri) == uri


def test_a_graph_loaded_from_a_relative_path_records_it_absolute(spark, tmp_path, monkeypatch):
    # tasks list and read the graph's files from their own working directory (an executor's on a
    # cluster), so the graph must carry the driver's absolute path
    import numpy as np

    from sparkgnn.graph import Graph, GraphData, write_graph_dir

    rng = np.random.default_rng(0)
    data = GraphData(
        ids=np.arange(12),
        x=rng.normal(size=(12, 3)).astype(np.float32),
        edge_src=rng.integers(0, 12, 30),
        edge_dst=rng.integers(0, 12, 30),
        name="g",
    )
    write_graph_dir(data, str(tmp_path / "g"))
    monkeypatch.chdir(tmp_path)
    graph = Graph.load(spark, "g")
    assert graph.path == str(tmp_path / "g")
