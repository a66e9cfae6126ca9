"""Name -> dataset registry, shared by `load(name)` and the CLI.

Why a table instead of if/elif: adding a dataset is one entry (its loader, its writer and which
CLI options it understands), and the CLI builds its sub-commands from the same table, so the
two can never disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sparkgnn.cliargs import non_negative_int, positive_int
from sparkgnn.datasets.cora import load_cora
from sparkgnn.datasets.imdb import load_imdb
from sparkgnn.datasets.synthetic import synthetic_graph, write_synthetic
from sparkgnn.graph import GraphData, write_graph_dir
from sparkgnn.registry import Registry


def _writer_for(loader: Callable[..., GraphData]) -> Callable[..., dict]:
    """Small datasets are loaded whole and written with write_graph_dir."""

    def write(out_dir: str, rows_per_file: int | None = None, overwrite: bool = False, **kwargs) -> dict:
        return write_graph_dir(loader(**kwargs), out_dir, rows_per_file=rows_per_file, overwrite=overwrite)

    return write


@dataclass(frozen=True)
class DatasetEntry:
    load: Callable[..., GraphData]
    write: Callable[..., dict]
    # CLI option -> (keyword argument, type, default, help); default None means required
    cli_options: dict = field(default_factory=dict)
    summary: str = ""
    # CLI on/off flag -> (keyword argument, help); passed as True when given
    cli_flags: dict = field(default_factory=dict)


SEED_OPTION = {"seed": ("seed", int, 0, "seed of the split / generator")}
SIZE_OPTIONS = {
    "nodes": ("num_nodes", positive_int, None, "number of vertices"),
    "edges": ("num_edges", non_negative_int, None, "number of edges"),
    "dim": ("dim", positive_int, None, "feature width F"),
    "classes": ("num_classes", positive_int, 8, "number of label classes"),
}

DATASETS: Registry[DatasetEntry] = Registry("dataset", KeyError)
DATASETS.register(
    "cora",
    DatasetEntry(
        load_cora,
        _writer_for(load_cora),
        SEED_OPTION,
        "Cora citations (2708 papers, 1433-d, 7 classes), bundled with graphdatascience",
    ),
)
DATASETS.register(
    "imdb",
    DatasetEntry(
        load_imdb,
        _writer_for(load_imdb),
        SEED_OPTION,
        "IMDB movies/directors/actors (12772 vertices, 1256-d, 3 genres), bundled",
    ),
)
DATASETS.register(
    "synthetic",
    DatasetEntry(
        synthetic_graph,
        write_synthetic,
        {**SIZE_OPTIONS, **SEED_OPTION},
        "power-law synthetic graph of any size, streamed to Parquet",
        {"weighted": ("weighted", "add a float32 edge weight column")},
    ),
)


def entry(name: str) -> DatasetEntry:
    return DATASETS.lookup(name)


def load(name: str, **kwargs) -> GraphData:
    """load("cora"), load("imdb", seed=1), load("synthetic", num_nodes=..., num_edges=..., dim=...)."""
    return entry(name).load(**kwargs)
