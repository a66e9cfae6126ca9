"""Graph model: the on-disk format, the in-memory GraphData, and the Spark-side Graph.

    GraphData              numpy arrays, dense edge indices (datasets, tests, PyG reference, workers)
    read_graph_dir         <dir> -> GraphData with pyarrow (no Spark)
    write_graph_dir        GraphData -> <dir> (Parquet + graph.json with a content fingerprint)
    GraphDirWriter         the same, streamed chunk by chunk (synthetic graphs of any size)
    Graph                  vertices/edges DataFrames (GraphFrames schema), validated, with stats
    TypedGraphData         a typed (heterogeneous) graph in memory, from_pyg / to_pyg (typed.py)
    read_typed_graph_dir / write_typed_graph_dir / TypedGraphDirWriter   its directory (typed_io.py)
    TypedGraph             its DataFrames per node type and edge type (typed_spark.py)

None of these import pyspark or torch at import time (see each module for why).
"""

from sparkgnn.errors import GraphValidationError
from sparkgnn.graph.data import GraphData
from sparkgnn.graph.fingerprint import FingerprintAccumulator, fingerprint_arrays
from sparkgnn.graph.layout import EDGES_DIR, META_FILE, VERTICES_DIR, read_meta
from sparkgnn.graph.reader import graph_data_from_tables, read_graph_dir
from sparkgnn.graph.spark_graph import Graph
from sparkgnn.graph.typed import TypedEdges, TypedGraphData
from sparkgnn.graph.typed_io import TypedGraphDirWriter, read_typed_graph_dir, write_typed_graph_dir
from sparkgnn.graph.typed_spark import TypedGraph
from sparkgnn.graph.writer import GraphDirWriter, write_graph_dir

__all__ = [
    "Graph",
    "GraphData",
    "GraphDirWriter",
    "GraphValidationError",
    "FingerprintAccumulator",
    "fingerprint_arrays",
    "graph_data_from_tables",
    "read_graph_dir",
    "read_meta",
    "read_typed_graph_dir",
    "TypedEdges",
    "TypedGraph",
    "TypedGraphData",
    "TypedGraphDirWriter",
    "write_typed_graph_dir",
    "write_graph_dir",
    "VERTICES_DIR",
    "EDGES_DIR",
    "META_FILE",
]
