"""The pushdown strategy in the planner: when it applies (and why not), what it costs, that auto
picks it where the cost model says it is cheapest, and that explain() shows the native aggregate."""

import math

import pytest

from sparkgnn.planner import CostModel, PlanError, compile, measure
from sparkgnn.planner.pushdown import NATIVE_AGGREGATES, buffer_row_bytes


def _task(make, strategy="auto", available=True):
    return make.task(strategy, native_aggregates=True if available else "no jar here (test)")


def test_blocked_without_the_jvm_functions_with_their_reason(make):
    plan = compile(make.sage_model(), make.stats(), _task(make, available=False))
    assert math.isinf(plan.layers[0].candidates["pushdown"])
    assert "pushdown: no jar here (test)" in plan.layers[0].reason
    with pytest.raises(PlanError, match="strategy 'pushdown' cannot run .*no jar here"):
        compile(make.sage_model(), make.stats(), _task(make, "pushdown", available=False))


def test_default_task_never_offers_pushdown(make):
    plan = compile(make.sage_model(), make.stats(), make.task())
    assert "not checked for the sparkgnn JVM functions" in plan.layers[0].reason


@pytest.mark.parametrize(
    ("layer_kw", "reason"),
    [
        ({"message_scaled": False}, "not a scaled source payload"),
        ({"aggregator": "std", "state_extra": 65}, "no native aggregate for 'std'"),
        ({"needs_dst": True, "dst_width": 4}, "reads the destination"),
    ],
)
def test_blocked_for_layers_it_cannot_form(make, layer_kw, reason):
    layers = [make.layer(0, 128, 16, **layer_kw)]
    with pytest.raises(PlanError, match=reason):
        compile(layers, make.stats(), _task(make, "pushdown"))


def test_program_moves_payloads_partials_and_states_and_reduces_edges_in_the_jvm(make):
    stats = make.stats()
    plan = compile(make.sage_model(can_pre=False), stats, _task(make, "pushdown"))
    layer = plan.layers[1]
    estimate = measure(layer.ops)
    assert estimate.jvm_edges == stats["num_edges"]
    assert estimate.edges == 0  # no edge reaches the DL engine
    aggregate = [op for op in layer.ops if op.engine == "GRAPH" and op.name == "LocalAggregate"]
    assert len(aggregate) == 1 and aggregate[0].attrs["function"] == NATIVE_AGGREGATES["mean"][0]
    assert aggregate[0].attrs["width"] == 64 and aggregate[0].attrs["self_loops"] == "none"
    partials = [op for op in layer.ops if op.name == "Shuffle" and "partial states" in op.detail]
    combine_rows = stats["combine_rows"]
    assert partials[0].est_bytes >= combine_rows * buffer_row_bytes(64)
    text = plan.explain()
    assert "pushdown" in text and "sparkgnn_vec_sum_count(payload, 64)" in text


def test_auto_picks_pushdown_where_it_is_cheapest(make):
    cheap_jvm = CostModel(jvm_edge_s=1e-12, per_edge_s=1e-5)
    plan = compile(make.sage_model(), make.stats(), _task(make), cheap_jvm)
    assert [lp.strategy for lp in plan.layers] == ["pushdown", "pushdown"]
    assert plan.layers[0].reason.startswith("auto: pushdown is cheapest")
    dear_jvm = CostModel(jvm_edge_s=1e-3)
    plan = compile(make.sage_model(), make.stats(), _task(make), dear_jvm)
    assert "pushdown" not in [lp.strategy for lp in plan.layers]
    assert all(not math.isinf(lp.candidates["pushdown"]) for lp in plan.layers)  # costed, not chosen
