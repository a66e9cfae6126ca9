"""An independent reference for the normalized-moments aggregator (PyG has none): a per-node numpy
loop in float64, shared by tests/layers/test_moments.py and tests/engine/test_infer_moments.py.

Float32 tolerance: the root is ill-conditioned where the moment is near 0 (d/ds s^(1/n) is
unbounded there: two neighbours give an exactly-zero odd moment in float64 and ~eps in float32),
so each entry may differ by the float32 error of the moment *before* the root, taken through the
root: (n mean|c|^(n-1) eps max|x| + eps mean|c|^n)^(1/n), the first term the centring's rounding
(c = x - mean carries ~eps |x|), the second the power sum's. `assert_moments_close` also checks the
moments before the root, where that error is linear, so the check stays tight away from 0."""

import numpy as np

# float32 error allowed on a moment before its root, relative to mean |c|^n (module doc)
MOMENT_EPS = 1e-6


def raw_moments(x: np.ndarray, src: np.ndarray, dst: np.ndarray, orders) -> tuple[np.ndarray, np.ndarray]:
    """Per node v and order n, before the root: s = mean_u (x_u - mean x_u)^n over v's in-edges
    (a duplicate edge counts twice), 0 without in-edges, blocks in order; and the float32 error
    each s may carry (module doc)."""
    orders = orders if isinstance(orders, list) else [orders]
    n_nodes, f = x.shape
    moments = np.zeros((n_nodes, f * len(orders)))
    error = np.zeros_like(moments)
    for v in range(n_nodes):
        neighbours = x[src[dst == v]].astype(np.float64)
        if len(neighbours) == 0:
            continue
        centred = neighbours - neighbours.mean(axis=0)
        error_c = MOMENT_EPS * np.abs(neighbours).max(axis=0)  # float32 centring: c carries ~eps |x|
        for block, n in enumerate(orders):
            cols = slice(block * f, (block + 1) * f)
            moments[v, cols] = (centred**n).mean(axis=0)
            error[v, cols] = n * (np.abs(centred) ** (n - 1)).mean(axis=0) * error_c
            error[v, cols] += MOMENT_EPS * (np.abs(centred) ** n).mean(axis=0)
    return moments, error


def _order_of_column(orders, f: int) -> np.ndarray:
    orders = orders if isinstance(orders, list) else [orders]
    return np.repeat(np.asarray(orders, dtype=np.float64), f)


def moments_reference(x: np.ndarray, src: np.ndarray, dst: np.ndarray, orders) -> tuple[np.ndarray, np.ndarray]:
    """The aggregate sign(s)|s|^(1/n) of raw_moments, and each entry's float32 tolerance: the
    moment's error taken through the root, error^(1/n) (the root is steep near 0)."""
    moments, error = raw_moments(x, src, dst, orders)
    n = _order_of_column(orders, x.shape[1])
    return np.sign(moments) * np.abs(moments) ** (1.0 / n), error ** (1.0 / n)


def assert_close(actual, expected, slack, what=""):
    actual = np.asarray(actual, dtype=np.float64)
    tol = 1e-5 * max(np.abs(expected).max(), 1e-30) + slack
    worst = np.abs(actual - expected) - tol
    at = np.unravel_index(worst.argmax(), worst.shape)
    assert (worst <= 0).all(), f"{what}: off by {worst.max():.3g} beyond tolerance at {at}"


def assert_moments_close(actual, x, src, dst, orders, what=""):
    """The tight check: raise the aggregate back to the n-th power (sign kept) and compare with the
    float64 moment within its float32 error, where rounding is linear instead of rooted."""
    moments, error = raw_moments(x, src, dst, orders)
    n = _order_of_column(orders, x.shape[1])
    actual = np.asarray(actual, dtype=np.float64)
    powered = np.sign(actual) * np.abs(actual) ** n
    assert_close(powered, moments, 2 * error, what + " (moments before the root)")
    values, slack = moments_reference(x, src, dst, orders)
    assert_close(actual, values, slack, what)
