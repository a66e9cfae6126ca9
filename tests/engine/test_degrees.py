"""engine.degrees: the out-degree histogram is counted once per graph and read back after."""

import json
import os

import numpy as np

from sparkgnn.engine.degrees import FILE, out_degree_histogram
from sparkgnn.graph import Graph


def test_histogram_counts_out_degrees_and_is_cached_by_fingerprint(spark, graph_dirs, tmp_path):
    path, data = graph_dirs["skewed"]
    graph = Graph.load(spark, path)
    lines = []
    histogram = out_degree_histogram(graph, str(tmp_path), log=lines.append)
    src = np.asarray(data.src_ids)
    degrees = np.unique(np.unique(src, return_counts=True)[1], return_counts=True)
    assert histogram == dict(zip(degrees[0].tolist(), degrees[1].tolist(), strict=True))
    assert len(lines) == 1 and "out-degree histogram" in lines[0]
    cached = os.path.join(str(tmp_path), "prep", str(graph.fingerprint), FILE)
    with open(cached) as fh:
        assert json.load(fh)["fingerprint"] == str(graph.fingerprint)
    assert out_degree_histogram(graph, str(tmp_path), log=lines.append) == histogram
    assert len(lines) == 1  # read back, not recounted
    with open(cached, "w") as fh:
        fh.write("{broken")
    assert out_degree_histogram(graph, str(tmp_path), log=lines.append) == histogram  # recounted
    assert len(lines) == 2
