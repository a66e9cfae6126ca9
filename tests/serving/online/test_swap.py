"""Server.swap: a running service moves from one (graph, PE store) version to the next without a
restart. Version 1 is a precompute of the skewed graph, version 2 the store refresh_local commits
for an updated graph (same store root). The service answers version 1 exactly, then, after a
swap, the updated graph exactly (EXACT = FULL on it, HE = HE on it); a swap to a store of another
model or graph, to a damaged store or to a missing graph is refused by name and the old version
keeps serving; requests in flight across a swap are all answered, each wholly by one version;
the replaced version is dropped from the workers' caches once no batch uses it; the swap is in
the stats and reachable through the HTTP admin path (token only) and `sparkgnn-serve swap`."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from serving_testkit import pyg_model

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "pe"))
from test_refresh import random_update  # noqa: E402

from sparkgnn.graph import write_graph_dir  # noqa: E402
from sparkgnn.graph.reader import read_graph_dir  # noqa: E402
from sparkgnn.graph.updates import apply  # noqa: E402
from sparkgnn.models import Model  # noqa: E402
from sparkgnn.pe.local import precompute_local  # noqa: E402
from sparkgnn.pe.refresh import refresh_local  # noqa: E402
from sparkgnn.serving import QueryEngine  # noqa: E402
from sparkgnn.serving.online import batch_op  # noqa: E402
from sparkgnn.serving.online.cli import main  # noqa: E402
from sparkgnn.serving.online.client import Client, ServiceError  # noqa: E402
from sparkgnn.serving.online.config import ServeConfig  # noqa: E402
from sparkgnn.serving.online.server import Server, SwapRefused  # noqa: E402
from sparkgnn.serving.request import Request  # noqa: E402


class Versions:
    """Paths, graphs, the model, the two store versions and requests valid on both graphs."""

    def __init__(self, d, G):
        self.d = d
        self.G = G
        self.model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=3))
        self.model_path = str(d / "model.pt")
        self.model.save(self.model_path)
        self.g1, self.g2, self.root = str(d / "g1"), str(d / "g2"), str(d / "store")
        write_graph_dir(G, self.g1)
        self.v1 = precompute_local(G, self.model, self.root)
        update = random_update(G, seed=5)
        self.v2, _ = refresh_local(G, update, self.model, self.root, out_graph=self.g2)
        self.G2 = read_graph_dir(self.g2)
        # requests valid on both graphs, their queries next to what the update changed
        touched = np.concatenate([update.edge_insert_dst, update.edge_delete_dst, update.feature_update_ids])
        both = np.intersect1d(self.G.ids, self.G2.ids)
        near = np.intersect1d(touched, both)
        self.requests = _requests(near, both, int(max(self.G.ids.max(), self.G2.ids.max())) + 1000, G.feature_dim)
        self.full1 = QueryEngine(G, self.model, mode="full")
        self.full2 = QueryEngine(self.G2, self.model, mode="full")
        self.want = {1: {}, 2: {}}
        for r in self.requests:
            self.want[1][r.request_id] = self.full1.answer(r).h
            self.want[2][r.request_id] = self.full2.answer(r).h
        # the update changes the answers (else a swap could not be told from no swap)
        assert max(_rel(self.want[1][k], self.want[2][k]) for k in self.want[1]) > 1e-2

    def config(self, **overrides) -> ServeConfig:
        kwargs = {"graph": self.g1, "model": self.model_path, "store": self.root, "mode": "exact", **overrides}
        return ServeConfig(**kwargs)


def _requests(near, both, base, width, count=12, seed=7) -> list[Request]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        b = int(rng.integers(1, 3))
        qid = base + 10 * i + np.arange(b)
        src = np.concatenate([rng.choice(near, b), rng.choice(both, b), qid])
        dst = np.concatenate([qid, qid, rng.choice(near, b)])
        x = rng.standard_normal((b, width)).astype(np.float32)
        out.append(Request(f"s{i}", qid, x, src, dst))
    return out


def _rel(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def close(a, b) -> bool:
    return _rel(a, b) <= 1e-5


@pytest.fixture(scope="module")
def versions(skewed, tmp_path_factory):
    return Versions(tmp_path_factory.mktemp("swap"), skewed)


def answers(server: Server, requests, mode: str | None = None) -> dict:
    """request id -> Reply, through the ZeroMQ front."""
    with Client(server.zmq_endpoint) as client:
        return {r.request_id: client.answer(r, mode=mode) for r in requests}


def check_version(server: Server, v: Versions, number: int, graph: int | None = None) -> None:
    """Every request is answered by version `number`, exactly as FULL on graph 1 or 2 (`graph`;
    default: the version's number)."""
    for rid, reply in answers(server, v.requests).items():
        assert reply.version == number
        assert close(reply.h, v.want[graph or number][rid]), (number, rid)


def test_swap_serves_the_refreshed_version_exactly_and_drops_the_old_one(versions):
    v = versions
    with Server(v.config()) as server:
        check_version(server, v, 1)
        cache = server.pools[0].cache  # the in-process pool's loaded deployments
        old_key = batch_op.spec_key(server.config.deployment())
        assert old_key in cache.keys()
        report = server.swap(v.g2)  # the store: the same root, the updated graph's version
        assert report["changed"] and report["version"] == 2 and report["store"] == v.root
        assert report["graph_fingerprint"] == v.v2.manifest["graph_fingerprint"]
        assert report["previous"]["graph_fingerprint"] == v.v1.manifest["graph_fingerprint"]
        assert list(report["warmed"]) == ["main"]
        new_key = batch_op.spec_key(server.config.deployment())
        # warmed before the switch: every served mode's engine is built already
        assert new_key in cache.keys() and set(cache.get(new_key).engines) == set(server.config.modes)
        check_version(server, v, 2)
        he = QueryEngine(v.G2, v.model, mode="he", store=v.v2)
        for rid, reply in answers(server, v.requests[:4], mode="he").items():
            r = next(r for r in v.requests if r.request_id == rid)
            assert close(reply.h, he.answer(r).h)
        assert server.settle(10)
        assert old_key not in cache.keys() and new_key in cache.keys()
        assert server.stats["swaps"] == 1 and server.stats["version"] == 2 and server.stats["evicted"] == 1
        assert server.stats["graph_fingerprint"] == v.v2.manifest["graph_fingerprint"]
        info = server.version_info()
        assert info["version"] == 2 and info["draining"] == [] and info["evicting"] == []
        # a swap to what is served already changes nothing
        assert server.swap(v.g2, v.root)["changed"] is False
        # and back: version 3 is the first graph again
        assert server.swap(v.g1)["version"] == 3
        check_version(server, v, 3, graph=1)
        assert server.settle(10) and new_key not in cache.keys()


def test_a_store_version_folder_swaps_within_its_root(versions):
    """Configured with version 1's own folder, a swap without a store looks in that folder's root."""
    v = versions
    with Server(v.config(store=v.v1.base, http=None)) as server:
        check_version(server, v, 1)
        assert server.swap(v.g2)["store"] == v.root
        check_version(server, v, 2)


def test_a_fap_hot_cache_swaps_to_a_refreshed_version(versions, tmp_path):
    """A refreshed store version keeps its workload metrics (pe.refresh), so a deployment whose hot
    cache ranks rows by FAP swaps to it and answers it exactly."""
    v = versions
    root = str(tmp_path / "with_metrics")
    precompute_local(v.G, v.model, root, metrics=True)
    update = random_update(v.G, seed=5)  # the update that made v.g2
    refreshed, _ = refresh_local(v.G, update, v.model, root)
    assert "fap" in refreshed.metric_tables
    config = v.config(store=root, cache={"policy": "fap", "bytes": 1 << 16}, http=None)
    with Server(config) as server:
        report = server.swap(v.g2)
        assert report["changed"] and report["version"] == 2
        check_version(server, v, 2)


def test_refused_swaps_name_the_reason_and_the_old_version_keeps_serving(versions, tmp_path):
    v = versions
    other = Model.from_pyg(pyg_model("sage", v.G.feature_dim, 2, seed=4))  # same architecture, other weights
    other_store = str(tmp_path / "other-store")
    precompute_local(v.G2, other, other_store)
    g3 = str(tmp_path / "g3")  # a graph no store holds PEs for
    write_graph_dir(apply(random_update(v.G, seed=6), v.G).graph, g3)
    damaged = str(tmp_path / "damaged")  # version 2 with one byte changed (sizes agree, checksums not)
    shutil.copytree(v.root, damaged)
    layer = os.path.join(damaged, os.path.relpath(v.v2.base, v.root))
    part = next(
        os.path.join(dirpath, name)
        for dirpath, _, names in sorted(os.walk(layer))
        for name in sorted(names)
        if name.endswith(".parquet") and "layer=" in dirpath
    )
    with open(part, "r+b") as f:
        f.seek(os.path.getsize(part) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with Server(v.config(http=None)) as server:
        check_version(server, v, 1)
        for graph, store, words in [
            (v.g2, other_store, "model weights differ"),
            (g3, None, "graph fingerprint differs"),
            (str(tmp_path / "nope"), None, "nope"),
            (v.g2, damaged, "damaged"),  # passes the front end's size check, fails on the worker
        ]:
            with pytest.raises(SwapRefused, match=words) as info:
                server.swap(graph, store)
            assert "still serving version 1" in str(info.value)
            check_version(server, v, 1)
        assert server.stats["swaps"] == 0 and server.stats["swaps_refused"] == 4
        assert server.stats["version"] == 1
        assert server.settle(10)
        damaged_key = batch_op.spec_key(server.config.deployment(v.g2, damaged))
        assert damaged_key not in server.pools[0].cache.keys()
        assert server.swap(v.g2)["version"] == 2  # the refusals left nothing behind
        check_version(server, v, 2)


@pytest.mark.parametrize("width", [1, 2])
def test_requests_in_flight_across_a_swap_are_all_answered_each_by_one_version(versions, width):
    v = versions
    pools = [{"name": "main", "kind": "inprocess", "width": width}]
    with Server(v.config(http=None, pools=pools)) as server:
        before = [Request(f"a{i}-{r.request_id}", r.qid, r.x, r.src, r.dst) for i in range(3) for r in v.requests]
        futures = [server.submit(r) for r in before]
        futures[0].result(timeout=30)  # the service is answering version 1 when the swap starts
        report = server.swap(v.g2)
        after = [Request(f"b-{r.request_id}", r.qid, r.x, r.src, r.dst) for r in v.requests]
        futures += [server.submit(r) for r in after]
        outcomes = [f.result(timeout=60) for f in futures]
        seen = set()
        for r, outcome in zip(before + after, outcomes, strict=True):
            assert outcome.kind == "ok", outcome.error
            seen.add(outcome.version)
            base = r.request_id.split("-", 1)[1]
            assert close(wire_h(outcome), v.want[outcome.version][base]), (r.request_id, outcome.version)
        assert all(o.version == 2 for o in outcomes[len(before) :])  # dispatched after the switch
        assert seen == {1, 2}
        assert report["version"] == 2
        assert server.settle(10)
        assert server.stats["answered"] >= len(futures)


def wire_h(outcome) -> np.ndarray:
    return outcome.answer.arrays()[1]


def test_a_version_is_dropped_only_when_its_last_batch_ends(versions):
    """A batch dispatched on version 1 (taken as a dispatch thread takes it) keeps version 1
    loaded across the swap; its end lets the evictor drop it."""
    v = versions
    with Server(v.config(http=None)) as server:
        old_key = batch_op.spec_key(server.config.deployment())
        batch = server.versions.take()
        server.swap(v.g2)
        info = server.version_info()
        assert info["version"] == 2 and info["draining"] == [{"version": 1, "batches_in_flight": 1}]
        assert not server.settle(0.3)
        assert old_key in server.pools[0].cache.keys()
        server.versions.release(batch)
        assert server.settle(10)
        assert old_key not in server.pools[0].cache.keys()


def _post(url: str, body: dict, token: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_http_admin_swap_needs_the_token_and_the_cli_drives_it(versions, capsys, monkeypatch):
    v = versions
    monkeypatch.delenv("SPARKGNN_SERVE_TOKEN", raising=False)
    with Server(v.config()) as server:  # loopback, no token: answering is open, admin is not
        code, body = _post(f"{server.http_url}/v1/admin/swap", {"graph": v.g2})
        assert code == 403 and "token" in body["error"]
        assert server.stats["version"] == 1
    with Server(v.config(token="s3cret", admin_token="adm1n", swap_roots=[str(v.d)])) as server:
        url = server.http_url
        assert _post(f"{url}/v1/admin/swap", {"graph": v.g2})[0] == 401
        assert _post(f"{url}/v1/admin/swap", {"graph": v.g2}, token="wrong")[0] == 401
        assert _post(f"{url}/v1/admin/swap", {"graph": v.g2}, token="s3cret")[0] == 401  # the inference token
        code, body = _post(f"{url}/v1/admin/swap", {"graph": 7}, token="adm1n")
        assert code == 400 and "graph" in body["error"]
        code, body = _post(f"{url}/v1/admin/swap", {"graph": v.g2, "stor": v.root}, token="adm1n")
        assert code == 400 and "stor" in body["error"]
        code, body = _post(f"{url}/v1/admin/swap", {"graph": v.g1, "store": str(v.d / "nope")}, token="adm1n")
        assert code == 409 and "refused" in body["error"] and server.stats["version"] == 1

        # requests keep flowing while a swap runs on the front's event loop's executor
        stop = threading.Event()
        errors: list = []

        def ask():
            with Client(url, token="s3cret") as client:
                while not stop.is_set():
                    try:
                        client.answer(v.requests[0])
                    except ServiceError as exc:  # pragma: no cover - reported below
                        errors.append(exc)

        asker = threading.Thread(target=ask)
        asker.start()
        try:
            report = Client(url, token="adm1n").swap(v.g2)
        finally:
            stop.set()
            asker.join()
        assert not errors and report["version"] == 2
        with urllib.request.urlopen(
            urllib.request.Request(f"{url}/v1/health", headers={"Authorization": "Bearer s3cret"}), timeout=10
        ) as response:
            health = json.loads(response.read())
        assert health["stats"]["swaps"] == 1 and health["version"]["version"] == 2
        assert health["version"]["graph_fingerprint"] == v.v2.manifest["graph_fingerprint"]
        reply = Client(url, token="s3cret").answer(v.requests[1])
        assert reply.version == 2 and close(reply.h, v.want[2][v.requests[1].request_id])

        # the command line: the report as JSON, a refusal as one line
        monkeypatch.setenv("SPARKGNN_SERVE_ADMIN_TOKEN", "adm1n")
        assert main(["swap", "--url", url, "--graph", v.g1]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["version"] == 3 and printed["graph"] == v.g1
        assert main(["swap", "--url", url, "--graph", str(v.d / "missing")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("sparkgnn-serve: error: swap refused") and "swap_roots" in err[0]
        monkeypatch.delenv("SPARKGNN_SERVE_ADMIN_TOKEN")
        assert main(["swap", "--url", url, "--graph", v.g2]) == 2  # no token
        assert "token" in capsys.readouterr().err
        check_version(server, v, 3, graph=1)


@pytest.mark.slow
def test_two_worker_processes_swap_load_and_drop_on_every_worker(versions):
    v = versions
    pools = [{"name": "workers", "kind": "workers", "width": 2, "threads": 1}]
    with Server(v.config(http=None, pools=pools)) as server:
        pool = server.pools[0]
        check_version(server, v, 1)
        old_key = batch_op.spec_key(server.config.deployment())
        in_flight = [Request(f"a-{r.request_id}", r.qid, r.x, r.src, r.dst) for r in v.requests * 2]
        futures = [server.submit(r) for r in in_flight]
        report = server.swap(v.g2)
        assert report["warmed"]["workers"] == sorted(pool.worker_pids())
        for r, future in zip(in_flight, futures, strict=True):
            outcome = future.result(timeout=60)
            assert outcome.kind == "ok", outcome.error
            assert close(wire_h(outcome), v.want[outcome.version][r.request_id[2:]])
        new_key = batch_op.spec_key(server.config.deployment())
        check_version(server, v, 2)
        assert server.settle(30)
        held, missing = pool.broadcast({"op": batch_op.EVICT_OP, "retire": []}, {}, 30.0)
        assert not missing and sorted(held) == sorted(pool.worker_pids())
        from sparkgnn.serving.online.wire import read_meta

        for result in held.values():
            cached = read_meta(result)["held"]
            assert new_key in cached and old_key not in cached
        with pytest.raises(SwapRefused, match="still serving version 2"):
            server.swap(v.g1, str(v.d / "no-such-store"))
        check_version(server, v, 2)
