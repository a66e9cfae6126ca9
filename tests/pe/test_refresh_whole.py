"""A refresh layer whose change reaches most of the graph is computed over every vertex as the
precompute computes it (pe/refresh.WHOLE_LAYER_FRACTION, pe/local.whole_layer): the refreshed
store equals a precompute of the updated graph, whether every layer goes whole, only the later
ones do (layer 1 by the delta / scratch kernel, layer 2 reading its recomputed and stored rows),
or a follower's batch takes it; the report says which kernel each layer ran."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_refresh import assert_same_store, model_of, random_update  # noqa: E402

from sparkgnn.graph.updates import apply  # noqa: E402
from sparkgnn.pe import refresh  # noqa: E402
from sparkgnn.pe.local import precompute_local  # noqa: E402
from sparkgnn.pe.refresh import refresh_local  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "serving"))
from serving_testkit import skewed_graph  # noqa: E402


@pytest.fixture(scope="module")
def graph():
    return skewed_graph()


def _refreshed(graph, tmp_path, kind: str, layers: int):
    model = model_of(kind, graph.feature_dim, layers)
    precompute_local(graph, model, str(tmp_path / "store"))
    update = random_update(graph, seed=layers + 11)
    new_graph = apply(update, graph).graph
    store, report = refresh_local(graph, update, model, str(tmp_path / "store"))
    scratch = precompute_local(new_graph, model, str(tmp_path / "scratch"))
    assert_same_store(store, scratch, new_graph.ids, model.num_rounds)
    return report, new_graph


@pytest.mark.parametrize("kind", ["gcn", "sage", "sage_max", "gat", "gin", "chebconv", "pna"])
def test_every_layer_whole_equals_a_precompute(graph, tmp_path, monkeypatch, kind):
    monkeypatch.setattr(refresh, "WHOLE_LAYER_FRACTION", 0.0)
    report, new_graph = _refreshed(graph, tmp_path, kind, 2)
    assert len(report.layers) >= 2 and {layer["kernel"] for layer in report.layers} == {"whole layer"}
    assert all(layer["targets"] == new_graph.num_nodes for layer in report.layers)


@pytest.mark.parametrize("kind", ["gcn", "sage", "gat"])
def test_a_delta_layer_then_whole_layers_equal_a_precompute(graph, tmp_path, monkeypatch, kind):
    """The threshold set between layer 1's targets and layer 2's: layer 1 by the kernel, the
    later ones whole, reading layer 1's recomputed rows and its stored ones."""
    monkeypatch.setattr(refresh, "WHOLE_LAYER_FRACTION", 2.0)
    model = model_of(kind, graph.feature_dim, 3)
    update = random_update(graph, seed=14)  # _refreshed's update for 3 layers
    precompute_local(graph, model, str(tmp_path / "probe"))
    _store, probe = refresh_local(graph, update, model, str(tmp_path / "probe"))
    first, second = (layer["targets"] for layer in probe.layers[:2])
    assert first < second, (first, second)
    monkeypatch.setattr(refresh, "WHOLE_LAYER_FRACTION", (first + 1) / graph.num_nodes)
    report, _new_graph = _refreshed(graph, tmp_path / "run", kind, 3)
    assert [layer["kernel"] for layer in report.layers] == ["delta / scratch", "whole layer", "whole layer"]


def test_a_follower_batch_computed_whole_equals_a_precompute(graph, tmp_path, monkeypatch):
    from test_follow import drop, random_inserts

    from sparkgnn.pe.follow import RefreshFollower

    monkeypatch.setattr(refresh, "WHOLE_LAYER_FRACTION", 0.0)
    model = model_of("gcn", graph.feature_dim, 2)
    root, inbox, state = str(tmp_path / "store"), str(tmp_path / "in"), str(tmp_path / "state")
    os.makedirs(inbox)
    precompute_local(graph, model, root)
    follower = RefreshFollower(graph=graph, model=model, store=root, updates=inbox, state=state, commit_every_s=3600)
    rng = np.random.default_rng(5)
    for i in range(3):
        drop(inbox, f"{i}.parquet", random_inserts(graph, rng, 5), 1000 + i)
        progress = follower.poll(flush=True)
        assert progress is not None and progress.recomputed == [follower.graph.num_nodes] * 2
    assert follower.commit()
    follower.close()
    want = precompute_local(follower.graph, model, str(tmp_path / "scratch"))
    assert_same_store(follower.store, want, follower.graph.ids, 2)
