"""The cost model: one formula, constants in one recalibratable dataclass, no torch/pyspark."""

import subprocess
import sys

import pytest

from sparkgnn.errors import PlanError
from sparkgnn.planner import CostModel, compile


def test_seconds_formula():
    model = CostModel(shuffle_Bps=1e9, python_Bps=5e8, pass_overhead_s=0.5, per_edge_s=1e-6)
    assert model.seconds(2e9, 1e9, 3, 1_000_000) == pytest.approx(2 + 2 + 1.5 + 1)


def test_constants_round_trip_and_are_checked():
    model = CostModel()
    assert CostModel.from_dict(model.to_dict()) == model
    with pytest.raises(PlanError, match="unknown CostModel constant.*disk_Bps"):
        CostModel.from_dict({"disk_Bps": 1.0})
    with pytest.raises(PlanError, match="shuffle_Bps must be positive"):
        CostModel(shuffle_Bps=0)
    with pytest.raises(PlanError, match="pass_overhead_s must be >= 0"):
        CostModel(pass_overhead_s=-1)


def test_layer_estimates_are_the_cost_model_applied_to_its_bytes(make):
    model = CostModel(shuffle_Bps=1e8, python_Bps=2e8, pass_overhead_s=2.0, per_edge_s=1e-6)
    plan = compile(make.sage_model(), make.stats(), make.task(), cost_model=model)
    assert plan.cost_model == model.to_dict()
    for layer in plan.layers:
        est = layer.estimates
        assert est["python_bytes"] == est["python_in_bytes"] + est["python_out_bytes"]
        assert est["seconds"] == pytest.approx(
            model.seconds(est["shuffle_bytes"], est["python_bytes"], est["passes"], est["edges"]), rel=1e-6
        )


def test_recalibration_can_change_the_choice(make):
    layers = make.sage_model(can_pre=False)
    graph_stats = make.stats(mirror_rows=600_000, combine_rows=300_000)
    # combine moves the fewest shuffle bytes but sends partial states through Python twice.
    shuffle_bound = compile(layers, graph_stats, make.task(), cost_model=CostModel(shuffle_Bps=1e7))
    python_bound = compile(layers, graph_stats, make.task(), cost_model=CostModel(python_Bps=1e7))
    assert shuffle_bound.layers[0].strategy == "combine"
    assert python_bound.layers[0].strategy == "replicate"


def test_planner_imports_neither_torch_nor_pyspark():
    code = (
        "import sys, sparkgnn.planner as p; import sparkgnn.planner.explain; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pyspark')); "
        "assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
