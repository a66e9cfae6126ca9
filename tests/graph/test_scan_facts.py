"""graph.scan_facts: the partials prepare's tasks report add up to the fingerprint Graph.fingerprint
computes (any split of the rows, weights, labels and splits included), and every defect that
spark_checks reports is counted."""

import numpy as np
import pyarrow as pa
import pytest

from sparkgnn.graph.fingerprint import fingerprint_arrays
from sparkgnn.graph.scan_facts import ScanPartial, ScanTotals, missing, repeated


def _vertices(ids, x, y=None, split=None) -> pa.RecordBatch:
    columns = {"id": pa.array(ids, pa.int64()), "x": pa.array(x, pa.list_(pa.float64()))}
    if y is not None:
        columns["y"] = pa.array(y, pa.int64())
    if split is not None:
        columns["split"] = pa.array(split, pa.string())
    return pa.RecordBatch.from_pydict(columns)


def _totals(vertex_batches, edge_chunks, has_weight=True) -> ScanTotals:
    """Each batch in a partial of its own, passed through a report row as the tasks do."""
    totals = ScanTotals(has_weight)
    for batch in vertex_batches:
        partial = ScanPartial()
        partial.add_vertices(batch)
        totals.add(ScanPartial.from_row({k: v[0].as_py() for k, v in partial.arrays().items()}))
    for src, dst, weight in edge_chunks:
        partial = ScanPartial()
        partial.add_edges(np.asarray(src, np.int64), np.asarray(dst, np.int64), weight)
        totals.add(partial)
    return totals


def test_partials_of_any_split_add_up_to_the_graphs_fingerprint_and_counts():
    rng = np.random.default_rng(0)
    ids = rng.permutation(1000).astype(np.int64) * 7 - 300
    x = rng.standard_normal((1000, 6))  # float64 in the files: hashed as the float32 Spark casts to
    y = rng.integers(-1, 4, 1000)
    src, dst = rng.choice(ids, 5000), rng.choice(ids, 5000)
    weight = rng.uniform(0, 2, 5000).astype(np.float32)
    expected = fingerprint_arrays(ids, x.astype(np.float32), src, dst, weight)
    cuts = [0, 1, 333, 334, 1000]
    batches = [
        _vertices(ids[a:b], x[a:b].tolist(), y[a:b], ["train"] * (b - a))
        for a, b in zip(cuts[:-1], cuts[1:], strict=True)
    ]
    edges = [(src[a:b], dst[a:b], weight[a:b]) for a, b in ((0, 2500), (2500, 2501), (2501, 5000))]
    totals = _totals(batches, edges)
    assert not totals.has_defect
    assert totals.fingerprint() == expected
    assert totals.facts() == {"num_vertices": 1000, "num_edges": 5000, "feature_dim": 6, "num_classes": 4}
    unweighted = _totals(batches, [(src, dst, None)], has_weight=False)
    assert unweighted.fingerprint() == fingerprint_arrays(ids, x.astype(np.float32), src, dst)


@pytest.mark.parametrize(
    "batch",
    [
        _vertices([1, None], [[1.0], [2.0]]),  # null id
        _vertices([1, 2], [[1.0], None]),  # null x
        _vertices([1, 2], [[1.0], [2.0, 3.0]]),  # ragged widths
        _vertices([1, 2], [[1.0], [float("nan")]]),  # NaN feature
        _vertices([1, 2], [[1.0], [1e300]]),  # infinite once cast to float32
        _vertices([1, 2], [[1.0], [2.0]], y=[0, -2]),  # label below -1
        _vertices([1, 2], [[1.0], [2.0]], split=["train", "dev"]),  # unknown split
    ],
)
def test_every_vertex_defect_is_counted(batch):
    good = _vertices([3], [[1.0]])
    assert not _totals([good], []).has_defect
    assert _totals([good, batch], []).has_defect


def test_ragged_widths_across_tasks_and_edge_defects_are_counted():
    assert _totals([_vertices([1], [[1.0]]), _vertices([2], [[1.0, 2.0]])], []).has_defect
    for weight in (np.float32([-1.0]), np.float32([np.nan]), np.float32([np.inf])):
        assert _totals([], [([1], [2], weight)]).has_defect
    partial = ScanPartial()
    nulls = pa.RecordBatch.from_pydict({"src": pa.array([1, None], pa.int64()), "dst": pa.array([2, 3], pa.int64())})
    assert partial.null_endpoints(nulls) == 1 and partial.edges == 2
    totals = ScanTotals(False)
    totals.add(partial)
    assert totals.has_defect


def test_duplicates_and_dangling_endpoints_are_counted_from_sorted_ids():
    ids = np.array([1, 3, 3, 3, 5, 8, 8], np.int64)
    assert repeated(ids) == 2 and repeated(np.array([4], np.int64)) == 0
    assert missing(ids, np.array([1, 2, 9, 8, 0], np.int64)) == 3
    assert missing(np.zeros(0, np.int64), np.array([1], np.int64)) == 1
    totals = ScanTotals(False)
    totals.add(ScanPartial(dangling_src=1))
    assert totals.has_defect
