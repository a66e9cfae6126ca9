"""Datasets as GraphData or graph directories: Cora and IMDB from the Parquet files bundled in the
graphdatascience 2.2 wheel (nothing downloads), and synthetic power-law graphs of any size.

    load(name, **kw)          registry lookup: "cora", "imdb", "synthetic"
    load_cora(), load_imdb()  GraphData with labels and a seeded split
    load_typed(name, **kw)    TypedGraphData: "imdb" (its real types), "lastfm", "synthetic-mag"
    synthetic_mag_graph(...), write_synthetic_mag(...)   OGB-MAG-shaped typed graphs of any size
    synthetic_graph(...)      GraphData in memory
    write_synthetic(...)      the same graph streamed to Parquet in chunks
CLI: python -m sparkgnn.datasets cora|imdb|synthetic|lastfm|synthetic-mag ... [--typed] --out DIR
"""

from sparkgnn.datasets.bundled import DatasetUnavailable
from sparkgnn.datasets.cora import load_cora
from sparkgnn.datasets.imdb import load_imdb, load_imdb_typed
from sparkgnn.datasets.lastfm import load_lastfm_typed
from sparkgnn.datasets.registry import DATASETS, load, load_typed
from sparkgnn.datasets.splits import make_split
from sparkgnn.datasets.synthetic import SyntheticSpec, synthetic_graph, write_synthetic
from sparkgnn.datasets.synthetic_mag import MagSpec, synthetic_mag_graph, write_synthetic_mag

__all__ = [
    "DATASETS",
    "DatasetUnavailable",
    "SyntheticSpec",
    "load",
    "load_cora",
    "load_imdb",
    "load_imdb_typed",
    "load_lastfm_typed",
    "load_typed",
    "MagSpec",
    "synthetic_mag_graph",
    "write_synthetic_mag",
    "make_split",
    "synthetic_graph",
    "write_synthetic",
]
