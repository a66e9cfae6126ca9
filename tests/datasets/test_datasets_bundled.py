"""Cora and IMDB read from the graphdatascience wheel's Parquet files (no network)."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from sparkgnn.datasets import DatasetUnavailable, bundled, load, load_cora, load_imdb


def test_cora_counts_and_split():
    g = load_cora()
    rels = pq.read_metadata(bundled.resource_path("cora", "cora_rels.parquet.gzip"))
    assert (g.num_nodes, g.feature_dim, g.num_classes) == (2708, 1433, 7)
    assert g.num_edges == rels.num_rows == 5429
    assert g.ids.max() > g.num_nodes  # original paper ids, not dense
    assert set(np.unique(g.x)) <= {0.0, 1.0} and g.x.dtype == np.float32
    assert [int(g.mask(s).sum()) for s in ("train", "val", "test")] == [140, 500, 1000]
    assert np.bincount(g.y[g.mask("train")]).tolist() == [20] * 7
    g.validate()


def test_cora_split_is_seeded_and_undirected_matches_planetoid():
    assert (load_cora(seed=0).split == load_cora(seed=0).split).all()
    assert (load_cora(seed=1).split != load_cora(seed=0).split).any()
    assert load_cora(undirected=True).num_edges == 10556  # PyG Planetoid's Cora


def test_imdb_loads():
    g = load_imdb()
    assert (g.num_nodes, g.feature_dim, g.num_classes) == (12772, 1256, 3)
    assert g.num_edges == 2 * (4661 + 13983)  # director->movie, actor->movie, plus reverses
    labelled = g.y >= 0
    assert labelled.sum() == 2939 and (g.y[~labelled] == -1).all()
    in_split = g.split != ""
    assert (in_split == labelled).all()  # every labelled movie is in a split, nothing else is
    assert int(g.mask("train").sum()) == round(0.6 * 2939)
    assert load_imdb(reverse=False).num_edges == 4661 + 13983
    g.validate()


def test_registry():
    assert load("cora").name == "cora"
    known = "cora, imdb, lastfm, synthetic, synthetic-mag"
    with pytest.raises(KeyError, match=f"unknown dataset 'citeseer'; known: {known}"):
        load("citeseer")


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(bundled.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DatasetUnavailable, match=r"pip install --no-deps graphdatascience==2\.2"):
        load_cora()
