"""engine.degrees: the out-degree histogram is counted once per graph and read back after; GCN's
degree and the weighted in-degree, each with and without edge weights, are the same in SQL
(prepare, the pruned statistics), in arrays and in the torch layer."""

import json
import logging
import os
from types import SimpleNamespace

import numpy as np
import pytest

from sparkgnn.engine.degrees import (
    FILE,
    OUT_STATS,
    PREPARED_STATS,
    STAT_KEYS,
    gcn_degree,
    out_degree_histogram,
    stat_values,
)
from sparkgnn.errors import SparkGNNError
from sparkgnn.graph import Graph


def test_histogram_counts_out_degrees_and_is_cached_by_fingerprint(spark, graph_dirs, tmp_path, caplog):
    path, data = graph_dirs["skewed"]
    graph = Graph.load(spark, path)
    caplog.set_level(logging.INFO, logger="sparkgnn")
    histogram = out_degree_histogram(graph, str(tmp_path))
    src = np.asarray(data.src_ids)
    degrees = np.unique(np.unique(src, return_counts=True)[1], return_counts=True)
    assert histogram == dict(zip(degrees[0].tolist(), degrees[1].tolist(), strict=True))
    assert len(caplog.messages) == 1 and "out-degree histogram" in caplog.messages[0]
    cached = os.path.join(str(tmp_path), "prep", str(graph.fingerprint), FILE)
    with open(cached) as fh:
        assert json.load(fh)["fingerprint"] == str(graph.fingerprint)
    assert out_degree_histogram(graph, str(tmp_path)) == histogram
    assert len(caplog.messages) == 1  # read back, not recounted
    with open(cached, "w") as fh:
        fh.write("{broken")
    assert out_degree_histogram(graph, str(tmp_path)) == histogram  # recounted
    assert len(caplog.messages) == 2


# A graph with every case the GCN degree distinguishes: vertex 0 has a duplicated in-edge, 1 one
# weighted in-edge, 2 two self loops (the larger last, so PyG's "last" and the SQL's "largest"
# agree) and an in-edge, 3 a lone self loop, 4 no edge at all, 5 only an out-edge.
DEGREE_IDS = np.arange(6, dtype=np.int64)
DEGREE_EDGES = (
    np.array([1, 1, 0, 2, 2, 0, 3, 5], np.int64),
    np.array([0, 0, 1, 2, 2, 2, 3, 1], np.int64),
    np.array([0.5, 0.5, 2.0, 0.25, 3.0, 1.5, 2.5, 4.0], np.float32),
)
# 0: 0.5 + 0.5 + 1; 1: 2 + 4 + 1; 2: 1.5 + 3; 3: 2.5; 4 and 5: their added self loop
DEGREE_EXPECTED = [2.0, 7.0, 4.5, 2.5, 1.0, 1.0]


def test_gcn_degree_arrays_match_the_torch_layer_statistic():
    import torch

    from sparkgnn.layers.stats import gcn_degree as torch_gcn_degree

    src, dst, w = DEGREE_EDGES
    assert gcn_degree(DEGREE_IDS, src, dst, w).tolist() == DEGREE_EXPECTED
    layer = torch_gcn_degree(torch.from_numpy(src), torch.from_numpy(dst), torch.from_numpy(w), len(DEGREE_IDS))
    assert layer.tolist() == DEGREE_EXPECTED
    none = np.zeros(0, np.int64)
    assert gcn_degree(DEGREE_IDS, none, none, np.zeros(0, np.float32)).tolist() == [1.0] * 6
    with pytest.raises(ValueError, match="not vertices"):
        gcn_degree(DEGREE_IDS, np.array([1]), np.array([7]), np.ones(1, np.float32))


def test_statistic_keys_count_edge_weights_only_with_the_weighted_suffix():
    import torch

    from sparkgnn.layers.stats import STATS

    src, dst, w = DEGREE_EDGES
    ones = np.ones(len(src), np.float32)
    assert stat_values("gcn_degree_w", DEGREE_IDS, src, dst, w).tolist() == DEGREE_EXPECTED
    # unweighted: 0: 2 + 1; 1: 2 + 1; 2: 1 + 1 (the loops count once); 3: 1; 4 and 5: 1
    assert stat_values("gcn_degree", DEGREE_IDS, src, dst, w).tolist() == [3.0, 3.0, 2.0, 1.0, 1.0, 1.0]
    # ChebConv's degree sums OUT-edges without self loops: 0: 2 + 1.5; 1: 0.5 + 0.5; 5: 4
    from sparkgnn.engine.degrees import OUT_STAT_TEMPLATES
    from sparkgnn.layers.stats import OUT_EDGE_STATS

    assert set(OUT_STAT_TEMPLATES) == OUT_EDGE_STATS  # the engine's and the layers' lists agree
    assert stat_values("laplacian_degree_w", DEGREE_IDS, src, dst, w).tolist() == [3.5, 1.0, 0.0, 0.0, 0.0, 4.0]
    assert stat_values("laplacian_degree", DEGREE_IDS, src, dst, w).tolist() == [2.0, 2.0, 0.0, 0.0, 0.0, 1.0]
    for name in ("gcn_degree", "weighted_in_degree", "laplacian_degree"):
        t = [torch.from_numpy(a) for a in (src, dst)]
        for key, weight in ((name, ones), (f"{name}_w", w)):
            layer = STATS.lookup(name)(*t, torch.from_numpy(weight), len(DEGREE_IDS))
            assert stat_values(key, DEGREE_IDS, src, dst, w).tolist() == layer.tolist(), key
    with pytest.raises(ValueError, match="unknown node statistic 'nope_w'"):
        stat_values("nope_w", DEGREE_IDS, src, dst, w)


def test_statistic_sql_of_prepare_and_of_the_pruned_statistics_match_the_arrays(spark):
    from sparkgnn.engine.prepare import _vertices_with_degree, out_stat_frame
    from sparkgnn.engine.vertex_stats import stats_of

    src, dst, w = DEGREE_EDGES
    rows = list(zip(src.tolist(), dst.tolist(), w.tolist(), strict=True))
    edges = spark.createDataFrame(rows, "src long, dst long, weight float")
    vertices = spark.createDataFrame([(int(i),) for i in DEGREE_IDS], "id long")
    order = np.array([4, 2, 0, 5, 3, 1], np.int64)
    pruned = stats_of(spark, edges, order, STAT_KEYS)
    prepared = _vertices_with_degree(
        SimpleNamespace(vertices=vertices), edges.withColumnRenamed("weight", "w"), partitions=2
    ).collect()
    assert not set(OUT_STATS) & set(prepared[0].asDict())  # the base layout has no out-edge statistic
    for key in STAT_KEYS:
        arrays = stat_values(key, DEGREE_IDS, src, dst, w).tolist()
        assert pruned[key].tolist() == [arrays[i] for i in order], key
        if key in PREPARED_STATS:
            assert sorted((r.id, r[key]) for r in prepared) == list(enumerate(arrays)), key
            continue
        # an out-edge statistic's on-demand piece: one row per source, the empty value elsewhere
        sums = {r.id: r.v for r in out_stat_frame(edges.withColumnRenamed("weight", "w"), key, 2).collect()}
        assert [sums.get(i, 0.0) for i in range(len(arrays))] == arrays, key
    with pytest.raises(SparkGNNError, match="unknown node statistic 'nope'"):
        stats_of(spark, edges, order, ["nope"])
