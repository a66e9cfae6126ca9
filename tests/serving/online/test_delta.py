"""Delta swaps (serving.online.delta): after refresh_local commits a row-level store version of an
updated graph, a swap patches the rows it changed into the served version's arrays instead of
reading the store whole. The patched arrays equal a fresh alignment of the new version, the
service's EXACT and HE answers equal engines opened on the new version, a batch dispatched on
the old version before the swap finishes on it unchanged, and a change over the threshold (or a
swap back to an older version) loads whole."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from serving_testkit import pyg_model

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "pe"))
from test_refresh import random_update  # noqa: E402

from sparkgnn.graph import write_graph_dir  # noqa: E402
from sparkgnn.graph.reader import read_graph_dir  # noqa: E402
from sparkgnn.models import Model  # noqa: E402
from sparkgnn.pe.local import precompute_local  # noqa: E402
from sparkgnn.pe.refresh import refresh_local  # noqa: E402
from sparkgnn.pe.store import PEStore  # noqa: E402
from sparkgnn.serving import QueryEngine  # noqa: E402
from sparkgnn.serving.online import batch_op, delta, wire  # noqa: E402
from sparkgnn.serving.online.client import Client  # noqa: E402
from sparkgnn.serving.online.config import ServeConfig  # noqa: E402
from sparkgnn.serving.online.deployments import batch_header  # noqa: E402
from sparkgnn.serving.online.server import Server  # noqa: E402
from sparkgnn.serving.request import Request  # noqa: E402
from sparkgnn.serving.stored import StoredLayers  # noqa: E402


class Setup:
    """Version 1 (a precompute), version 2 (refresh_local of a small update, same root) and
    requests valid on both graphs, with FULL's answers on each."""

    def __init__(self, d, G):
        self.G = G
        self.model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=3))
        self.model_path = str(d / "model.pt")
        self.model.save(self.model_path)
        self.g1, self.g2, self.root = str(d / "g1"), str(d / "g2"), str(d / "store")
        write_graph_dir(G, self.g1)
        precompute_local(G, self.model, self.root)
        update = random_update(G, seed=5, edges=10)
        self.v2, _ = refresh_local(G, update, self.model, self.root, out_graph=self.g2)
        self.G2 = read_graph_dir(self.g2)
        both = np.intersect1d(G.ids, self.G2.ids)
        near = np.intersect1d(np.concatenate([update.edge_insert_dst, update.feature_update_ids]), both)
        base = int(max(G.ids.max(), self.G2.ids.max())) + 1000
        rng = np.random.default_rng(7)
        self.requests = []
        for i in range(6):
            qid = base + 10 * i + np.arange(2)
            src = np.concatenate([rng.choice(near, 2), rng.choice(both, 2), qid])
            dst = np.concatenate([qid, qid, rng.choice(near, 2)])
            x = rng.standard_normal((2, G.feature_dim)).astype(np.float32)
            self.requests.append(Request(f"d{i}", qid, x, src, dst))
        full1, full2 = QueryEngine(G, self.model, mode="full"), QueryEngine(self.G2, self.model, mode="full")
        self.want1 = {r.request_id: full1.answer(r).h for r in self.requests}
        self.want2 = {r.request_id: full2.answer(r).h for r in self.requests}

    def config(self) -> ServeConfig:
        return ServeConfig(
            graph=self.g1, model=self.model_path, store=self.root, mode="exact", modes=["exact", "he"], http=None
        )


@pytest.fixture(scope="module")
def setup(skewed, tmp_path_factory):
    return Setup(tmp_path_factory.mktemp("delta"), skewed)


def close(a, b) -> bool:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30)) <= 1e-5


def answers(server: Server, requests, mode: str) -> dict:
    with Client(server.zmq_endpoint) as client:
        return {r.request_id: client.answer(r, mode=mode) for r in requests}


