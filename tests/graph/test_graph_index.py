"""IdIndex: the direct table (ids spread over <= 4N values), the binary search (sparse ids) and
the identity shortcut give the same answers, including unknown ids and duplicated ids (first
occurrence wins)."""

import numpy as np

from sparkgnn.graph import index as index_mod
from sparkgnn.graph.index import IdIndex


def _search_only(ids):
    saved = index_mod.TABLE_SPAN_FACTOR
    index_mod.TABLE_SPAN_FACTOR = -(10**9)  # forces the binary search path
    try:
        return IdIndex(ids)
    finally:
        index_mod.TABLE_SPAN_FACTOR = saved


def test_table_equals_search():
    rng = np.random.default_rng(0)
    ids = rng.choice(np.arange(-50, 5000), 2000, replace=False)
    ids = np.concatenate([ids, ids[:5]])  # duplicates
    query = np.concatenate([rng.integers(-100, 5100, 5000), [np.iinfo(np.int64).max, np.iinfo(np.int64).min]])
    table, search = IdIndex(ids), _search_only(ids)
    assert table._table is not None and search._table is None
    a, fa = table.lookup(query)
    b, fb = search.lookup(query)
    np.testing.assert_array_equal(fa, fb)
    np.testing.assert_array_equal(a, b)
    assert (ids[a[fa]] == query[fa]).all()
    first = {}
    for i, v in enumerate(ids.tolist()):
        first.setdefault(v, i)
    assert all(a[j] == first[int(q)] for j, q in enumerate(query) if fa[j])


def test_sparse_ids_use_search_and_identity_shortcut():
    sparse = IdIndex(np.array([10**12, 5, 7 * 10**9]))
    assert sparse._table is None
    idx, found = sparse.lookup(np.array([5, 6, 10**12]))
    assert idx.tolist() == [1, 0, 0] and found.tolist() == [True, False, True]
    dense = IdIndex(np.arange(10))
    assert dense.identity and dense.lookup(np.array([3, 10]))[1].tolist() == [True, False]
