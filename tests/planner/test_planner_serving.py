"""planner.serving: request sizes -> IR plans with estimates; every engine compiles, plans survive
a JSON round trip, estimates grow with the sizes, choose() keeps the cheapest and says so."""

import math

import pytest

from sparkgnn.planner import PlanError
from sparkgnn.planner.ir import Plan
from sparkgnn.planner.serving import (
    DEFAULT_COST,
    LayerCounts,
    RequestCounts,
    ServingCostModel,
    choose,
    compile_request,
    explain_request,
)

MODES = {"full": "recompute", "ns": "recompute", "he": "delta", "srpe": "delta", "exact": "delta"}


def counts(mode, edges=1000, targets=100, partitions=1, layers=2):
    engine = MODES[mode]
    per_layer = tuple(
        LayerCounts(
            layer=l,
            kind="sage",
            in_dim=64,
            out_dim=64,
            msg_width=64,
            targets=targets,
            from_state=targets // 2 if engine == "delta" else 0,
            rows_in=targets,
            edges=edges,
            old_edges=edges // 4 if mode == "exact" else 0,
            rows_loaded=targets,
            bytes_loaded=targets * 256,
            index_edges=edges,
            aggregator="mean",
        )
        for l in range(1, layers + 1)
    )
    return RequestCounts(mode, engine, 16, 40, per_layer, partitions=partitions)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_mode_compiles_to_an_operator_tree(mode):
    plan = compile_request(counts(mode, partitions=2 if MODES[mode] == "delta" else 1))
    names = [op.name for op in plan.operators()]
    assert names[0] == "SplitRequest"
    assert len(plan.layers) == 2 and plan.strategy == mode
    expected = {"LocalAggregate", "ApplyVertex"}
    if MODES[mode] == "delta":
        expected |= {"SelectRecompute", "LoadPE", "Merge", "AllGather"}
    else:
        expected |= {"Scan"}
    assert expected <= set(names)
    assert plan.estimates["seconds"] > 0
    assert math.isclose(
        plan.estimates["seconds"],
        DEFAULT_COST.request_s + sum(l.estimates["seconds"] for l in plan.layers),
        rel_tol=1e-6,
    )
    # every operator's inputs are earlier operators (a DAG in execution order)
    seen = set()
    for op in plan.operators():
        assert all(child.id in seen for child in op.children), op.id
        seen.add(op.id)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_json_round_trip(mode):
    plan = compile_request(counts(mode, partitions=3 if MODES[mode] == "delta" else 1))
    again = Plan.from_json(plan.to_json())
    assert again.to_dict() == plan.to_dict()
    assert explain_request(again) == explain_request(plan)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("field", ["edges", "targets"])
def test_estimates_grow_with_sizes(mode, field):
    small = compile_request(counts(mode, **{field: 100})).estimates["seconds"]
    large = compile_request(counts(mode, **{field: 10_000})).estimates["seconds"]
    assert large > small


def test_choose_keeps_the_cheapest_and_records_candidates():
    cheap, dear = counts("full", edges=100), counts("exact", edges=100_000)
    choice = choose({"exact": dear, "full": cheap})
    assert choice.mode == "full" and choice.seconds["full"] < choice.seconds["exact"]
    info = choice.plan.graph_stats["serving"]
    assert set(info["candidates"]) == {"exact", "full"} and info["chosen_by"] == "cost"
    assert set(choice.plan.layers[0].candidates) == {"exact", "full"}
    text = explain_request(choice.plan)
    assert "mode=full" in text and "full" in text and "(chosen)" in text and "exact" in text
    for name in ("SplitRequest", "Scan", "LocalAggregate", "ApplyVertex"):
        assert name in text


def test_cost_model_round_trip_and_refusals():
    cost = ServingCostModel(request_s=1e-3)
    assert ServingCostModel.from_dict(cost.to_dict()) == cost
    with pytest.raises(PlanError, match="unknown ServingCostModel"):
        ServingCostModel.from_dict({"nope": 1.0})
    with pytest.raises(PlanError, match=">= 0"):
        ServingCostModel(flop_s=-1.0)
    with pytest.raises(PlanError, match="engine"):
        RequestCounts("x", "spark", 1, 0, counts("full").layers)
    with pytest.raises(PlanError, match=">= 0"):
        LayerCounts(layer=1, kind="sage", in_dim=1, out_dim=1, msg_width=1, targets=-1)


def test_features_reproduce_the_estimate():
    """The calibration's design matrix (features) times the constants is the plan's estimate."""
    for mode in MODES:
        c = counts(mode, partitions=2 if MODES[mode] == "delta" else 1)
        row = ServingCostModel.features(c)
        total = sum(getattr(DEFAULT_COST, k) * v for k, v in row.items())
        assert math.isclose(total, compile_request(c).estimates["seconds"], rel_tol=1e-6)
