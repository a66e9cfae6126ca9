"""GraphData: dtypes, dense indices, lookups, masks and conversions."""

import numpy as np
import pytest

from sparkgnn.errors import GraphValidationError
from sparkgnn.graph import GraphData


def test_dense_indices_and_dtypes(small_graph):
    g = small_graph
    assert g.num_nodes == 6 and g.num_edges == 7 and g.feature_dim == 4
    assert g.x.dtype == np.float32 and g.x.flags["C_CONTIGUOUS"]
    assert g.edge_src.dtype == np.int64 and g.edge_dst.dtype == np.int64
    assert g.edge_src.min() >= 0 and g.edge_dst.max() < g.num_nodes
    # dense indices point back at the original ids
    np.testing.assert_array_equal(g.ids[g.edge_src], [100, 7, 42, 9, 1000, 3, 100])
    np.testing.assert_array_equal(g.dst_ids, [7, 42, 9, 1000, 3, 100, 42])
    assert g.num_classes == 3 and g.has_weight and g.has_labels


def test_index_of_and_unknown_ids(small_graph):
    np.testing.assert_array_equal(small_graph.index_of([3, 100, 1000]), [5, 0, 4])
    with pytest.raises(GraphValidationError) as err:
        small_graph.index_of([3, 5, 6])
    assert "2 requested ids are not vertex ids; first: 5, 6" in str(err.value)


def test_identity_ids_fast_path():
    g = GraphData(np.arange(4), np.zeros((4, 2)), [0, 1], [1, 2])
    assert g.id_index.identity
    np.testing.assert_array_equal(g.index_of([3, 0]), [3, 0])
    with pytest.raises(GraphValidationError, match="1 requested ids"):
        g.index_of([4])


def test_masks(small_graph):
    assert small_graph.mask("train").tolist() == [True, False, False, True, False, True]
    assert small_graph.mask("test").sum() == 1
    with pytest.raises(GraphValidationError, match="unknown split"):
        small_graph.mask("holdout")
    no_split = GraphData(np.arange(2), np.zeros((2, 1)), [0], [1])
    with pytest.raises(GraphValidationError, match="no split column"):
        no_split.mask("train")


def test_torch_and_pyg(small_graph):
    edge_index = small_graph.edge_index_torch()
    assert tuple(edge_index.shape) == (2, 7) and str(edge_index.dtype) == "torch.int64"
    data = small_graph.to_pyg()
    assert data.num_nodes == 6 and int(data.train_mask.sum()) == 3
    assert data.edge_weight.shape[0] == 7


def test_degrees_and_summary(small_graph):
    assert small_graph.in_degree().sum() == 7
    assert small_graph.in_degree()[small_graph.index_of([42])[0]] == 2
    line = small_graph.summary()
    assert "6 vertices, 7 edges, 4-d features, 3 classes" in line and "\n" not in line
