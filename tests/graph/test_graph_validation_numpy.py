"""Every validation error on the numpy path names the problem, the count and the first offenders."""

import numpy as np
import pytest
from _graph_helpers import BROKEN, GOOD_X, arrow_types, write_raw

from sparkgnn.errors import GraphValidationError
from sparkgnn.graph import GraphData, read_graph_dir


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_read_graph_dir_reports(case, tmp_path):
    vertices, edges, _, expected = BROKEN[case]
    path = write_raw(tmp_path, vertices, edges, vertex_types=arrow_types(vertices))
    with pytest.raises(GraphValidationError) as err:
        read_graph_dir(path)
    for line in expected:
        assert line in str(err.value)


def test_graph_data_from_arrays_reports_the_same():
    ids = np.array([1, 2, 2, 3, 4])
    x = np.array([[1, 2], [1, 2], [1, 2], [np.inf, 0], [1, 2]], np.float32)
    with pytest.raises(GraphValidationError) as err:
        GraphData.from_edge_ids(ids, x, [1, 9, 4], [2, 3, 77], weight=[1.0, 1.0, -3.0])
    text = str(err.value)
    assert "failed validation (5 problems)" in text
    assert "1 vertex ids appear more than once; first: 2 (x2)" in text
    assert "1 vertices have NaN/Inf (or null) feature values; first ids: 3" in text
    assert "1 edges have a src that is not a vertex id; first: (9 -> 3)" in text
    assert "1 edges have a dst that is not a vertex id; first: (4 -> 77)" in text
    assert "1 edges have a negative, NaN, Inf or null weight; first: (4 -> 77, weight=-3)" in text
    assert [p.kind for p in err.value.problems] == [
        "duplicate_id",
        "x_nonfinite",
        "dangling_src",
        "dangling_dst",
        "bad_weight",
    ]


def test_ragged_python_features():
    with pytest.raises(GraphValidationError) as err:
        GraphData([1, 2, 3, 4], [[1.0, 2.0], [1.0], None, [3.0, 4.0]], [0], [1]).validate()
    assert "1 vertices have a null feature vector x; first ids: 3" in str(err.value)
    assert "1 vertices have a feature vector whose length is not 2; first: id 2 (len 1)" in str(err.value)


def test_dense_index_out_of_range_and_bad_lengths():
    with pytest.raises(GraphValidationError) as err:
        GraphData(np.arange(3), np.zeros((3, 2)), [0, 5], [1, -1]).validate()
    assert "1 edges have a dense src/dst index outside [0, 3); first: (5 -> -1)" in str(err.value)
    with pytest.raises(GraphValidationError, match="x has 2 rows, expected 3"):
        GraphData(np.arange(3), np.zeros((2, 2)), [0], [1]).validate()


def test_labels_and_splits_are_checked():
    with pytest.raises(GraphValidationError) as err:
        GraphData(np.arange(3), np.zeros((3, 1)), [0], [1], y=[0, -2, 1], split=["train", "dev", None]).validate()
    assert "1 vertices have a label y below -1" in str(err.value)
    assert "1 vertices have a split not in {train, val, test}; first: id 1 ('dev')" in str(err.value)


def test_many_offenders_are_counted_and_truncated():
    n = 50
    x = np.zeros((n, 2), np.float32)
    x[::2, 0] = np.nan
    with pytest.raises(GraphValidationError) as err:
        GraphData(np.arange(n) * 10, x, [], []).validate()
    assert "25 vertices have NaN/Inf (or null) feature values; first ids: 0, 20, 40, 60, 80, ..." in str(err.value)


def test_valid_graph_passes(small_graph):
    assert small_graph.validate() is small_graph
    assert GraphData([5], [GOOD_X[0]], [], []).validate().num_edges == 0
