"""Which strategy auto picks, and that the bytes behind it are the brief's formulas."""

import math

import pytest

from sparkgnn.errors import PlanError
from sparkgnn.planner import STRATEGIES, compile


def _shuffles(layer_plan, layer_index=None):
    return [op for op in layer_plan.ops if op.name == "Shuffle" and (layer_index is None or op.layer == layer_index)]


def test_registry_holds_the_four_strategies():
    assert tuple(STRATEGIES) == ("edge_join", "replicate", "combine", "pushdown")


def test_auto_picks_replicate_when_mirrors_are_few(make):
    # R_f = 1.5: each vertex is needed on 0.5 remote partitions on average, against 10 edges.
    plan = compile(make.sage_model(can_pre=False), make.stats(mirror_rows=100_000, combine_rows=500_000), make.task())
    assert [lp.strategy for lp in plan.layers] == ["replicate", "replicate"]
    first = plan.layers[0]
    assert first.candidates["replicate"] < first.candidates["combine"] < first.candidates["edge_join"]
    assert "R_f = 1.50" in first.reason


def test_auto_picks_combine_when_partial_states_are_few(make):
    # Every vertex has sources on every partition (mirror_rows at its maximum |V|(P-1)), but the
    # in-edges of a destination concentrate so only 20K partial states cross partitions.
    plan = compile(make.sage_model(can_pre=False), make.stats(mirror_rows=600_000, combine_rows=20_000), make.task())
    assert [lp.strategy for lp in plan.layers] == ["combine", "combine"]
    assert "partial states" in plan.layers[0].reason


def test_auto_picks_edge_join_when_mirrors_are_as_many_as_edges(make):
    # Out-degree 3 and every edge crosses partitions: replication ships one row per edge anyway
    # (plus its routing table and the edges into Python), and partial states are as many too.
    plan = compile(
        make.sage_model(can_pre=False),
        make.stats(num_edges=600_000, mirror_rows=600_000, combine_rows=600_000, in_mirror_rows=600_000),
        make.task(),
    )
    assert [lp.strategy for lp in plan.layers] == ["edge_join", "edge_join"]
    costs = plan.layers[0].candidates
    assert costs["edge_join"] == min(costs.values())


def test_shuffle_bytes_follow_the_brief_formulas(make):
    v, e, p = 200_000, 2_000_000, 4
    mirror, combine, in_mirror = 100_000, 500_000, 50_000
    graph_stats = make.stats(
        num_vertices=v, num_edges=e, partitions=p, mirror_rows=mirror, combine_rows=combine, in_mirror_rows=in_mirror
    )
    layers = [make.layer(0, 128, 64, can_pre=False)]
    src, state, in_dim = 128, 129, 128
    expected = {
        "edge_join": e * (src * 4 + 16) + v * (in_dim * 4 + 16),
        "replicate": mirror * (src * 4 + 16) + v * (in_dim * 4 + 16),
        "combine": combine * (state * 4 + 16) + v * (in_dim * 4 + 16),
    }
    for name, want in expected.items():
        plan = compile(layers, graph_stats, make.task(name))
        (shuffle,) = _shuffles(plan.layers[0])
        assert shuffle.est_bytes == want, name


def test_combine_with_a_dst_dependent_message_exchanges_dst_payloads_first(make):
    layers = [make.gat_layer(0, 128, 16, heads=4), make.gat_layer(1, 64, 8, heads=1)]
    graph_stats = make.stats(in_mirror_rows=70_000)
    plan = compile(layers, graph_stats, make.task("combine"))
    second = plan.layers[1]
    dst_width = layers[1]["dst_width"]
    shuffles = _shuffles(second, 1)
    assert shuffles[0].est_bytes == 70_000 * (dst_width * 4 + 16)
    assert any(op.name == "Scatter" and "dst payload" in op.detail for op in second.ops)
    assert second.passes == 2  # dst payloads must reach the sources before partials exist
    plain = compile(make.sage_model((128, 64, 16)), graph_stats, make.task("combine"))
    assert plain.layers[1].passes == 1


def test_forced_strategies_are_honoured_and_explained(make):
    for name in STRATEGIES:
        plan = compile(make.sage_model(), make.stats(), make.task(name, native_aggregates=True))
        assert {lp.strategy for lp in plan.layers} == {name}
        assert all(set(lp.candidates) == set(STRATEGIES) for lp in plan.layers)
        assert plan.layers[0].reason.startswith(f"forced by task strategy={name}")
    auto = compile(make.sage_model(), make.stats(), make.task())
    forced = compile(make.sage_model(), make.stats(), make.task("edge_join"))
    assert auto.estimates["seconds"] < forced.estimates["seconds"]
    assert "auto would pick" in forced.layers[0].reason


def test_a_strategy_without_its_statistics_is_not_a_candidate(make):
    graph_stats = make.stats()
    del graph_stats["mirror_rows"]
    plan = compile(make.sage_model(), graph_stats, make.task())
    assert math.isinf(plan.layers[0].candidates["replicate"])
    assert "mirror_rows" in plan.layers[0].reason
    with pytest.raises(PlanError, match="replicate.*mirror_rows"):
        compile(make.sage_model(), graph_stats, make.task("replicate"))


def test_forced_combine_on_a_gat_layer_needs_in_mirror_rows(make):
    graph_stats = make.stats()
    del graph_stats["in_mirror_rows"]
    with pytest.raises(PlanError, match="in_mirror_rows"):
        compile([make.gat_layer(0, 128, 16)], graph_stats, make.task("combine"))
    # edge_join and replicate bring the destination's own row along, so they still apply.
    plan = compile([make.gat_layer(0, 128, 16)], graph_stats, make.task())
    assert plan.layers[0].strategy in ("edge_join", "replicate")


def test_data_dependent_statistics_rule_out_combine(make):
    layers = [make.layer(0, 128, 64, aggregator="moments", required_stats=["mean"])]
    plan = compile(layers, make.stats(mirror_rows=600_000, combine_rows=1_000), make.task())
    assert math.isinf(plan.layers[0].candidates["combine"])
    assert plan.layers[0].strategy != "combine"


def test_static_statistics_are_computed_once_in_the_graph_engine(make):
    layers = [
        make.layer(0, 128, 64, kind="gcn", aggregator="sum", required_stats=["gcn_degree"]),
        make.layer(1, 64, 16, kind="gcn", aggregator="sum", required_stats=["gcn_degree"]),
    ]
    plan = compile(layers, make.stats(), make.task())
    stat_ops = [op for op in plan.operators() if "static per-vertex statistics" in op.detail]
    assert len(stat_ops) == 1 and stat_ops[0].engine == "GRAPH"
    assert "gcn_degree" in stat_ops[0].detail


def test_switching_partitioning_between_layers_is_charged_once(make):
    layers = make.sage_model((128, 64, 16), can_pre=False)
    plan = compile(layers, make.stats(), make.task("replicate"))
    partitions = [op for op in plan.operators() if op.name == "Partition"]
    assert [op.attrs["key"] for op in partitions] == ["dst"]
    assert partitions[0] in plan.layers[0].ops


def test_requested_ids_shrink_the_last_layer_only(make):
    full = compile(make.sage_model(), make.stats(), make.task())
    some = compile(make.sage_model(), make.stats(), make.task(ids=20_000))
    assert some.layers[0].estimates == full.layers[0].estimates
    assert some.layers[-1].estimates["shuffle_bytes"] < full.layers[-1].estimates["shuffle_bytes"] / 5
    assert any("requested ids" in op.detail for op in some.operators())
