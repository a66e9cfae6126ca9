"""RunReport (engine.executor): seconds per layer as the steps ran, and as the plan estimates them."""

from sparkgnn.engine.executor import RunReport, StepReport, estimate_vs_actual
from sparkgnn.planner.ir import LayerPlan, Plan


def _report():
    steps = [
        StepReport("feature scan", 2.0, None, layer=-1, estimated=False),
        StepReport("scan + scatter for layer 1/2", 3.0, None, layer=-1),
        StepReport("layer 1/2", 5.0, None, layer=0),
        StepReport("layer 2/2", 4.0, None, layer=1),
    ]
    return RunReport(steps=steps)


def test_the_first_steps_belong_to_the_plans_first_layer():
    report = _report()
    assert report.seconds_by_layer() == {-1: 5.0, 0: 5.0, 1: 4.0}
    # the plan's layer 0 holds the first step (x in, payloads out): its estimate covers that step;
    # the feature scan is not costed by the plan
    assert report.seconds_by_plan_layer() == {0: 8.0, 1: 4.0}


def test_estimates_are_compared_with_the_steps_they_cover():
    layers = [
        LayerPlan(
            index=i,
            strategy="replicate",
            pre_transform=False,
            ops=[],
            estimates={"seconds": s},
            candidates={},
            reason="",
        )
        for i, s in enumerate((8.0, 5.0))
    ]
    rows = estimate_vs_actual(_report(), Plan(partitions=2, layers=layers))
    assert [(r["actual_s"], r["actual_over_estimate"]) for r in rows] == [(8.0, 1.0), (4.0, 0.8)]
