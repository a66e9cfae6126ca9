"""Graphs for the executor tests, written once per session: Cora, and a small skewed synthetic
graph with non-dense ids, isolated nodes, self loops, duplicate edges and edge weights."""

import numpy as np
import pytest

from sparkgnn.datasets import load_cora
from sparkgnn.datasets.synthetic import synthetic_graph
from sparkgnn.graph import GraphData, write_graph_dir


def skewed_graph() -> GraphData:
    base = synthetic_graph(1200, 9000, 24, num_classes=5, seed=3, weighted=True, isolated_frac=0.03)
    rng = np.random.default_rng(7)
    loops = rng.choice(base.num_nodes, 40, replace=False)
    dup = rng.choice(base.num_edges, 150, replace=False)
    src = np.concatenate([base.edge_src, loops, base.edge_src[dup]])
    dst = np.concatenate([base.edge_dst, loops, base.edge_dst[dup]])
    weight = np.concatenate([base.weight, rng.uniform(0.5, 2.0, 40).astype(np.float32), base.weight[dup]])
    return GraphData(
        ids=base.ids * 3 + 11,
        x=base.x,
        edge_src=src,
        edge_dst=dst,
        weight=weight,
        y=base.y,
        split=base.split,
        name="skewed",
    )


@pytest.fixture(scope="session")
def graph_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine-graphs")
    graphs = {"cora": load_cora(), "skewed": skewed_graph()}
    dirs = {}
    for name, data in graphs.items():
        path = str(root / name)
        write_graph_dir(data, path)
        dirs[name] = (path, data)
    return dirs


@pytest.fixture(scope="session")
def opened_graphs(spark, graph_dirs):
    """graph_dirs' graphs opened once per session (Graph.load): {name: (Graph, GraphData)}.
    Opening a directory reads its graph.json and both Parquet schemas (Spark jobs of their own);
    tests whose subject is the computation, not the opening, pass the opened Graph instead, so
    each case runs only its job. Opening itself is tested with the directories' paths."""
    from sparkgnn.graph import Graph

    return {name: (Graph.load(spark, path), data) for name, (path, data) in graph_dirs.items()}


@pytest.fixture(scope="session")
def work_dir(tmp_path_factory):
    """Shared by all executor tests: a graph is prepared once per partition count."""
    return str(tmp_path_factory.mktemp("engine-work"))
