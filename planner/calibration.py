"""Refit the cost model's constants from measured layer timings.

Why: the constants of CostModel were measured once, on one probe (docs/PLATFORM.md); every run
since reports, per layer, what the planner predicted it would move (shuffle bytes, bytes through
the Python pipe, round trips, edges) and how long the layer took. Those pairs are exactly the
data the model is linear in, so the planner can learn this machine's (or cluster's) constants
from its own recent runs instead of trusting a probe made elsewhere.

The fit: with c = (1/shuffle_Bps, 1/python_Bps, pass_overhead_s, per_edge_s) and a layer's
quantities x_i, predicted seconds are x_i . c. Minimise the squared *relative* error of every
observation, sum_i (x_i . c / y_i - 1)^2, plus a ridge pull of each constant towards the prior
model, PRIOR_WEIGHT x sum_j (c_j / prior_j - 1)^2: a handful of runs on one graph size cannot tell
the four terms apart (their quantities grow together), so directions the data do not constrain
stay where the prior put them while the ones it does constrain follow the measurements. Solved as
one non-negative least-squares problem; constants are kept within [prior / MAX_FACTOR, prior x
MAX_FACTOR] so one pathological run (a swapping machine) cannot produce an absurd model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sparkgnn.planner.cost import CostModel
from sparkgnn.planner.errors import PlanError

PRIOR_WEIGHT = 0.005
MAX_FACTOR = 20.0
TERMS = ("shuffle_bytes", "python_bytes", "passes", "edges")


@dataclass(frozen=True)
class Observation:
    """One layer of one run: what the planner said it moves, and the seconds it took."""

    shuffle_bytes: float
    python_bytes: float
    passes: float
    edges: float
    seconds: float

    def __post_init__(self) -> None:
        for name in (*TERMS, "seconds"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise PlanError(f"calibration observation: {name} must be a finite number >= 0, got {value!r}")
        if self.seconds <= 0:
            raise PlanError(f"calibration observation: seconds must be > 0, got {self.seconds!r}")

    @classmethod
    def from_estimates(cls, estimates: dict, seconds: float) -> Observation:
        """From a plan layer's `estimates` dict (cost.Estimate.to_dict) and the measured seconds."""
        values = {name: float(estimates[name]) for name in TERMS}
        return cls(**values, seconds=float(seconds))

    def to_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in (*TERMS, "seconds")}


def _coefficients(model: CostModel) -> np.ndarray:
    return np.array([1 / model.shuffle_Bps, 1 / model.python_Bps, model.pass_overhead_s, model.per_edge_s])


def _model(coefficients: np.ndarray) -> CostModel:
    shuffle, python, passes, edge = (float(c) for c in coefficients)
    return CostModel(shuffle_Bps=1 / shuffle, python_Bps=1 / python, pass_overhead_s=passes, per_edge_s=edge)


def fit(observations: list[Observation], prior: CostModel | None = None) -> CostModel:
    """The cost model that best predicts `observations` (see module); the prior when there are none."""
    prior = prior if prior is not None else CostModel()
    if not observations:
        return prior
    from scipy.optimize import nnls

    p = _coefficients(prior)
    # Unknowns are u_j = c_j / p_j (all of order 1, so the ridge treats every term alike).
    rows = [np.array([getattr(o, t) for t in TERMS]) * p / o.seconds for o in observations]
    weight = math.sqrt(PRIOR_WEIGHT)
    a = np.vstack([*rows, weight * np.eye(len(TERMS))])
    b = np.concatenate([np.ones(len(rows)), weight * np.ones(len(TERMS))])
    u, _ = nnls(a, b)
    u = np.clip(u, 1 / MAX_FACTOR, MAX_FACTOR)
    return _model(u * p)


def relative_errors(model: CostModel, observations: list[Observation]) -> list[float]:
    """|predicted / measured - 1| per observation (what `fit` minimises, reported)."""
    return [
        abs(model.seconds(o.shuffle_bytes, o.python_bytes, o.passes, o.edges) / o.seconds - 1) for o in observations
    ]
