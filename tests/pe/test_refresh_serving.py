"""Serving from a refreshed PE store (pe/refresh.py): EXACT answers from the store version that
refresh_local committed for the updated graph equal FULL answers on the updated graph (read back
from the graph directory the refresh wrote), for requests whose queries attach to what the update
changed (inserted vertices, endpoints of inserted and deleted edges, updated features) as well as
to untouched vertices, in both directions; and the old version still serves the old graph."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "serving"))
from serving_testkit import skewed_graph  # noqa: E402
from test_refresh import model_of, random_update  # noqa: E402

from sparkgnn.graph.reader import read_graph_dir  # noqa: E402
from sparkgnn.pe import PEStore  # noqa: E402
from sparkgnn.pe.local import precompute_local  # noqa: E402
from sparkgnn.pe.refresh import refresh_local  # noqa: E402
from sparkgnn.serving import QueryEngine  # noqa: E402
from sparkgnn.serving.request import Request  # noqa: E402


def rel(a, b) -> float:
    """Largest difference relative to the reference's largest value (the serving tests' rule)."""
    return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def changed_vertices(update, graph) -> np.ndarray:
    """Vertices of `graph` (the updated one) that the update touched."""
    touched = np.concatenate(
        [
            update.vertex_insert_ids,
            update.feature_update_ids,
            update.edge_insert_src,
            update.edge_insert_dst,
            update.edge_delete_src,
            update.edge_delete_dst,
        ]
    )
    return np.unique(touched[np.isin(touched, graph.ids)])


def requests_on(graph, near: np.ndarray, count: int, seed: int) -> list[Request]:
    """`count` requests of 1-3 queries (ids above the graph's), each query with in-edges from
    two vertices of `near` and one random vertex, an out-edge to one of `near` (so EXACT has G
    vertices to recompute) and, with several queries, a query -> query edge."""
    rng = np.random.default_rng(seed)
    base = int(graph.ids.max()) + 1_000
    out = []
    for i in range(count):
        b = int(rng.integers(1, 4))
        qid = base + 10 * i + np.arange(b)
        src, dst = [], []
        for q in qid:
            for v in [*rng.choice(near, 2), rng.choice(graph.ids)]:
                src.append(v)
                dst.append(q)
            src.append(q)
            dst.append(rng.choice(near))
        if b > 1:
            src.append(qid[0])
            dst.append(qid[1])
        x = rng.standard_normal((b, graph.feature_dim)).astype(np.float32)
        out.append(Request(f"r{i}", qid, x, np.array(src, np.int64), np.array(dst, np.int64)))
    return out


@pytest.fixture(scope="module")
def graph():
    return skewed_graph()


@pytest.mark.parametrize(
    "kind,layers",
    [
        ("gcn", 2),
        ("sage", 2),
        ("sage", 3),
        ("gcn", 3),
        ("sage_max", 2),
        ("gin", 2),
        ("gat", 2),
        ("gatv2", 2),
        ("le", 2),
        ("tagconv", 2),
        ("appnp", 2),
        ("edgeconv", 2),
        ("transformer", 2),
        ("gen", 2),
        ("pna", 2),
    ],
)
def test_exact_on_a_refreshed_store_equals_full_on_the_updated_graph(graph, tmp_path, kind, layers):
    model = model_of(kind, graph.feature_dim, layers)
    root = str(tmp_path / "store")
    old = precompute_local(graph, model, root)
    update = random_update(graph, seed=20 + layers)
    refreshed, _ = refresh_local(graph, update, model, root, out_graph=str(tmp_path / "graph2"))
    new_graph = read_graph_dir(str(tmp_path / "graph2"))
    assert refreshed.manifest["graph_fingerprint"] == str(new_graph.fingerprint)
    assert refreshed.base != old.base  # a new version under the same root

    # the store as a service opens it: by root, for the updated graph directory
    store = PEStore.open(root, model=model, graph=str(tmp_path / "graph2"))
    assert store.base == refreshed.base
    full = QueryEngine(new_graph, model, mode="full")
    exact = QueryEngine(new_graph, model, mode="exact", store=store, context=full.context)
    requests = requests_on(new_graph, changed_vertices(update, new_graph), 6, seed=layers)
    for r in requests:
        got, want = exact.answer(r), full.answer(r)
        np.testing.assert_array_equal(got.qid, want.qid)
        assert rel(got.h, want.h) < 1e-5, (kind, layers, r.request_id, rel(got.h, want.h))
        if want.pred is not None:
            np.testing.assert_array_equal(got.pred, want.pred)

    # the old version is still there, and still serves the old graph exactly
    old_full = QueryEngine(graph, model, mode="full")
    old_exact = QueryEngine(graph, model, mode="exact", store=old, context=old_full.context)
    for r in requests_on(graph, graph.ids[:50], 2, seed=99):
        assert rel(old_exact.answer(r).h, old_full.answer(r).h) < 1e-5