def test_delta_swap_equals_a_fresh_load_and_keeps_the_old_version_whole(setup):
    s = setup
    with Server(s.config()) as server:
        for reply in answers(server, s.requests, "exact").values():
            assert reply.version == 1
        cache = server.pools[0].cache
        old_version = server.versions.take()  # a batch dispatched before the swap, still running
        old = cache.get(old_version.key)
        before = {
            key: {l: a.copy() for l, a in layers.h.items()} for key, layers in old.context.aligned_layers().items()
        }
        report = server.swap(s.g2)
        assert report["changed"] and report["version"] == 2 and report["load"] == "delta", report["loaded"]
        (entry,) = report["loaded"]["main"].values()
        assert entry["rows_patched"] > 0
        new = cache.get(batch_op.spec_key(server.config.deployment()))
        assert new.loaded["how"] == "delta"
        # the patched arrays are a fresh alignment of version 2, byte for byte
        fresh = StoredLayers(PEStore.open(s.root, model=s.model, graph=s.G2), s.G2, s.model, states=True)
        (patched,) = new.context.aligned_layers().values()
        for l in fresh.h:
            assert np.array_equal(patched.h[l], fresh.h[l]) and np.array_equal(patched.state[l], fresh.state[l])
        # EXACT and HE answers equal engines opened on version 2, and say version 2
        for mode in ("exact", "he"):
            engine = QueryEngine(s.G2, s.model, mode=mode, store=s.v2)
            for r in s.requests:
                reply = answers(server, [r], mode)[r.request_id]
                assert reply.version == 2 and close(reply.h, engine.answer(r).h), (mode, r.request_id)
        # the batch taken on version 1 finishes on it: its arrays were never written, its answer is FULL on G1
        for key, layers in old.context.aligned_layers().items():
            assert all(np.array_equal(layers.h[l], before[key][l]) for l in layers.h)
        r = s.requests[0]
        result = batch_op.serve_batch(batch_header(old_version, "exact", [r]), wire.batch_tables([r]), cache)
        assert not wire.read_meta(result)["errors"]
        h = np.asarray(result["answer"].column("h").to_pylist(), np.float32)
        assert close(h, s.want1[r.request_id])
        server.versions.release(old_version)
        assert server.settle(10)


def test_a_large_change_and_a_swap_back_load_whole(setup, monkeypatch):
    s = setup
    monkeypatch.setattr(delta, "DELTA_MAX_FRACTION", 0.0)  # every change is "large"
    with Server(s.config()) as server:
        report = server.swap(s.g2)
        assert report["load"] == "whole"
        (entry,) = report["loaded"]["main"].values()
        assert "changed" in entry["why_not_delta"]
        for reply in answers(server, s.requests, "exact").values():
            assert reply.version == 2
        for rid, reply in answers(server, s.requests, "exact").items():
            assert close(reply.h, s.want2[rid])
        monkeypatch.setattr(delta, "DELTA_MAX_FRACTION", 1.0)
        back = server.swap(s.g1)  # version 1 is no delta over version 2
        assert back["load"] == "whole"
        (entry,) = back["loaded"]["main"].values()
        assert "not a row-level delta" in entry["why_not_delta"]
        for rid, reply in answers(server, s.requests, "exact").items():
            assert reply.version == 3 and close(reply.h, s.want1[rid])


def test_a_layer_compacted_for_its_chain_length_still_patches(skewed, tmp_path):
    from sparkgnn.graph.updates import GraphUpdate
    from sparkgnn.pe import versions

    G = skewed
    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=3))
    model_path, root = str(tmp_path / "model.pt"), str(tmp_path / "store")
    model.save(model_path)
    precompute_local(G, model, root)
    rng = np.random.default_rng(11)
    graphs, stores = [], []
    while not stores or versions.bases(stores[-1].manifest, "layer=1"):  # until a refresh compacts
        update = GraphUpdate(
            edge_insert_src=rng.choice(G.ids, 3),
            edge_insert_dst=rng.choice(G.ids, 3),
            edge_insert_weight=np.ones(3, np.float32),
        )
        out = str(tmp_path / f"g{len(graphs)}")
        store, _ = refresh_local(G, update, model, root, out_graph=out)
        G = read_graph_dir(out)
        graphs.append(out)
        stores.append(store)
        assert len(stores) <= versions.MAX_SEGMENTS  # the chain's bound compacts by then
    assert len(versions.bases(stores[-2].manifest, "layer=1")) + 2 > versions.MAX_SEGMENTS
    qid = int(G.ids.max()) + 100
    x = rng.standard_normal((1, G.feature_dim)).astype(np.float32)
    request = Request("c", np.array([qid]), x, np.concatenate([G.ids[:3], [qid]]), np.array([qid, qid, qid, G.ids[0]]))
    config = ServeConfig(graph=graphs[-2], model=model_path, store=root, mode="exact", modes=["exact"], http=None)
    with Server(config) as server:
        answers(server, [request], "exact")  # the held version aligns its store
        report = server.swap(graphs[-1])
        assert report["load"] == "delta", report["loaded"]
        want = QueryEngine(G, model, mode="exact", store=stores[-1]).answer(request).h
        reply = answers(server, [request], "exact")["c"]
        assert reply.version == 2 and close(reply.h, want)
        assert close(want, QueryEngine(G, model, mode="full").answer(request).h)
