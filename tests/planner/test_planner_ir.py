"""Plan IR: explain() output and the JSON round trip."""

import json
import math

import pytest

from sparkgnn.errors import PlanError
from sparkgnn.planner import ENGINES, OPERATORS, Operator, Plan, compile
from sparkgnn.planner.explain import human_bytes


def _plan(make, **task):
    layers = make.sage_model((128, 64, 64, 16))
    graph_stats = make.stats()
    del graph_stats["mirror_rows"]  # so one candidate is inapplicable (inf)
    return compile(layers, graph_stats, make.task(**task))


def test_every_operator_uses_the_vocabulary_and_an_engine(make):
    plan = _plan(make)
    ops = list(plan.operators())
    assert ops and all(op.name in OPERATORS and op.engine in ENGINES for op in ops)
    assert {op.engine for op in ops} == set(ENGINES)
    assert len({op.id for op in ops}) == len(ops)


def test_explain_lists_operators_engines_bytes_and_layer_headers(make):
    plan = _plan(make, strategy="edge_join")
    text = plan.explain()
    for layer in plan.layers:
        assert f"== Layer {layer.index + 1}/{len(plan.layers)}: sage" in text
    assert text.count("strategy=edge_join, pre_transform=") == 3
    assert "pre_transform=yes" in text and "pre_transform=no" in text
    assert "candidates: edge_join " in text and "(chosen)" in text and "replicate " in text
    for fragment in (
        "Shuffle [GRAPH]",
        "Join [GRAPH]",
        "Pipe [PIPE]",
        "LocalAggregate [DL]",
        "ApplyVertex [DL]",
        "Materialize [GRAPH]",
        "Partition [GRAPH]",
        "MiB",
    ):
        assert fragment in text, fragment
    # Every operator is printed once in full (its bytes in human units), else as a reference.
    for op in plan.operators():
        assert f"{op.name} [{op.engine}] {human_bytes(op.est_bytes)}" in text
    # peak task memory is a plan property: per layer, against the budget, with the message chunking
    assert len(plan.memory["peak_task_bytes_per_layer"]) == len(plan.layers)
    assert "memory per task: estimated peak" in text and "destination ranges of at most 256.0 MiB" in text


def test_explain_marks_inapplicable_candidates(make):
    text = _plan(make).explain()
    assert "replicate n/a" in text and "not applicable: replicate" in text


def test_human_bytes():
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 * 2**30) == "3.0 GiB"


def test_round_trip_through_json(make):
    for task in ({}, {"fuse": False}, {"ids": 1000}):
        plan = _plan(make, **task)
        text = json.dumps(plan.to_dict(), allow_nan=False)  # strict JSON: inf written as null
        again = Plan.from_dict(json.loads(text))
        assert again.to_dict() == plan.to_dict()
        assert again.explain() == plan.explain()
        assert Plan.from_json(plan.to_json()).to_dict() == plan.to_dict()


def test_round_trip_restores_inf_and_shared_children(make):
    plan = _plan(make)
    assert math.isinf(plan.layers[0].candidates["replicate"])
    assert plan.to_dict()["layers"][0]["candidates"]["replicate"] is None
    again = Plan.from_dict(plan.to_dict())
    assert math.isinf(again.layers[0].candidates["replicate"])
    readers = [op for op in again.operators() if any(c.name == "Partition" for c in op.children)]
    partitions = {id(c) for op in readers for c in op.children if c.name == "Partition"}
    assert len(readers) >= 2 and len(partitions) == 1  # one shared node, not copies


def test_layer_plan_fields(make):
    plan = _plan(make)
    layer = plan.layers[1]
    assert layer.index == 1 and layer.strategy in ("edge_join", "replicate", "combine")
    assert isinstance(layer.pre_transform, bool) and layer.reason
    assert set(layer.estimates) == {
        "shuffle_bytes",
        "python_in_bytes",
        "python_out_bytes",
        "python_bytes",
        "passes",
        "edges",
        "jvm_edges",
        "seconds",
    }
    assert plan.estimates["seconds"] == pytest.approx(sum(lp.estimates["seconds"] for lp in plan.layers), rel=1e-6)


def test_malformed_documents_and_operators():
    with pytest.raises(PlanError, match="missing key 'layers'"):
        Plan.from_dict({"partitions": 2})
    with pytest.raises(PlanError, match="unknown operator 'Teleport'"):
        Operator("Teleport", "GRAPH")
    with pytest.raises(PlanError, match="unknown engine 'GPU'"):
        Operator("Scan", "GPU")
