"""Strategies -> fused step sequence (pure Python)."""

import pytest

from sparkgnn.engine.schedule import schedule


def test_first_step_prepares_layer_one_and_last_emits_output():
    steps = schedule(["replicate", "replicate"], [False, False])
    assert [(s.layer, s.inputs, s.outputs) for s in steps] == [
        (-1, "first", "mirrors"),
        (0, "edges_static", "mirrors"),
        (1, "edges_static", "final"),
    ]


def test_mixed_strategies_emit_what_the_next_layer_needs():
    steps = schedule(["combine", "edge_join", "replicate"], [False, False, False])
    assert [(s.inputs, s.outputs) for s in steps] == [
        ("first", "partials"),
        ("states", "edge_payloads"),
        ("edges_rows", "mirrors"),
        ("edges_static", "final"),
    ]


def test_combine_with_attention_takes_an_extra_exchange():
    steps = schedule(["combine", "combine"], [True, True])
    assert [(s.layer, s.inputs, s.outputs) for s in steps] == [
        (-1, "first", "dst_payloads"),
        (-1, "given", "partials"),
        (0, "states", "dst_payloads"),
        (0, "given", "partials"),
        (1, "states", "final"),
    ]


def test_unknown_strategy_is_named():
    with pytest.raises(ValueError, match="teleport"):
        schedule(["teleport"], [False])
