"""The front end's graph facts (serving.online.costs.GraphFacts): built from a graph held in memory
(`of_graph`, what a swap to a published delta uses) they equal those read from its directory."""

import numpy as np

from sparkgnn.datasets.synthetic import synthetic_graph
from sparkgnn.graph import write_graph_dir
from sparkgnn.serving.online.costs import GraphFacts


def test_facts_of_a_held_graph_equal_those_read_from_its_directory(tmp_path):
    graph = synthetic_graph(300, 2_000, 8, seed=4)
    write_graph_dir(graph, str(tmp_path / "g"))
    read, held = GraphFacts.load(str(tmp_path / "g"), None, 2), GraphFacts.of_graph(graph, None, 2)
    assert np.array_equal(read.id_index.ids, held.id_index.ids) and held.feature_dim == read.feature_dim == 8
    assert np.array_equal(read.in_degree, held.in_degree) and np.array_equal(read.psgs, held.psgs)
    assert held.in_degree.sum() == graph.num_edges and held.fresh_id() == int(graph.ids.max()) + 1
