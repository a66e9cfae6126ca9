"""Cora citation graph from the Parquet files bundled with graphdatascience 2.2.

2708 papers (original paper ids, not dense), 1433-d binary bag-of-words features (stored as an
int list, turned into float32), label `subject` 0..6, and the 5429 citation rows of cora_rels.

Edge direction: the rows are kept exactly as in the file, sourceNodeId -> targetNodeId (in the
original cora.cites the first column is the CITED paper, so messages flow from a cited paper to
the paper citing it). `undirected=True` adds every reverse edge and drops duplicates, which gives
PyTorch Geometric's Planetoid Cora (10556 edges).

Split (seeded): Planetoid style, 20 training vertices per class (140), then 500 val and 1000 test
from the rest of a seeded permutation; the remaining 1068 vertices are in no split.
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from sparkgnn.datasets.bundled import resource_path
from sparkgnn.datasets.edges import symmetrise
from sparkgnn.datasets.splits import make_split
from sparkgnn.graph import GraphData
from sparkgnn.graph.checks import vector_column
from sparkgnn.graph.problems import raise_if_any


def load_cora(
    seed: int = 0, train_per_class: int = 20, num_val: int = 500, num_test: int = 1000, undirected: bool = False
) -> GraphData:
    nodes = pq.read_table(resource_path("cora", "cora_nodes.parquet.gzip"), columns=["nodeId", "subject", "features"])
    rels = pq.read_table(resource_path("cora", "cora_rels.parquet.gzip"), columns=["sourceNodeId", "targetNodeId"])
    ids = nodes.column("nodeId").to_numpy()
    x, problems = vector_column(ids, nodes.column("features"))
    raise_if_any(problems, "cora")
    y = nodes.column("subject").to_numpy().astype(np.int64)
    src = rels.column("sourceNodeId").to_numpy()
    dst = rels.column("targetNodeId").to_numpy()
    if undirected:
        src, dst = symmetrise(src, dst)
    split = make_split(y, seed=seed, train_per_class=train_per_class, val=num_val, test=num_test)
    return GraphData.from_edge_ids(ids, x, src, dst, y=y, split=split, name="cora")
