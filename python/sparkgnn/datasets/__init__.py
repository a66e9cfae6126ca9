"""Datasets as GraphData or graph directories: Cora and IMDB from the Parquet files bundled in the
graphdatascience 2.2 wheel (nothing downloads), and synthetic power-law graphs of any size.

    load(name, **kw)          registry lookup: "cora", "imdb", "synthetic"
    load_cora(), load_imdb()  GraphData with labels and a seeded split
    synthetic_graph(...)      GraphData in memory
    write_synthetic(...)      the same graph streamed to Parquet in chunks
CLI: python -m sparkgnn.datasets cora|imdb|synthetic ... --out DIR
"""

from sparkgnn.datasets.bundled import DatasetUnavailable
from sparkgnn.datasets.cora import load_cora
from sparkgnn.datasets.imdb import load_imdb
from sparkgnn.datasets.registry import DATASETS, load
from sparkgnn.datasets.splits import make_split
from sparkgnn.datasets.synthetic import SyntheticSpec, synthetic_graph, write_synthetic

__all__ = [
    "DATASETS",
    "DatasetUnavailable",
    "SyntheticSpec",
    "load",
    "load_cora",
    "load_imdb",
    "make_split",
    "synthetic_graph",
    "write_synthetic",
]
