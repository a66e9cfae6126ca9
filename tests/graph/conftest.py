"""Fixtures of the graph tests: one small valid graph with non-dense ids."""

import numpy as np
import pytest

from sparkgnn.graph import GraphData


@pytest.fixture
def small_graph() -> GraphData:
    rng = np.random.default_rng(7)
    ids = np.array([100, 7, 42, 9, 1000, 3], dtype=np.int64)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    src = np.array([100, 7, 42, 9, 1000, 3, 100], dtype=np.int64)
    dst = np.array([7, 42, 9, 1000, 3, 100, 42], dtype=np.int64)
    weight = np.array([1.0, 0.5, 2.0, 0.0, 1.5, 3.0, 0.25], dtype=np.float32)
    y = np.array([0, 1, 2, 0, -1, 1])
    split = np.array(["train", "val", "test", "train", "", "train"])
    return GraphData.from_edge_ids(ids, x, src, dst, weight=weight, y=y, split=split, name="small")
