"""npsets: numpy's set operations on integer arrays, computed by sorting, give numpy's results
(values and dtypes) on every shape of input the callers pass."""

import numpy as np
import pytest

from sparkgnn import npsets

RNG = np.random.default_rng(7)
CASES = [
    RNG.integers(-(1 << 40), 1 << 40, 5000),  # int64 ids, mostly distinct
    RNG.integers(0, 50, 5000),  # heavy repeats
    RNG.integers(0, 1000, 3000).astype(np.int32),
    RNG.integers(0, 1000, 3000).astype(np.uint16),
    np.array([], np.int64),
    np.array([5]),
    np.array([3, 3, 3]),
    RNG.integers(0, 2, 100).astype(bool),
    RNG.integers(0, 100, (40, 3)),  # 2-D: flattened, as np.unique does
]


@pytest.mark.parametrize("values", CASES, ids=range(len(CASES)))
def test_unique_equals_numpy(values):
    got, want = npsets.unique(values), np.unique(values)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_unique_of_a_list_and_of_floats_with_nan_are_numpys():
    np.testing.assert_array_equal(npsets.unique([4, 1, 4, -2]), np.array([-2, 1, 4]))
    floats = np.array([2.0, np.nan, 1.0, np.nan, 2.0])
    np.testing.assert_array_equal(npsets.unique(floats), np.unique(floats))  # one NaN, as numpy's rule


@pytest.mark.parametrize("i", range(4))
@pytest.mark.parametrize("j", [0, 1, 4, 5])
def test_set_operations_equal_numpy(i, j):
    a, b = CASES[i], CASES[j]
    for mine, theirs in (
        (npsets.setdiff, np.setdiff1d),
        (npsets.intersect, np.intersect1d),
        (npsets.union, np.union1d),
    ):
        got, want = mine(a, b), theirs(a, b)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype or len(got) == 0, (mine.__name__, got.dtype, want.dtype)


def test_dedupe_sorted_keeps_order_and_short_arrays():
    np.testing.assert_array_equal(npsets.dedupe_sorted(np.array([1, 1, 2, 5, 5, 9])), [1, 2, 5, 9])
    assert npsets.dedupe_sorted(np.array([7])).tolist() == [7]
