"""TypedGraph: a typed directory as Spark DataFrames per type (one case: Spark is slow)."""

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkgnn.errors import GraphValidationError
from sparkgnn.graph import TypedGraph, write_typed_graph_dir
from sparkgnn.graph.typed import TypedEdges, TypedGraphData, node_table


def test_typed_graph_loads_per_type_frames_fingerprints_and_validates(spark, tmp_path):
    rng = np.random.default_rng(0)
    graph = TypedGraphData(
        {
            "paper": node_table([10, 11, 12], rng.standard_normal((3, 4)), y=[0, 1, -1]),
            "author": node_table([7, 8]),  # no features
        },
        {
            ("author", "writes", "paper"): TypedEdges([7, 7, 8], [10, 12, 12], weight=[1.0, 0.5, 2.0]),
            ("paper", "cites", "paper"): TypedEdges([10, 11], [11, 11], edge_attr=rng.standard_normal((2, 2))),
        },
        name="toy",
    )
    path = tmp_path / "g"
    write_typed_graph_dir(graph, str(path))
    loaded = TypedGraph.load(spark, str(path), validate=True)
    assert loaded.metadata() == graph.metadata()
    assert loaded.vertices["author"].count() == 2 and loaded.vertices["author"].first().x == []
    assert sorted(r.src for r in loaded.edges[("author", "writes", "paper")].collect()) == [7, 7, 8]
    loaded._fingerprint = None  # computed from the frames: the value graph.json holds
    assert loaded.fingerprint == graph.fingerprint

    # a dst missing in its typed vertex table, written by another tool (no graph.json stamp match)
    folder = path / "edges" / "author__writes__paper"
    shutil.rmtree(folder)
    folder.mkdir()
    pq.write_table(pa.table({"src": [7, 8], "dst": [10, 99]}), folder / "part-00000.parquet")
    with pytest.raises(
        GraphValidationError, match=r"author__writes__paper: 1 edges have a dst that is not an id of node type 'paper'"
    ):
        TypedGraph.load(spark, str(path))
