"""Graph model: the on-disk format, the in-memory GraphData, and the Spark-side Graph.

    GraphData              numpy arrays, dense edge indices (datasets, tests, PyG reference, workers)
    read_graph_dir         <dir> -> GraphData with pyarrow (no Spark)
    write_graph_dir        GraphData -> <dir> (Parquet + graph.json with a content fingerprint)
    GraphDirWriter         the same, streamed chunk by chunk (synthetic graphs of any size)
    Graph                  vertices/edges DataFrames (GraphFrames schema), validated, with stats

None of these import pyspark or torch at import time (see each module for why).
"""

from sparkgnn.errors import GraphValidationError
from sparkgnn.graph.data import GraphData
from sparkgnn.graph.fingerprint import FingerprintAccumulator, fingerprint_arrays
from sparkgnn.graph.layout import EDGES_DIR, META_FILE, VERTICES_DIR, read_meta
from sparkgnn.graph.reader import graph_data_from_tables, read_graph_dir
from sparkgnn.graph.spark_graph import Graph
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
    "write_graph_dir",
    "VERTICES_DIR",
    "EDGES_DIR",
    "META_FILE",
]
