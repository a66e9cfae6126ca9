"""Transform-then-propagate and fusion."""

import pytest

from sparkgnn.planner import compile, measure
from sparkgnn.planner.rewrites import fuse, hoist
from sparkgnn.planner.segments import dl, graph, segment


def _edge_join_shuffle(plan, index):
    return next(op for op in plan.layers[index].ops if op.name == "Shuffle" and op.layer == index)


@pytest.mark.parametrize(
    "raw,pre,allowed,expected",
    [
        (128, 16, True, True),  # shrinks: transform first
        (16, 64, True, False),  # would grow (e.g. 16 -> 64 hidden): propagate raw
        (64, 64, True, False),  # no gain
        (128, 16, False, False),  # not a per-vertex linear message: not allowed
    ],
)
def test_pre_transform_toggles_with_widths(make, raw, pre, allowed, expected):
    layers = [make.layer(0, raw, 64, src=raw, pre=pre, can_pre=allowed)]
    plan = compile(layers, make.stats(feature_dim=raw), make.task("edge_join"))
    layer = plan.layers[0]
    assert layer.pre_transform is expected
    width = pre if expected else raw
    stats = make.stats(feature_dim=raw)
    assert _edge_join_shuffle(plan, 0).est_bytes == stats["num_edges"] * (width * 4 + 16) + stats["num_vertices"] * (
        raw * 4 + 16
    )
    assert any("transform-then-propagate" in note for note in layer.rewrites)


def test_pre_transform_makes_the_plan_cheaper(make):
    shrink = compile([make.layer(0, 128, 8)], make.stats(), make.task())
    keep = compile([make.layer(0, 128, 8, can_pre=False)], make.stats(), make.task())
    assert shrink.layers[0].pre_transform and not keep.layers[0].pre_transform
    assert shrink.estimates["shuffle_bytes"] < keep.estimates["shuffle_bytes"]
    assert shrink.estimates["seconds"] < keep.estimates["seconds"]


@pytest.mark.parametrize("strategy", ["edge_join", "replicate", "combine"])
def test_fusion_gives_one_pass_per_layer_after_the_first(make, strategy):
    layers = make.sage_model((128, 64, 64, 16))
    fused = compile(layers, make.stats(), make.task(strategy))
    unfused = compile(layers, make.stats(), make.task(strategy, fuse=False))
    assert [lp.passes for lp in fused.layers][1:] == [1, 1]
    assert fused.layers[0].passes == 2  # the first pass prepares layer 0's payloads from x
    assert all(u.passes > f.passes for u, f in zip(unfused.layers[1:], fused.layers[1:], strict=True))
    assert fused.estimates["python_bytes"] < unfused.estimates["python_bytes"]
    assert fused.estimates["seconds"] < unfused.estimates["seconds"]
    assert fused.estimates["shuffle_bytes"] == unfused.estimates["shuffle_bytes"]


def test_fusion_hoists_the_next_layers_preparation_into_this_pass(make):
    plan = compile(make.sage_model((128, 64, 16)), make.stats(), make.task("edge_join"))
    first = plan.layers[0]
    hoisted = [op for op in first.ops if op.layer == 1]
    assert [op.name for op in hoisted] == ["ApplyVertex"] and "prepare_src of layer 1" in hoisted[0].detail
    # ...inside the same round trip as layer 0's update: no Pipe between them.
    names = [op.name for op in first.ops]
    update = next(i for i, op in enumerate(first.ops) if "update" in op.detail)
    assert names[update + 1] == "ApplyVertex" and first.ops[update + 1].layer == 1
    assert not any(op.layer == 1 for op in plan.layers[1].ops if op.engine == "DL" and "prepare_src" in op.detail)
    assert any("fusion" in note and "[1]" in note for note in first.rewrites)


def test_fused_pass_ships_shared_inputs_once():
    """Two DL steps both reading the own rows: fused, the rows cross once; the intermediate state
    never crosses; kept outputs of both steps come back in the closing Pipe."""
    own = {"own_rows^0": 1000}
    ops = (
        segment([dl("LocalAggregate", "agg", edges=10)], layer=0, side={"edges": 500, **own}, intermediate=300)
        + segment([dl("ApplyVertex", "update")], layer=0, carried=300, side=own, kept={"h^1": 200})
        + [graph("Materialize", 0, "h^1")]
    )
    unfused, fused = measure(ops), measure(fuse(ops))
    assert (unfused.passes, fused.passes) == (2, 1)
    assert unfused.python_in_bytes == 1500 + 1300 and fused.python_in_bytes == 1500
    assert unfused.python_out_bytes == 300 + 200 and fused.python_out_bytes == 200
    assert fused.edges == unfused.edges == 10


def test_hoisted_prefix_keeps_both_layers_outputs():
    host = segment([dl("ApplyVertex", "update")], layer=0, carried=10, kept={"h^1": 100}) + [
        graph("Materialize", 0, "h^1")
    ]
    prefix = segment(
        [dl("ApplyVertex", "prepare", layer=1)],
        layer=1,
        carried=100,
        side={"edges_by_src": 40},
        kept={"src_payload^1": 30},
    )
    ops = fuse(hoist(host, prefix))
    assert [op.name for op in ops] == ["Pipe", "ApplyVertex", "ApplyVertex", "Pipe", "Materialize"]
    opener, closer = ops[0], ops[3]
    assert opener.est_bytes == 10 + 40 and opener.attrs["side"] == {"edges_by_src": 40}
    assert closer.attrs["kept"] == {"h^1": 100, "src_payload^1": 30} and closer.layer == 0
