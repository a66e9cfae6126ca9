"""refresh_kernel.GraphStats: the node statistics a refresh reads for the old and the new graph at
every layer are those compute_stats gives, computed once per (graph, statistic, weighted) and kept
for the last `keep` graphs; a graph it no longer keeps is computed again; the unweighted GCN degree
of an updated graph follows from the old graph's and the change, equal to a pass over every edge."""

import dataclasses
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "serving"))
from serving_testkit import pyg_model, skewed_graph  # noqa: E402

from sparkgnn.graph.updates import GraphUpdate, apply  # noqa: E402
from sparkgnn.layers.base import compute_stats  # noqa: E402
from sparkgnn.models import Model  # noqa: E402
from sparkgnn.pe.follow_state import compose  # noqa: E402
from sparkgnn.pe.refresh_kernel import GraphStats  # noqa: E402


def _expected(conv, graph) -> dict:
    weight = torch.from_numpy(graph.weight.copy()) if graph.weight is not None and not conv.edge_attr_dim else None
    src, dst = torch.from_numpy(graph.edge_src.copy()), torch.from_numpy(graph.edge_dst.copy())
    return compute_stats(conv, src, dst, weight, graph.num_nodes)


def _convs(kind: str, graph):
    return Model.from_pyg(pyg_model(kind, graph.feature_dim, 2, seed=1)).convs


def test_the_statistics_are_compute_stats_ones_and_each_is_computed_once_per_graph():
    graph = skewed_graph()  # weights, self loops (one duplicated), parallel edges, isolated vertices
    first, second = _convs("gcn", graph)
    stats = GraphStats()
    got = stats.of(first, graph)
    assert set(got) == set(first.required_stats) == {"gcn_degree"}
    for name, value in _expected(first, graph).items():
        assert torch.equal(got[name], value), name
    # the second layer reads the same statistic of the same graph: the tensor kept, not a new one
    assert stats.of(second, graph)["gcn_degree"] is got["gcn_degree"]


def test_a_conv_without_statistics_reads_none_and_each_graph_has_its_own():
    graph = skewed_graph()
    (sage, _), (gcn, _) = _convs("sage", graph), _convs("gcn", graph)
    stats = GraphStats()
    assert stats.of(sage, graph) == {}
    update = GraphUpdate(
        edge_insert_src=graph.ids[:3], edge_insert_dst=graph.ids[3:6], edge_insert_weight=np.ones(3, np.float32)
    )
    new = apply(update, graph).graph
    old_deg, new_deg = stats.of(gcn, graph)["gcn_degree"], stats.of(gcn, new)["gcn_degree"]
    assert torch.equal(new_deg, _expected(gcn, new)["gcn_degree"])
    assert not torch.equal(old_deg, new_deg)  # three more in-edges
    assert stats.of(gcn, graph)["gcn_degree"] is old_deg  # both kept (keep=2)


def test_a_graph_past_the_kept_ones_is_computed_again_with_the_same_values():
    graph = skewed_graph()
    gcn = _convs("gcn", graph)[0]
    stats = GraphStats(keep=2)
    graphs = [graph]
    for i in range(2):
        update = GraphUpdate(
            edge_insert_src=graph.ids[i : i + 1],
            edge_insert_dst=graph.ids[i + 4 : i + 5],
            edge_insert_weight=np.full(1, 0.5, np.float32),
        )
        graphs.append(apply(update, graphs[-1]).graph)
    first = stats.of(gcn, graphs[0])["gcn_degree"]
    for g in graphs[1:]:
        stats.of(gcn, g)
    again = stats.of(gcn, graphs[0])["gcn_degree"]
    assert again is not first and torch.equal(again, first)


def test_follow_derives_the_unweighted_gcn_degree_of_each_update_from_the_last_graph_s():
    """Mixed updates (edge deletes and inserts, loops among both, vertex inserts and deletes), each
    applied and two composed into one batch as the follower does: the degree `follow` derives from
    the old graph's and the change equals a pass over every edge of the new graph."""
    sys.path.insert(0, os.path.dirname(__file__))
    from test_refresh import random_update

    graph = dataclasses.replace(skewed_graph(), weight=None)  # loops (one doubled), parallel edges, isolated vertices
    gcn = _convs("gcn", graph)[0]
    stats = GraphStats()
    stats.of(gcn, graph)
    for seed in range(3):
        applied = apply(random_update(graph, seed=seed, weighted=False), graph)
        if seed == 2:  # two updates composed into one batch
            second = apply(random_update(applied.graph, seed=7, weighted=False), applied.graph)
            applied = compose(applied, second, graph.x)
        stats.follow(graph, applied)
        derived = stats.of(gcn, applied.graph)["gcn_degree"]
        assert torch.equal(derived, _expected(gcn, applied.graph)["gcn_degree"]), seed
        graph = applied.graph
