"""A service following a PE store (serving.online.store_follow, `follow_store`): while a refresh
follower (pe/follow.py) commits and publishes versions, every EXACT answer names a version and
equals an engine opened on that committed version's graph and store (never a mix of two), and
the service reaches the last version the follower published. Also the option's checks."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest
from serving_testkit import pyg_model

from sparkgnn.graph import write_graph_dir
from sparkgnn.graph.updates import GraphUpdate
from sparkgnn.models import Model
from sparkgnn.pe import published
from sparkgnn.pe.follow import RefreshFollower
from sparkgnn.pe.local import precompute_local
from sparkgnn.pe.store import PEStore
from sparkgnn.serving import QueryEngine
from sparkgnn.serving.online.client import Client
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.pools import ServeError
from sparkgnn.serving.online.server import Server
from sparkgnn.serving.online.store_follow import StoreFollower
from sparkgnn.serving.request import Request


def close(a, b) -> bool:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30)) <= 1e-5


def requests_near(G, targets: np.ndarray, seed: int) -> list[Request]:
    """Requests whose new query vertices read `targets` (vertices the updates change) and
    others: valid on every version (the updates delete nothing)."""
    rng = np.random.default_rng(seed)
    base = int(G.ids.max()) + 1000
    out = []
    for i in range(4):
        qid = base + 10 * i + np.arange(2)
        src = np.concatenate([rng.choice(targets, 2), rng.choice(G.ids, 2)])
        dst = np.concatenate([qid, qid])
        x = rng.standard_normal((2, G.feature_dim)).astype(np.float32)
        out.append(Request(f"f{i}", qid, x, src, dst))
    return out


def test_answers_follow_the_published_versions_each_whole(skewed, tmp_path):
    G = skewed
    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=3))
    model_path, g1, root = str(tmp_path / "model.pt"), str(tmp_path / "g1"), str(tmp_path / "store")
    inbox, state = str(tmp_path / "in"), str(tmp_path / "state")
    os.makedirs(inbox)
    model.save(model_path)
    write_graph_dir(G, g1)
    precompute_local(G, model, root)
    rng = np.random.default_rng(11)
    targets = G.ids[rng.choice(G.num_nodes, 6, replace=False)]
    updates = [
        GraphUpdate(
            edge_insert_src=rng.choice(G.ids, 20),
            edge_insert_dst=np.concatenate([targets, rng.choice(G.ids, 14)]),
            edge_insert_weight=np.ones(20, np.float32) if G.weight is not None else None,
            feature_update_ids=targets[[k]],
            feature_update_x=rng.standard_normal((1, G.feature_dim)).astype(np.float32),
        )
        for k in range(3)
    ]
    requests = requests_near(G, targets, seed=2)
    config = ServeConfig(
        graph=g1,
        model=model_path,
        store=root,
        mode="exact",
        modes=["exact"],
        http=None,
        follow_store=True,
        follow_interval_s=0.02,
    )
    replies: list = []
    stop = threading.Event()
    with Server(config) as server:
        follower = RefreshFollower(
            graph=G, model=model, store=root, updates=inbox, state=state, max_batch_updates=1, commit_every_s=0
        )
        assert follower.published["graph_fingerprint"] == G.fingerprint  # the version it starts from

        def ask() -> None:
            with Client(server.zmq_endpoint) as client:
                while not stop.is_set():
                    for r in requests:
                        reply = client.answer(r, mode="exact")
                        replies.append((reply.version, r, reply.h))

        asking = threading.Thread(target=ask)
        asking.start()
        try:
            for i, update in enumerate(updates):
                update.write(os.path.join(inbox, f"u{i}.parquet"))
                progress = follower.poll(flush=True)
                assert progress is not None and progress.committed
                assert follower.published["graph_fingerprint"] == follower.graph.fingerprint
                deadline = time.monotonic() + 60
                while server.versions.current.graph_fingerprint != follower.graph.fingerprint:
                    assert time.monotonic() < deadline, server.version_info()
                    time.sleep(0.01)
                seen = len(replies)
                while len(replies) < seen + len(requests):  # some answers on this version
                    assert asking.is_alive() and time.monotonic() < deadline, "the client stopped answering"
                    time.sleep(0.01)
        finally:
            stop.set()
            asking.join(timeout=60)
        info = server.version_info()
        assert info["version"] == 1 + len(updates) and server.store_follower.info()["swaps"] == len(updates)
        graphs = {1: (G, g1)}
        for entry in server.swap_log:
            if entry.get("changed"):
                graphs[entry["version"]] = (published.open_graph(entry["graph"]), entry["graph"])
                assert entry["load"] == "delta", entry  # each worker patched its held version
    assert sorted(graphs) == [1, 2, 3, 4]
    # versions 2-4 came as deltas over the full directory the follower published at its start
    assert [published.is_delta(path) for _g, path in graphs.values()] == [False, True, True, True]
    assert graphs[4][0].fingerprint == follower.graph.fingerprint
    engines = {}
    for number, (graph, _path) in graphs.items():
        store = PEStore.open(root, model=model, graph=graph)
        engines[number] = QueryEngine(graph, model, mode="exact", store=store)
    assert {v for v, _r, _h in replies} == set(graphs)  # every version answered
    for version, request, h in replies:
        assert close(h, engines[version].answer(request).h), (version, request.request_id)
    # the versions differ where the updates reached: a mixed answer would equal none of them
    r = requests[0]
    assert not close(engines[1].answer(r).h, engines[4].answer(r).h)
    # and the last version's answers equal FULL on the updated graph, read from no store
    full = QueryEngine(graphs[4][0], model, mode="full")
    last = [(r, h) for version, r, h in replies if version == 4]
    assert last and all(close(h, full.answer(r).h) for r, h in last)


def test_follow_store_needs_a_store_and_a_positive_interval(tmp_path):
    with pytest.raises(ServeError, match="follow_store needs a PE store"):
        ServeConfig(graph="g", model="m", follow_store=True).check()
    with pytest.raises(ServeError, match="follow_interval_s must be a finite number > 0"):
        ServeConfig(graph="g", model="m", store="s", follow_store=True, follow_interval_s=0.0).check()
    with pytest.raises(ServeError, match="follow_store must be true or false"):
        ServeConfig(graph="g", model="m", store="s", follow_store="yes").check()  # type: ignore[arg-type]


class _Versions:
    """A VersionManager stand-in: serves one fingerprint, refuses or records swaps."""

    def __init__(self, fingerprint: str, refuse: bool):
        from sparkgnn.serving.online.deployments import SwapRefused

        self.current = type("V", (), {"graph_fingerprint": fingerprint})()
        self.refuse, self.calls, self._refused = refuse, [], SwapRefused

    def swap(self, graph, store, timeout_s):
        self.calls.append(graph)
        if self.refuse:
            raise self._refused("swap refused: a test")
        self.current.graph_fingerprint = os.path.basename(graph)
        return {"changed": True, "version": 2, "load": "whole", "seconds": 0.0}


def test_a_refused_publication_is_retried_only_after_a_while(skewed, tmp_path, monkeypatch):
    from sparkgnn.pe import published
    from sparkgnn.serving.online import store_follow

    root = str(tmp_path / "store")
    published.publish(root, skewed, store_base=os.path.join(root, "v"))
    refusing = _Versions("0" * 16, refuse=True)
    follower = StoreFollower(refusing, root, 0.01, threading.Event())
    assert follower.check() is None and follower.check() is None
    assert len(refusing.calls) == 1 and follower.refusals == 1 and "a test" in follower.last_error
    monkeypatch.setattr(store_follow, "RETRY_S", 0.0)
    assert follower.check() is None and len(refusing.calls) == 2
    swapping = _Versions("0" * 16, refuse=False)
    follower = StoreFollower(swapping, root, 0.01, threading.Event())
    assert follower.check()["changed"] and follower.check() is None  # served now: nothing more to do
    assert swapping.calls == [published.graph_dir(root, skewed.fingerprint)] and follower.swaps == 1
    assert StoreFollower(swapping, str(tmp_path / "none"), 0.01, threading.Event()).check() is None


def test_an_unchanged_publication_is_not_read_again(skewed, tmp_path, monkeypatch):
    from sparkgnn.pe import published
    from sparkgnn.serving.online import store_follow  # noqa: F401 - the module whose reads are counted

    root = str(tmp_path / "store")
    published.publish(root, skewed, store_base=os.path.join(root, "v"))
    versions = _Versions(skewed.fingerprint, refuse=False)  # serves the published graph already
    follower = StoreFollower(versions, root, 0.01, threading.Event())
    reads = []
    real_latest = published.latest
    monkeypatch.setattr(published, "latest", lambda r: reads.append(r) or real_latest(r))
    assert follower.check() is None and follower.check() is None and follower.check() is None
    assert len(reads) == 1  # the first check read it; the file is unchanged since
    versions.current.graph_fingerprint = "f" * 16  # swapped away by hand: read again, swapped back
    assert follower.check()["changed"] and len(reads) == 2
    latest_path = os.path.join(published.published_dir(root), published.LATEST_FILE)
    record = published.latest(root)
    os.replace(latest_path, latest_path + ".old")  # a new publication: a new file (inode)
    with open(latest_path, "w") as fh:
        json.dump(dict(record, graph_fingerprint="e" * 16, graph=os.path.join(root, "e" * 16)), fh)
    assert follower.check()["changed"] and versions.calls[-1] == os.path.join(root, "e" * 16)


def test_checks_come_at_once_after_a_swap_then_fast_for_a_while_then_at_the_interval(monkeypatch):
    from sparkgnn.serving.online import store_follow

    follower = StoreFollower(_Versions("0" * 16, refuse=False), "unused", 0.5, threading.Event())
    assert follower.next_wait(swapped=False) == 0.5  # nothing swapped yet: the interval
    follower._changed_at = time.monotonic()
    assert follower.next_wait(swapped=True) == 0.0  # a version published while it swapped
    assert follower.next_wait(swapped=False) == store_follow.FAST_S  # a stream of publications
    monkeypatch.setattr(store_follow, "FAST_FOR_S", 0.0)
    assert follower.next_wait(swapped=False) == 0.5  # a quiet window: back to the interval
    fast = StoreFollower(_Versions("0" * 16, refuse=False), "unused", 0.001, threading.Event())
    fast._changed_at = time.monotonic()
    monkeypatch.setattr(store_follow, "FAST_FOR_S", 60.0)
    assert fast.next_wait(swapped=False) == 0.001  # never slower than the configured interval
