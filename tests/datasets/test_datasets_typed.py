"""Typed datasets: IMDB and LastFM with their real types, the OGB-MAG-shaped generator."""

import numpy as np
import pytest

from sparkgnn.datasets import load, load_imdb, load_typed, synthetic_mag_graph, write_synthetic_mag
from sparkgnn.datasets.__main__ import main
from sparkgnn.graph import read_typed_graph_dir


def test_imdb_typed_cli_writes_the_real_types(tmp_path, capsys):
    assert main(["imdb", "--typed", "--out", str(tmp_path / "imdb")]) == 0
    assert "movie 4661 x 1256-d" in capsys.readouterr().out
    graph = read_typed_graph_dir(str(tmp_path / "imdb"))
    assert {t: n.num_nodes for t, n in graph.nodes.items()} == {"movie": 4661, "director": 2270, "actor": 5841}
    assert {et: e.num_edges for et, e in graph.edges.items()} == {
        ("director", "directed_in", "movie"): 4661,
        ("actor", "acted_in", "movie"): 13983,
        ("movie", "rev_directed_in", "director"): 4661,
        ("movie", "rev_acted_in", "actor"): 13983,
    }
    movie = graph.nodes["movie"]
    assert movie.num_classes == 3 and (movie.y >= 0).sum() == 2939
    flat = load_imdb()  # the same movies get the same split as in the flat graph
    np.testing.assert_array_equal(movie.split, flat.split[: movie.num_nodes])


def test_lastfm_is_typed_only_without_features():
    graph = load_typed("lastfm")
    assert {t: (n.num_nodes, n.feature_dim) for t, n in graph.nodes.items()} == {
        "user": (1892, 0),
        "artist": (18022, 0),
    }
    assert graph.edges[("user", "listens_to", "artist")].weight.min() >= 1
    with pytest.raises(ValueError, match="has only a typed form"):
        load("lastfm")


def test_synthetic_mag_shape_options_and_determinism(tmp_path):
    options = dict(field_dim=3, isolated_frac=0.1, self_loop_frac=0.2, parallel_frac=0.3, reverse=True, seed=3)
    graph = synthetic_mag_graph(600, **options)
    assert graph.node_types == ["paper", "author", "institution", "field_of_study"]
    assert {t: n.feature_dim for t, n in graph.nodes.items()} == {
        "paper": 128,
        "author": 0,
        "institution": 0,
        "field_of_study": 3,
    }
    assert graph.nodes["paper"].has_labels and graph.nodes["author"].y is None
    assert graph.nodes["author"].num_nodes == 900 and len(graph.edge_types) == 7  # cites has no reverse
    cites = graph.edges[("paper", "cites", "paper")]
    assert 0.1 < np.mean(cites.src == cites.dst) < 0.3  # self loops on request
    writes = graph.edges[("author", "writes", "paper")]
    pairs = writes.src * 10**6 + writes.dst
    assert len(np.unique(pairs)) < 0.9 * len(pairs)  # parallel edges
    touched = np.union1d(writes.src, graph.edges[("author", "affiliated_with", "institution")].src)
    assert len(touched) < 0.95 * graph.nodes["author"].num_nodes  # isolated authors
    degree = np.bincount(cites.dst)
    assert degree.max() > 10 * max(degree.mean(), 1)  # power-law in-degree of cited papers
    assert synthetic_mag_graph(600, **options).fingerprint == graph.fingerprint
    assert synthetic_mag_graph(600, **{**options, "seed": 4}).fingerprint != graph.fingerprint
    meta = write_synthetic_mag(str(tmp_path / "mag"), 600, rows_per_file=500, **options)
    assert meta["fingerprint"] == graph.fingerprint  # streamed in chunks: the same graph
    assert read_typed_graph_dir(str(tmp_path / "mag")).nodes["paper"].num_classes == 8
