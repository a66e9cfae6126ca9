"""Synthetic graphs: power-law in-degrees, determinism, learnable labels, streaming writer, CLI."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sparkgnn.datasets import synthetic_graph, write_synthetic
from sparkgnn.graph import Graph, read_graph_dir


def test_degree_skew_at_benchmark_scale():
    g = synthetic_graph(200_000, 2_000_000, 4, seed=0)
    in_deg, out_deg = g.in_degree(), g.out_degree()
    assert 10_000 <= in_deg.max() < 100_000  # hubs in the tens of thousands
    assert np.median(in_deg) <= 10  # ... while the typical vertex has few in-edges
    assert out_deg.max() < 100  # sources are uniform
    isolated = (in_deg == 0) & (out_deg == 0)
    assert 500 < isolated.sum() < 5000  # ~1% isolated vertices
    assert (g.edge_src != g.edge_dst).all()  # no self loops


def test_deterministic_for_a_seed():
    a = synthetic_graph(3000, 20_000, 8, num_classes=4, seed=3, weighted=True)
    b = synthetic_graph(3000, 20_000, 8, num_classes=4, seed=3, weighted=True)
    c = synthetic_graph(3000, 20_000, 8, num_classes=4, seed=4, weighted=True)
    for name in ("ids", "x", "edge_src", "edge_dst", "weight", "y", "split"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a.fingerprint == b.fingerprint != c.fingerprint
    a.validate()


def _accuracy(features, g):
    """Least-squares linear classifier, train -> test accuracy (a cheap stand-in for a model)."""
    train, test = g.mask("train"), g.mask("test")
    design = np.hstack([features, np.ones((len(features), 1), np.float32)])
    weights = np.linalg.lstsq(design[train], np.eye(g.num_classes)[g.y[train]], rcond=None)[0]
    return (np.argmax(design[test] @ weights, axis=1) == g.y[test]).mean()


def test_labels_are_learnable_and_neighbours_help():
    g = synthetic_graph(20_000, 200_000, 32, num_classes=8, seed=1)
    mean_in = np.zeros_like(g.x)
    np.add.at(mean_in, g.edge_dst, g.x[g.edge_src])
    mean_in /= np.maximum(g.in_degree(), 1)[:, None]
    alone, with_neighbours = _accuracy(g.x, g), _accuracy(np.hstack([g.x, mean_in]), g)
    assert alone > 2 / g.num_classes  # features carry the class ...
    assert with_neighbours > alone + 0.1  # ... and aggregation over neighbours adds to it


def test_streaming_writer_equals_in_memory(tmp_path):
    kwargs = dict(num_classes=5, seed=2, weighted=True, id_offset=1000)
    meta = write_synthetic(tmp_path / "s", 5000, 40_000, 6, rows_per_file=7000, **kwargs)
    assert len(os.listdir(tmp_path / "s" / "edges")) == 6  # 40K edges / 7K per file
    memory = synthetic_graph(5000, 40_000, 6, **kwargs)
    disk = read_graph_dir(tmp_path / "s")
    assert meta["fingerprint"] == memory.fingerprint
    del disk.__dict__["fingerprint"]
    assert disk.fingerprint == memory.fingerprint  # recomputed from the Parquet files
    np.testing.assert_array_equal(disk.ids, memory.ids)
    np.testing.assert_array_equal(disk.x, memory.x)
    np.testing.assert_array_equal(disk.src_ids, memory.src_ids)
    assert (meta["num_vertices"], meta["num_edges"], meta["num_classes"]) == (5000, 40_000, 5)


def test_streamed_graph_readable_by_spark(spark, tmp_path):
    meta = write_synthetic(tmp_path / "s", 2000, 10_000, 5, seed=5)
    graph = Graph.load(spark, str(tmp_path / "s"), validate=True)  # forces the content checks
    assert graph.stats()["num_edges"] == 10_000 and graph.feature_dim == 5
    graph._fingerprint = None  # recompute with Spark
    assert graph.fingerprint == meta["fingerprint"]
    assert graph.vertices.where("split = 'train'").count() == meta["splits"]["train"]


def test_cli_writes_and_summarises(tmp_path):
    out = tmp_path / "cli"
    cmd = [
        sys.executable,
        "-m",
        "sparkgnn.datasets",
        "synthetic",
        "--nodes",
        "500",
        "--edges",
        "3000",
        "--dim",
        "4",
        "--classes",
        "3",
        "--seed",
        "9",
        "--out",
        str(out),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert "\n" not in line and "500 vertices, 3000 edges, 4-d features, 3 classes" in line
    meta = json.loads((out / "graph.json").read_text())
    assert meta["fingerprint"] in line and read_graph_dir(out).num_edges == 3000
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "overwrite" in again.stderr
    cora = subprocess.run(
        [sys.executable, "-m", "sparkgnn.datasets", "cora", "--out", str(tmp_path / "cora")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cora.returncode == 0 and "2708 vertices, 5429 edges, 1433-d features, 7 classes" in cora.stdout


@pytest.mark.parametrize("bad", [dict(num_nodes=1), dict(dim=0), dict(homophily=2.0)])
def test_rejects_bad_parameters(bad):
    args = dict(num_nodes=10, num_edges=10, dim=2)
    args.update(bad)
    with pytest.raises(ValueError):
        synthetic_graph(**args)
