"""planner.calibration: refitting the cost model's constants from measured layers."""

import math

import numpy as np
import pytest

from sparkgnn.planner import CostModel, PlanError
from sparkgnn.planner.calibration import MAX_FACTOR, Observation, fit, nnls


def relative_errors(model: CostModel, observations: list[Observation]) -> list[float]:
    """|predicted / measured - 1| per observation (what `fit` minimises)."""
    return [
        abs(model.seconds(o.shuffle_bytes, o.python_bytes, o.passes, o.edges, o.jvm_edges) / o.seconds - 1)
        for o in observations
    ]


TRUE = CostModel(shuffle_Bps=0.11e9, python_Bps=0.9e9, pass_overhead_s=2.5, per_edge_s=0.2e-6)


def _observed(model: CostModel, n: int, seed: int = 0, noise: float = 0.0) -> list[Observation]:
    # Layers of varied shapes (bytes, passes and edges not proportional), timed by `model`.
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        shuffle, python = rng.uniform(1e7, 2e9), rng.uniform(1e7, 2e9)
        passes, edges = float(rng.integers(1, 4)), rng.uniform(1e5, 5e7)
        seconds = model.seconds(shuffle, python, passes, edges) * (1 + noise * rng.standard_normal())
        out.append(Observation(shuffle, python, passes, edges, seconds))
    return out


def test_no_observations_keep_the_prior():
    assert fit([]) == CostModel()


def test_layers_of_another_size_count_less_than_layers_of_the_planned_size():
    from sparkgnn.planner.calibration import size_weight

    assert size_weight(8e6, 8e6) == 1 and size_weight(2e6, 8e6) == size_weight(32e6, 8e6) == 0.25
    assert size_weight(2e6, None) == 1
    small = [o for o in _observed(TRUE, 6, seed=2)]
    far = fit(small, target_edges=1e12)  # a plan far larger than every observation: near the prior
    near = fit(small)
    assert max(relative_errors(near, small)) < max(relative_errors(far, small))


def test_many_varied_layers_predict_new_layers_of_the_machine_closely():
    # Held-out layers of the same machine: the refit predicts them within 5% (the prior is off by
    # far more), and the well-determined constant (the shuffle rate, the largest term) is found.
    model = fit(_observed(TRUE, 200))
    held_out = _observed(TRUE, 20, seed=9)
    assert max(relative_errors(model, held_out)) < 0.05
    assert max(relative_errors(CostModel(), held_out)) > 0.3
    assert math.isclose(model.shuffle_Bps, TRUE.shuffle_Bps, rel_tol=0.15)


def test_a_few_noisy_runs_predict_them_better_than_the_prior():
    observed = _observed(TRUE, 4, seed=3, noise=0.05)
    prior_error = max(relative_errors(CostModel(), observed))
    fitted_error = max(relative_errors(fit(observed), observed))
    assert prior_error > 0.3
    assert fitted_error < prior_error / 2


def test_one_layer_moves_the_model_towards_it_and_stays_bounded():
    (only,) = _observed(TRUE, 1, seed=5)
    model = fit([only])
    assert relative_errors(model, [only])[0] < relative_errors(CostModel(), [only])[0]
    prior = CostModel()
    for name in ("shuffle_Bps", "python_Bps", "pass_overhead_s", "per_edge_s"):
        ratio = getattr(model, name) / getattr(prior, name)
        assert 1 / MAX_FACTOR - 1e-9 <= ratio <= MAX_FACTOR + 1e-9


def test_a_pathological_run_cannot_produce_an_absurd_model():
    huge = Observation(1e6, 1e6, 1, 1e3, seconds=1e6)  # a layer that "took" 11 days
    model = fit([huge])
    assert model.pass_overhead_s <= CostModel().pass_overhead_s * MAX_FACTOR + 1e-9


@pytest.mark.parametrize(
    "bad", [dict(seconds=0.0), dict(seconds=float("nan")), dict(edges=-1.0), dict(shuffle_bytes=float("inf"))]
)
def test_bad_observations_are_refused_naming_the_field(bad):
    values = dict(shuffle_bytes=1e6, python_bytes=1e6, passes=1.0, edges=1e3, seconds=1.0) | bad
    with pytest.raises(PlanError, match=next(iter(bad))):
        Observation(**values)


def test_observation_from_a_plan_layers_estimates():
    estimates = {
        "shuffle_bytes": 10,
        "python_in_bytes": 3,
        "python_out_bytes": 4,
        "python_bytes": 7,
        "passes": 1,
        "edges": 50,
        "seconds": 0.1,
    }
    assert Observation.from_estimates(estimates, 2.0) == Observation(10, 7, 1, 50, 2.0)


def test_nnls_equals_scipys_on_ridge_problems_and_keeps_every_unknown_non_negative():
    from scipy.optimize import nnls as scipy_nnls

    rng = np.random.default_rng(5)
    for _ in range(300):
        rows, unknowns = int(rng.integers(1, 25)), int(rng.integers(1, 7))
        a = np.vstack([rng.normal(size=(rows, unknowns)) * rng.choice([1e-3, 1.0, 1e3]), np.eye(unknowns)])
        b = np.concatenate([rng.normal(size=rows), np.ones(unknowns)])
        expected, _ = scipy_nnls(a, b)
        actual = nnls(a, b)
        assert (actual >= 0).all()
        np.testing.assert_allclose(actual, expected, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="2-d matrix"):
        nnls(np.ones(3), np.ones(3))
