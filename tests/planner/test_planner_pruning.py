"""planner.pruning: which way a request for some ids runs (local / subgraph / whole), priced from the
frontier's sizes; the IR of a local run (the frontier's joins, one aggregation per layer over exactly
the in-edges it needs); Plan.pruning in JSON and explain."""

import math

import pytest

from sparkgnn.planner import Plan, pruning
from sparkgnn.planner.errors import PlanError

LAYERS = [
    {"kind": "sage", "aggregator": "mean", "in_dim": 128, "out_dim": 128},
    {"kind": "sage", "aggregator": "mean", "in_dim": 128, "out_dim": 128},
]


def _per_edge(num_vertices: int, num_edges: int) -> float:
    """A stand-in for planner.compile's estimate: 1 s per layer plus 1 us per edge per layer."""
    return 2 * (1.0 + num_edges * 1e-6)


def _inputs(vertices, in_edges, collected=True, needs_stats=False, whole_prepared=False):
    return pruning.PruningInputs(
        layers=LAYERS,
        num_vertices=200_000,
        num_edges=2_000_000,
        feature_dim=128,
        frontier=pruning.Frontier(vertices, in_edges),
        collected=collected,
        layer_seconds=_per_edge,
        whole_prepared=whole_prepared,
        needs_stats=needs_stats,
    )


def test_the_choices_are_the_registry():
    assert pruning.PRUNE_CHOICES == ("auto", "off", *pruning.PRUNINGS)


def test_a_small_collected_frontier_runs_on_the_driver():
    choice = pruning.choose(_inputs([1000, 11_655, 80_650], [11_016, 104_566]))
    assert choice.mode == "local", choice.reason
    assert choice.candidates["local"] < choice.candidates["whole"]
    assert choice.reason.startswith("local est")


def test_a_frontier_too_large_for_the_driver_runs_the_pruned_subgraph():
    choice = pruning.choose(_inputs([1000, 30_000, 90_000], [40_000, 400_000], collected=False))
    assert choice.mode == "subgraph"
    assert math.isinf(choice.candidates["local"]) and "driver budget" in choice.blockers["local"]


def test_a_frontier_covering_most_of_the_graph_runs_the_whole_graph():
    choice = pruning.choose(_inputs([1000, 100_000, 190_000], [300_000, 1_500_000], collected=False))
    assert choice.mode == "whole"
    assert "covers 75% of the edges" in choice.blockers["subgraph"]


def test_statistics_need_one_more_hop_for_the_subgraph():
    inputs = _inputs([10, 100, 1000], [120, 1500], collected=False, needs_stats=True)
    assert "needs 3" in pruning.choose(inputs).blockers["subgraph"]
    inputs = _inputs([10, 100, 1000, 5000], [120, 1500, 9000], collected=False, needs_stats=True)
    assert pruning.subgraph_size(inputs) == (5000, 9000)
    assert pruning.choose(inputs).mode == "subgraph"


def test_out_edge_statistics_keep_the_subgraph_out():
    """A layer reading an out-edge statistic (ChebConv's degree) cannot run on a subgraph of in-edges."""
    inputs = _inputs([1000, 30_000, 90_000, 120_000], [40_000, 400_000, 500_000], collected=False, needs_stats=True)
    inputs.out_edge_stats = True
    choice = pruning.choose(inputs)
    assert choice.mode == "whole" and "out-edge statistic" in choice.blockers["subgraph"]
    with pytest.raises(PlanError, match="in-edges only"):
        pruning.choose(inputs, "subgraph")


def test_a_prepared_whole_graph_is_cheaper_to_run_whole():
    cold = pruning.choose(_inputs([1000, 50_000, 150_000], [60_000, 900_000], collected=False))
    warm = pruning.choose(_inputs([1000, 50_000, 150_000], [60_000, 900_000], collected=False, whole_prepared=True))
    assert warm.candidates["whole"] < cold.candidates["whole"]


def test_a_forced_strategy_leaves_the_driver_out():
    inputs = _inputs([1000, 11_655, 80_650], [11_016, 104_566])
    inputs.strategy = "combine"
    choice = pruning.choose(inputs)
    assert choice.mode != "local" and "strategy 'combine' was asked for" in choice.blockers["local"]


def test_a_forced_mode_that_cannot_apply_is_refused_with_its_reason():
    with pytest.raises(PlanError, match="pruning 'local' cannot run this request: the frontier's in-edges"):
        pruning.choose(_inputs([1000, 30_000, 90_000], [40_000, 400_000], collected=False), "local")
    with pytest.raises(PlanError, match="unknown pruning mode"):
        pruning.choose(_inputs([1, 2, 3], [1, 2]), "nearby")


def test_the_local_plan_joins_hop_by_hop_and_shrinks_layer_by_layer():
    inputs = _inputs([1000, 11_655, 80_650], [11_016, 104_566])
    plan = pruning.local_plan(pruning.choose(inputs), inputs)
    joins = [op for op in plan.operators() if op.name == "Join"]
    assert [op.est_rows for op in joins] == [11_016, 104_566] and all(op.engine == "GRAPH" for op in joins)
    aggregates = [op for op in plan.operators() if op.name == "LocalAggregate"]
    assert [op.attrs["edges"] for op in aggregates] == [104_566, 11_016]
    updates = [op.est_rows for op in plan.operators() if op.name == "ApplyVertex"]
    assert updates == [11_655, 1000]
    assert plan.estimates["seconds"] == pytest.approx(sum(layer.estimates["seconds"] for layer in plan.layers))
    again = Plan.from_json(plan.to_json())
    assert again.pruning == plan.pruning and [op.name for op in again.operators()] == [
        op.name for op in plan.operators()
    ]
    text = plan.explain()
    assert "frontier vertices: D_0 1,000 / D_1 11,655 / D_2 80,650" in text
    assert "layer 1/2 needs h for D_1 (11,655 vertices) from its 104,566 in-edges" in text
    assert "hop 2: edges (scan of 2,000,000) semi-join D_1 on dst -> 104,566 in-edges" in text
