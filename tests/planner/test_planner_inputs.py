"""Malformed inputs are refused with a PlanError that names the fault."""

import pytest

from sparkgnn.errors import PlanError
from sparkgnn.planner import compile


def test_missing_layer_key_names_layer_and_key(make):
    layers = make.sage_model()
    del layers[1]["state_width"]
    with pytest.raises(PlanError, match=r"layers\[1\].*state_width"):
        compile(layers, make.stats(), make.task())


def test_missing_width_subkey(make):
    layers = make.sage_model()
    layers[0]["src_width"] = {"raw": 128}
    with pytest.raises(PlanError, match=r"src_width.*pre_transform"):
        compile(layers, make.stats(), make.task())


def test_missing_graph_stat(make):
    graph_stats = make.stats()
    del graph_stats["num_edges"]
    with pytest.raises(PlanError, match="graph_stats.*num_edges"):
        compile(make.sage_model(), graph_stats, make.task())


def test_missing_task_key(make):
    task = make.task()
    del task["cores"]
    with pytest.raises(PlanError, match="task.*cores"):
        compile(make.sage_model(), make.stats(), task)


def test_unknown_task_key_is_refused(make):
    with pytest.raises(PlanError, match="unknown key.*fuse_ops"):
        compile(make.sage_model(), make.stats(), make.task(fuse_ops=True))


@pytest.mark.parametrize("value", [0, -4])
def test_nonpositive_partitions_in_stats(make, value):
    with pytest.raises(PlanError, match=r"graph_stats\['partitions'\] must be positive"):
        compile(make.sage_model(), make.stats(partitions=value), make.task())


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "4"])
def test_bad_partitions_in_task(make, value):
    with pytest.raises(PlanError, match=r"task\['partitions'\]"):
        compile(make.sage_model(), make.stats(), make.task(partitions=value))


def test_task_partitions_must_match_the_stats(make):
    with pytest.raises(PlanError, match="task asks for 8 partitions but graph_stats were computed for 4"):
        compile(make.sage_model(), make.stats(), make.task(partitions=8))
    assert compile(make.sage_model(), make.stats(), make.task(partitions=4)).partitions == 4


def test_unknown_strategy_lists_the_choices(make):
    with pytest.raises(PlanError, match="unknown strategy 'fastest'.*auto, edge_join, replicate, combine"):
        compile(make.sage_model(), make.stats(), make.task("fastest"))


def test_non_decomposable_layer_is_rejected_by_name(make):
    layers = make.sage_model()
    layers[1].update(aggregator="lstm", decomposable=False)
    with pytest.raises(PlanError, match=r"layer 1 \(sage, aggregator 'lstm'\).*not decomposable.*collect_all"):
        compile(layers, make.stats(), make.task())


def test_non_decomposable_layer_runs_collect_all_when_allowed(make):
    layers = make.sage_model()
    layers[1].update(aggregator="lstm", decomposable=False)
    plan = compile(layers, make.stats(), make.task(collect_all=True))
    assert plan.collect_all and plan.partitions == 1
    assert plan.graph_stats["mirror_rows"] == 0 and plan.graph_stats["combine_rows"] == 0
    lstm = [op for op in plan.operators() if op.layer == 1 and op.name == "LocalAggregate"]
    assert lstm and all(op.attrs.get("single_batch") for op in lstm)
    assert plan.layers[1].strategy in ("edge_join", "replicate")
    assert all(
        lp.reason.startswith("collect-all on 1 partition") and "layer 1 (lstm)" in lp.reason for lp in plan.layers
    )
    with pytest.raises(PlanError, match="combine.*cannot"):
        compile(layers, make.stats(), make.task("combine", collect_all=True))
    small = compile(layers, make.stats(), make.task(collect_all=True, memory_per_task_bytes=64 << 20))
    assert small.warnings and "collect-all path runs on one partition" in small.warnings[0]


def test_widths_need_not_chain(make):
    """Node-wise ops between convs (a Linear, a head) may change widths: h^1 is what the next
    conv reads, x what the first pass reads."""
    from sparkgnn.planner import compile as plan_compile

    layers = [make.layer(0, 128, 64), make.layer(1, 32, 16)]
    plan = plan_compile(layers, make.stats(feature_dim=300), make.task("edge_join"))
    kept = [op for op in plan.layers[0].ops if op.name == "Pipe" and "h^1" in op.attrs.get("kept", {})]
    assert kept and kept[0].attrs["kept"]["h^1"] == 200_000 * (32 * 4 + 8)
    first = plan.layers[0].ops
    opener = next(op for op in first if op.name == "Pipe")
    assert opener.attrs["carried"] == 200_000 * (300 * 4 + 8)  # x enters the first pass


def test_layers_must_be_in_order(make):
    layers = make.sage_model()
    layers[0]["index"], layers[1]["index"] = 1, 0
    with pytest.raises(PlanError, match=r"layers\[0\] has index 1"):
        compile(layers, make.stats(), make.task())


def test_empty_and_non_list_layers(make):
    with pytest.raises(PlanError, match="empty"):
        compile([], make.stats(), make.task())
    with pytest.raises(PlanError, match="list"):
        compile({"index": 0}, make.stats(), make.task())


def test_impossible_replication_counts_are_caught(make):
    # At most one mirror per (vertex, other partition), and at most one per edge.
    with pytest.raises(PlanError, match="mirror_rows.*cannot exceed"):
        compile(make.sage_model(), make.stats(mirror_rows=700_000), make.task())
    with pytest.raises(PlanError, match="combine_rows.*cannot exceed"):
        compile(
            make.sage_model(),
            make.stats(num_edges=1000, mirror_rows=10, in_mirror_rows=10, combine_rows=1001, max_partition_edges=500),
            make.task(),
        )


def test_wrong_types_name_the_field(make):
    layers = make.sage_model()
    layers[0]["decomposable"] = "yes"
    with pytest.raises(PlanError, match=r"decomposable'\] must be a bool"):
        compile(layers, make.stats(), make.task())
    with pytest.raises(PlanError, match="num_vertices.*integer"):
        compile(make.sage_model(), make.stats(num_vertices="many"), make.task())
    with pytest.raises(PlanError, match="fuse.*bool"):
        compile(make.sage_model(), make.stats(), make.task(fuse=1))


def test_attention_without_dst_payload_is_inconsistent(make):
    layers = [make.layer(0, 128, 64, needs_dst=True, dst_width=0)]
    with pytest.raises(PlanError, match="dst_width 0"):
        compile(layers, make.stats(), make.task())


def test_too_many_requested_ids(make):
    with pytest.raises(PlanError, match="requests 300000 ids but the graph has only 200000"):
        compile(make.sage_model(), make.stats(), make.task(ids=300_000))
    with pytest.raises(PlanError, match="ids"):
        compile(make.sage_model(), make.stats(), make.task(ids=0))
