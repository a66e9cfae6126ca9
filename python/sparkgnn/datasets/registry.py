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
from sparkgnn.datasets.imdb import load_imdb, load_imdb_typed
from sparkgnn.datasets.lastfm import load_lastfm_typed
from sparkgnn.datasets.synthetic import synthetic_graph, write_synthetic
from sparkgnn.datasets.synthetic_mag import synthetic_mag_graph, write_synthetic_mag
from sparkgnn.graph import GraphData, write_graph_dir
from sparkgnn.graph.typed import TypedGraphData
from sparkgnn.graph.typed_io import write_typed_graph_dir
from sparkgnn.registry import Registry


def _writer_for(loader: Callable[..., GraphData]) -> Callable[..., dict]:
    """Small datasets are loaded whole and written with write_graph_dir."""

    def write(out_dir: str, rows_per_file: int | None = None, overwrite: bool = False, **kwargs) -> dict:
        return write_graph_dir(loader(**kwargs), out_dir, rows_per_file=rows_per_file, overwrite=overwrite)

    return write


def _typed_writer_for(loader: Callable[..., TypedGraphData]) -> Callable[..., dict]:
    """Small typed datasets are loaded whole and written with write_typed_graph_dir."""

    def write(out_dir: str, rows_per_file: int | None = None, overwrite: bool = False, **kwargs) -> dict:
        return write_typed_graph_dir(loader(**kwargs), out_dir, rows_per_file=rows_per_file, overwrite=overwrite)

    return write


@dataclass(frozen=True)
class DatasetEntry:
    """A dataset's homogeneous loader and writer (None: it has only a typed form) and, when it
    has one, its typed loader and writer (the CLI's --typed)."""

    load: Callable[..., GraphData] | None
    write: Callable[..., dict] | None
    # CLI option -> (keyword argument, type, default, help); default None means required
    cli_options: dict = field(default_factory=dict)
    summary: str = ""
    # CLI on/off flag -> (keyword argument, help); passed as True when given
    cli_flags: dict = field(default_factory=dict)
    load_typed: Callable[..., TypedGraphData] | None = None
    write_typed: Callable[..., dict] | None = None


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
        "IMDB movies/directors/actors (12772 vertices, 1256-d, 3 genres), bundled; --typed keeps the types",
        load_typed=load_imdb_typed,
        write_typed=_typed_writer_for(load_imdb_typed),
    ),
)
DATASETS.register(
    "lastfm",
    DatasetEntry(
        None,
        None,
        {},
        "LastFM users/artists, typed only (19914 vertices without features, 5 edge types), bundled",
        load_typed=load_lastfm_typed,
        write_typed=_typed_writer_for(load_lastfm_typed),
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


MAG_OPTIONS = {
    "papers": (
        "num_papers",
        positive_int,
        None,
        "number of papers (other types and edges scale with it, as in OGB-MAG)",
    ),
    "dim": ("dim", positive_int, 128, "paper feature width"),
    "classes": ("num_classes", positive_int, 8, "number of paper label classes"),
    "author-dim": ("author_dim", non_negative_int, 0, "author feature width (0: no features)"),
    "institution-dim": ("institution_dim", non_negative_int, 0, "institution feature width (0: no features)"),
    "field-dim": ("field_dim", non_negative_int, 0, "field_of_study feature width (0: no features)"),
    "isolated": ("isolated_frac", float, 0.01, "fraction of each type's vertices in no edge"),
    "self-loops": ("self_loop_frac", float, 0.0, "fraction of cites edges that are self loops"),
    "parallel": ("parallel_frac", float, 0.0, "fraction of each relation's edges repeating the one before"),
}
DATASETS.register(
    "synthetic-mag",
    DatasetEntry(
        None,
        None,
        {**MAG_OPTIONS, **SEED_OPTION},
        "OGB-MAG-shaped typed graph of any size (paper, author, institution, field_of_study), streamed",
        {"reverse": ("reverse", "add rev_ edge types between two node types")},
        load_typed=synthetic_mag_graph,
        write_typed=write_synthetic_mag,
    ),
)


def entry(name: str) -> DatasetEntry:
    return DATASETS.lookup(name)


def load(name: str, **kwargs) -> GraphData:
    """load("cora"), load("imdb", seed=1), load("synthetic", num_nodes=..., num_edges=..., dim=...)."""
    item = entry(name)
    if item.load is None:
        raise ValueError(f"dataset {name!r} has only a typed form: use load_typed({name!r})")
    return item.load(**kwargs)


def load_typed(name: str, **kwargs) -> TypedGraphData:
    """load_typed("imdb"), load_typed("lastfm"), load_typed("synthetic-mag", num_papers=...)."""
    item = entry(name)
    if item.load_typed is None:
        typed = ", ".join(n for n, e in DATASETS.items() if e.load_typed is not None)
        raise ValueError(f"dataset {name!r} has no typed form (typed datasets: {typed})")
    return item.load_typed(**kwargs)
