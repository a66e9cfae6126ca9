"""Refit the cost model's constants from measured layer timings.

Why: the default constants of CostModel come from one probe (docs/PLATFORM.md); every run
reports, per layer, what the planner predicted it would move (shuffle bytes, bytes through
the Python pipe, round trips, edges) and how long the layer took. Those pairs are exactly the
data the model is linear in, so the planner can learn this machine's (or cluster's) constants
from its own recent runs instead of trusting a probe made elsewhere.

The fit: with c = (1/shuffle_Bps, 1/python_Bps, pass_overhead_s, per_edge_s, jvm_edge_s) and a layer's
quantities x_i, predicted seconds are x_i . c. Minimise the squared *relative* error of every
observation, sum_i (x_i . c / y_i - 1)^2, plus a ridge pull of each constant towards the prior
model, PRIOR_WEIGHT x sum_j (c_j / prior_j - 1)^2: a handful of runs on one graph size cannot tell
the four terms apart (their quantities grow together), so directions the data do not constrain
stay where the prior put them while the ones it does constrain follow the measurements.
PRIOR_WEIGHT = 1 for up to PRIOR_OBSERVATIONS layers, then shrinking as 1/n (the prior of each
constant counts like one of the first few observations, less as measurements accumulate; how well
that strength predicts is in docs/ARCHITECTURE.md, "Data movement and the planner"). Observations
are weighted by how close their graph is in size to the plan's (size_weight). Solved as
one non-negative least-squares problem; constants are kept within [prior / MAX_FACTOR, prior x
MAX_FACTOR] so one pathological run (a swapping machine) cannot produce an absurd model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sparkgnn.planner.cost import CostModel
from sparkgnn.planner.errors import PlanError

PRIOR_WEIGHT = 1.0
PRIOR_OBSERVATIONS = 4
MAX_FACTOR = 20.0
TERMS = ("shuffle_bytes", "python_bytes", "passes", "edges", "jvm_edges")


@dataclass(frozen=True)
class Observation:
    """One layer of one run: what the planner said it moves, and the seconds it took."""

    shuffle_bytes: float
    python_bytes: float
    passes: float
    edges: float
    seconds: float
    jvm_edges: float = 0.0  # absent from observations recorded before pushdown existed

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
        values = {name: float(estimates.get(name, 0.0)) for name in TERMS}
        return cls(**values, seconds=float(seconds))

    def to_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in (*TERMS, "seconds")}


def _coefficients(model: CostModel) -> np.ndarray:
    return np.array(
        [1 / model.shuffle_Bps, 1 / model.python_Bps, model.pass_overhead_s, model.per_edge_s, model.jvm_edge_s]
    )


def _model(coefficients: np.ndarray) -> CostModel:
    shuffle, python, passes, edge, jvm_edge = (float(c) for c in coefficients)
    return CostModel(
        shuffle_Bps=1 / shuffle, python_Bps=1 / python, pass_overhead_s=passes, per_edge_s=edge, jvm_edge_s=jvm_edge
    )


def size_weight(edges: float, target_edges: float | None) -> float:
    """How much a layer over `edges` edges says about one over `target_edges`: the ratio of the
    smaller to the larger (1 for the same size, 1/4 for 2M vs 8M). Layer time is not linear in the
    graph across sizes on this machine (fresh-memory and cache effects grow with the working set;
    docs/ARCHITECTURE.md, "Data movement and the planner"), so a refit from small graphs alone must
    not override the prior for a large one."""
    if not target_edges or target_edges <= 0 or edges <= 0:
        return 1.0
    return min(edges, target_edges) / max(edges, target_edges)


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0 (Lawson and Hanson's active-set method), for the
    calibration's few unknowns. WHY not scipy.optimize.nnls: importing scipy.optimize costs a job
    script about as much as a small graph's layer, for a problem of five unknowns. The fit's
    problem has full column rank (the ridge rows), so its solution is unique and equal to
    scipy's to rounding."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.shape != (a.shape[0],):
        raise ValueError(f"nnls needs a 2-d matrix and a vector of its rows' length; got {a.shape} and {b.shape}")
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(np.float64).eps * max(a.shape) * max(np.abs(a).sum(axis=0).max(initial=0.0), 1.0)
    gradient = a.T @ (b - a @ x)
    for _ in range(3 * n + 1):
        free = ~passive & (gradient > tol)
        if not free.any():
            return x
        passive[np.argmax(np.where(free, gradient, -np.inf))] = True
        for _ in range(3 * n + 1):
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            blocking = passive & (z <= 0)
            if not blocking.any():
                break
            alpha = np.min(x[blocking] / (x[blocking] - z[blocking]))
            x = x + alpha * (z - x)
            passive &= x > tol
        x = z
        gradient = a.T @ (b - a @ x)
    raise RuntimeError(f"nnls did not converge in {3 * n + 1} iterations")


def fit(
    observations: list[Observation], prior: CostModel | None = None, target_edges: float | None = None
) -> CostModel:
    """The cost model that best predicts `observations` (see module) for a layer over
    `target_edges` edges (observations of other sizes weighted down, size_weight); the prior when
    there are none."""
    prior = prior if prior is not None else CostModel()
    if not observations:
        return prior
    p = _coefficients(prior)
    # Unknowns are u_j = c_j / p_j (all of order 1, so the ridge treats every term alike).
    rows = [
        np.array([getattr(o, t) for t in TERMS]) * p / o.seconds * size_weight(o.edges, target_edges)
        for o in observations
    ]
    # The prior counts like PRIOR_OBSERVATIONS layers in all: decisive for the first few runs,
    # fading as the work dir accumulates measurements.
    weight = math.sqrt(PRIOR_WEIGHT * min(1.0, PRIOR_OBSERVATIONS / len(observations)))
    a = np.vstack([*rows, weight * np.eye(len(TERMS))])
    b = np.concatenate([[size_weight(o.edges, target_edges) for o in observations], weight * np.ones(len(TERMS))])
    u = nnls(a, b)
    u = np.clip(u, 1 / MAX_FACTOR, MAX_FACTOR)
    return _model(u * p)
