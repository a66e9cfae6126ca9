"""ServingContext's index patched from an earlier version's context (`previous`, a delta swap):
equal, array for array, to the index built from scratch when the new graph only appends edges
(weighted or not, out-index included), and built from scratch when it does anything else.
Concurrent calls on one context (an online pool's slots and express lanes) each get the answer
they get alone, and a context still pickles (a partitioned executor carries it)."""

from __future__ import annotations

import dataclasses
import pickle
import threading
import time

import numpy as np
import pytest

from sparkgnn.graph.updates import GraphUpdate, apply
from sparkgnn.serving import QueryEngine, nodesets
from sparkgnn.serving.context import Meter, ServingContext, _appended_edges


def _indexes(context: ServingContext) -> list:
    context.out_neighbors(np.arange(2))
    return [context.indptr, context.in_src, context.in_weight, *context._out]


@pytest.mark.parametrize("weighted", [False, True])
def test_appended_edges_patch_the_index_to_the_one_built_from_scratch(skewed, weighted):
    rng = np.random.default_rng(3)
    G = dataclasses.replace(skewed, weight=rng.random(skewed.num_edges).astype(np.float32) if weighted else None)
    src, dst = rng.choice(G.ids, 40), rng.choice(G.ids[:5], 40)  # repeated destinations and sources
    weight = rng.random(40).astype(np.float32) if weighted else None
    G2 = apply(GraphUpdate(edge_insert_src=src, edge_insert_dst=dst, edge_insert_weight=weight), G).graph
    old = ServingContext(G, None)
    _indexes(old)
    assert _appended_edges(old, G2) == 40
    patched, fresh = _indexes(ServingContext(G2, None, previous=old)), _indexes(ServingContext(G2, None))
    for got, want in zip(patched, fresh, strict=True):
        assert (got is None and want is None) or np.array_equal(got, want)


def test_any_other_change_builds_the_index_from_scratch(skewed):
    G = dataclasses.replace(skewed, weight=None)
    old = ServingContext(G, None)
    deleted = apply(GraphUpdate(edge_delete_src=G.ids[G.edge_src[:1]], edge_delete_dst=G.ids[G.edge_dst[:1]]), G).graph
    assert _appended_edges(old, deleted) is None
    new_vertex = int(G.ids.max()) + 1
    grown = apply(
        GraphUpdate(
            vertex_insert_ids=np.array([new_vertex]),
            vertex_insert_x=np.zeros((1, G.feature_dim), np.float32),
            edge_insert_src=np.array([new_vertex]),
            edge_insert_dst=G.ids[:1],
        ),
        G,
    ).graph
    assert _appended_edges(old, grown) is None
    context = ServingContext(deleted, None, previous=old)
    assert np.array_equal(context.in_src, ServingContext(deleted, None).in_src)


class _Interleaving:
    """numpy for nodesets.py that forces the interleaving which made two calls on one context
    read each other's vertices: the first thread to read its marks back inside unique_inverse
    (NodeSets.unique's flatnonzero, between marking and clearing them) waits until the other
    thread has completed a unique on marks of its own (marked, read and cleared them). With one
    set of marks shared, the other's clearing wipes the first's marks: its distinct values miss
    some, and their inverse points nowhere (a superset elsewhere, e.g. EXACT's changed sets,
    would still give the right answer)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first: int | None = None  # the thread that waits
        self._waiting = threading.Event()
        self.other_done = threading.Event()  # the interleaving happened
        self._local = threading.local()

    def __getattr__(self, name: str):
        return getattr(np, name)

    def flatnonzero(self, a):
        me = threading.get_ident()
        with self._lock:
            first = self._first is None and getattr(self._local, "inverse", False)
            if first:
                self._first = me
        if first:
            self._waiting.set()
            self.other_done.wait(30)
        elif me != self._first and self._waiting.is_set():
            self._local.marked = True
        return np.flatnonzero(a)

    def patch(self, monkeypatch) -> None:
        """Route nodesets.py's numpy through this object; a unique of the other thread that read
        its marks back while the first waits releases the first."""
        original, original_inverse = nodesets.NodeSets.unique, nodesets.NodeSets.unique_inverse

        def unique(sets, *arrays):
            self._local.marked = False
            out = original(sets, *arrays)
            if self._local.marked:
                self.other_done.set()
            return out

        def unique_inverse(sets, values):
            self._local.inverse = True
            try:
                return original_inverse(sets, values)
            finally:
                self._local.inverse = False

        monkeypatch.setattr(nodesets, "np", self)
        monkeypatch.setattr(nodesets.NodeSets, "unique", unique)
        monkeypatch.setattr(nodesets.NodeSets, "unique_inverse", unique_inverse)


@pytest.mark.parametrize("mode", ["full", "he", "exact"])
def test_two_calls_at_once_on_one_engine_get_the_answers_they_get_alone(request, reuse_setup, monkeypatch, mode):
    wl, _pyg, model, store, _full = reuse_setup(request, "skewed", "gcn", 2)
    engine = QueryEngine(wl.graph_G, model, mode=mode, store=store if mode != "full" else None)
    picked = sorted(wl.requests, key=lambda r: -r.num_edges)[:2]  # many touched vertices: NodeSets' dense path
    alone = [engine.answer(r) for r in picked]
    interleaving = _Interleaving()
    interleaving.patch(monkeypatch)
    together: list = [None, None]

    def answer(i: int) -> None:
        try:
            together[i] = engine.answer(picked[i])
        except Exception as exc:  # noqa: BLE001 - the failure is the finding: reported below
            together[i] = exc

    threads = [threading.Thread(target=answer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert interleaving.other_done.is_set()  # one call's set operation ran inside the other's
    for got, want in zip(together, alone, strict=True):
        assert not isinstance(got, Exception), got
        np.testing.assert_allclose(got.h, want.h, rtol=1e-5, atol=1e-6)
        assert got.breakdown["nodes_touched"] == want.breakdown["nodes_touched"]


def test_a_context_pickles_without_its_lock_and_marks_and_gets_new_ones(skewed):
    context = ServingContext(dataclasses.replace(skewed, weight=None), None)
    context.sets.unique(np.arange(5))
    copy = pickle.loads(pickle.dumps(context))
    assert copy.sets is not context.sets and np.array_equal(copy.in_src, context.in_src)
    assert copy.sets.unique(np.array([3, 1, 3])).tolist() == [1, 3]


def test_meter_timer_adds_each_blocks_seconds_to_its_key_even_when_the_block_raises():
    meter = Meter()
    with meter.timer("compute_s"):
        time.sleep(0.01)
    with pytest.raises(ValueError), meter.timer("compute_s"):
        time.sleep(0.01)
        raise ValueError("boom")
    with meter.timer("new_key"):
        pass
    assert meter.seconds["compute_s"] >= 0.02  # both blocks' sleeps (each at least 10 ms), not one
    assert meter.seconds["fetch_s"] == 0.0 and meter.seconds["new_key"] >= 0.0
