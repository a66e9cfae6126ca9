"""Fixtures of the PE store tests: a small irregular graph (non-dense ids, an isolated node, a
node without in-edges, a self-loop, parallel edges) and a tiny 3-layer model."""

import numpy as np
import pytest

from sparkgnn.graph import GraphData


def _graph_data(seed: int = 3) -> GraphData:
    rng = np.random.default_rng(seed)
    ids = np.array([10, 3, 77, 5, 1000, 42, 8, 61, 2, 99], dtype=np.int64)  # 99 isolated
    pairs = rng.integers(0, 9, size=(24, 2))  # never touches 99
    src, dst = ids[pairs[:, 0]], ids[pairs[:, 1]]
    src = np.concatenate([src, [10, 10, 3, 61]])  # parallel 10->3,
    dst = np.concatenate([dst, [3, 3, 3, 61]])  # self-loop 61
    keep = dst != 2  # 2: no in-edges
    x = rng.standard_normal((len(ids), 4)).astype(np.float32)
    return GraphData.from_edge_ids(ids, x, src[keep], dst[keep], name="pe-small")


@pytest.fixture(scope="session")
def graph_data() -> GraphData:
    return _graph_data()


@pytest.fixture(scope="session")
def spark_graph(spark, graph_data):
    from sparkgnn.graph import Graph

    return Graph.from_graph_data(spark, graph_data)


@pytest.fixture(scope="session")
def model():
    import torch
    import torch_geometric.nn as gnn

    from sparkgnn.models import Model

    torch.manual_seed(0)
    return Model.from_pyg(gnn.GraphSAGE(4, 6, 3, out_channels=3).eval(), output="logits")
