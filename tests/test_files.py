"""sparkgnn.files: paths as every process of a cluster sees them; Parquet row groups dealt to readers."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

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


def test_readers_are_dealt_row_groups_so_one_file_is_read_by_every_reader(tmp_path):
    from sparkgnn.files import dealt_batches

    files = []
    for number, rows in enumerate((1000, 250)):  # 4 row groups, then 1
        path = str(tmp_path / f"part-{number}.parquet")
        start = number * 10_000
        pq.write_table(
            pa.table({"src": np.arange(start, start + rows), "dst": np.zeros(rows, np.int64)}), path, row_group_size=250
        )
        files.append(path)
    shares = [
        np.concatenate([b.column("src").to_numpy() for b in dealt_batches(files, ["src"], reader, 3, 100)])
        for reader in range(3)
    ]
    assert [len(share) for share in shares] == [500, 500, 250]  # groups 0,3 / 1,4 / 2
    every = np.sort(np.concatenate(shares))
    np.testing.assert_array_equal(every, np.r_[np.arange(1000), np.arange(10_000, 10_250)])
    assert list(dealt_batches(files, ["src"], 0, 9, 100))  # more readers than groups: the first ones read
    assert not list(dealt_batches(files, ["src"], 7, 9, 100))
