"""NodeSets equals numpy's set routines (dense and sparse paths) and leaves its buffers clean."""

import numpy as np

from sparkgnn.serving.nodesets import NodeSets


def test_matches_numpy_and_stays_clean():
    rng = np.random.default_rng(0)
    sets = NodeSets(1000)
    for size in (0, 5, 50, 5000):  # sparse (sort) and dense (marks) paths
        a = rng.integers(0, 1000, size)
        b = rng.integers(0, 1000, size // 2 + 1)
        np.testing.assert_array_equal(sets.unique(a), np.unique(a))
        np.testing.assert_array_equal(sets.unique(a, b), np.union1d(a, b))
        np.testing.assert_array_equal(sets.member(a, b), np.isin(a, b))
        np.testing.assert_array_equal(sets.intersect(a, b), np.intersect1d(a, b))
        u, inv = sets.unique_inverse(a)
        nu, ninv = np.unique(a, return_inverse=True)
        np.testing.assert_array_equal(u, nu)
        np.testing.assert_array_equal(inv, ninv)
        keys = np.unique(b)
        pos = sets.positions(keys, a)
        expect = np.where(np.isin(a, keys), np.searchsorted(keys, a), -1)
        np.testing.assert_array_equal(pos, expect)
        assert not sets._mark.any() and (sets._pos == -1).all()
    sets.ensure(5000)
    assert len(sets._mark) >= 5000 and not sets._mark.any()
