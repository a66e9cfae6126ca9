"""Pool kind "sharded" (serving.online.sharded): S shard owners, each holding only its shard of
the PE store, answer every mode CGP serves exactly as the whole store in one process does
(S = 2, 3, 4); a service mixing a sharded and a replicated pool survives shard workers killed
mid-stream (a hot shard's replica and a lone shard worker) with exact answers; shards over the
memory budget refuse the start naming the numbers; modes and settings a sharded pool cannot
serve are refused at config time."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from serving_testkit import pyg_model

from sparkgnn.graph import write_graph_dir
from sparkgnn.models import Model
from sparkgnn.pe.local import precompute_local
from sparkgnn.serving import QueryEngine
from sparkgnn.serving.online import wire
from sparkgnn.serving.online.batch_op import BATCH_OP
from sparkgnn.serving.online.client import Client, reply_of
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.deployments import SwapRefused
from sparkgnn.serving.online.pools import ServeError
from sparkgnn.serving.online.server import Server
from sparkgnn.serving.online.sharded import SHARDED_MODES, ShardedPool, graph_ids, shard_bytes
from sparkgnn.serving.request import Request


@pytest.fixture(scope="module")
def deployment(skewed_workload, tmp_path_factory):
    """(config kwargs, G, model, store, workload): a 2-layer SAGE on the skewed graph, its store
    with states."""
    d = tmp_path_factory.mktemp("sharded")
    wl = skewed_workload
    G = wl.graph_G
    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=3))
    model.save(str(d / "model.pt"))
    write_graph_dir(G, str(d / "g"))
    store = precompute_local(G, model, str(d / "store"))
    kwargs = {"graph": str(d / "g"), "model": str(d / "model.pt"), "store": str(d / "store")}
    return kwargs, G, model, store, wl


def close(a, b) -> bool:
    return np.abs(a - b).max() <= 1e-5 * max(np.abs(b).max(), 1e-12)


def spec_of(kwargs: dict, **options) -> dict:
    return ServeConfig(**kwargs, mode_options=options).deployment()


def test_shard_bytes_are_what_each_shard_worker_loads(deployment):
    from sparkgnn.serving.cgp_worker import Shard

    kwargs, G, model, store, _ = deployment
    ids = graph_ids(kwargs["graph"])
    estimate = shard_bytes(ids, model, store, 3, True)
    loaded = [Shard(store.base, kwargs["graph"], model, 3, p, True).nbytes for p in range(3)]
    assert estimate == loaded and min(loaded) > 0


@pytest.mark.parametrize("shards", [2, 3, 4])
def test_sharded_answers_equal_the_whole_store_for_every_mode_cgp_serves(deployment, shards):
    """Batches of three requests (HE fuses them into one engine call) through the pool's frames
    (cgp_wire, in-process shards): every answer equals QueryEngine's over the whole store."""
    kwargs, G, model, store, wl = deployment
    pool = ShardedPool("shards", shards=shards, transport="inprocess")
    try:
        key = pool.register(spec_of(kwargs))
        requests = wl.requests[:3]
        for mode in SHARDED_MODES:
            header = {"op": BATCH_OP, "deployment": key, "mode": mode, "requests": [r.request_id for r in requests]}
            tables = pool.call(0, header, wire.batch_tables(requests))
            meta = wire.read_meta(tables)
            assert not meta["errors"], meta["errors"]
            assert meta["breakdown"]["partitions"] >= shards  # summed over the batch's engine calls
            answers = wire.BatchAnswers(tables["answer"], len(requests))
            reference = QueryEngine(G, model, mode=mode, store=store)
            for i, r in enumerate(requests):
                nodes, h, pred = answers.rows(i).arrays()
                want = reference.answer(r)
                np.testing.assert_array_equal(nodes, r.qid)
                assert close(h, want.h), (mode, shards, r.request_id)
                np.testing.assert_array_equal(pred, want.pred)
        executors = [e.mode.executor for e in pool.cache.get(key).engines.values()]
        assert all(e.parts == shards and e.jobs > 0 for e in executors)  # the layers ran over the shards
        with pytest.raises(SwapRefused, match="sharded"):  # one version per sharded pool
            pool.register(spec_of(kwargs, he={"seed": 1}))
    finally:
        pool.close()


def test_a_shard_with_nothing_to_do_is_not_sent_the_job_and_answers_stay_exact(deployment, monkeypatch):
    """Single-query batches over 4 shards: a layer's job skips the shards that own none of its
    edge sources or read targets (cgp_worker.idle_partition), the result built for a skipped shard
    is the one partition_task returns for it, and every answer equals the whole store's."""
    from sparkgnn.serving import cgp_wire, cgp_worker
    from sparkgnn.serving.spark_cgp import edges_of_partition

    kwargs, G, model, store, wl = deployment
    skipped, sent = [], [0]
    idle, handle = cgp_worker.idle_partition, cgp_wire.handle

    def recording_idle(job, p):
        out = idle(job, p)
        if out is not None:
            skipped.append((job, p, out))
        return out

    def counting_handle(header, tables):
        sent[0] += 1
        return handle(header, tables)

    monkeypatch.setattr(cgp_worker, "idle_partition", recording_idle)
    monkeypatch.setattr(cgp_wire, "handle", counting_handle)
    base = int(G.ids.max()) + 1  # one query attached both ways to one G vertex: few shards own its edges
    requests = [Request(f"one{v}", [base], G.x[v : v + 1], [G.ids[v], base], [base, G.ids[v]]) for v in (0, 7, 19)]
    pool = ShardedPool("shards", shards=4, transport="inprocess")
    try:
        key = pool.register(spec_of(kwargs))
        for mode in ("he", "exact"):
            reference = QueryEngine(G, model, mode=mode, store=store)
            for r in requests:
                header = {"op": BATCH_OP, "deployment": key, "mode": mode, "requests": [r.request_id]}
                tables = pool.call(0, header, wire.batch_tables([r]))
                assert not wire.read_meta(tables)["errors"]
                _, h, _ = wire.BatchAnswers(tables["answer"], 1).rows(0).arrays()
                assert close(h, reference.answer(r).h), (mode, r.request_id)
    finally:
        pool.close()
    assert skipped and sent[0] > 0  # some shards were spared a job, others ran theirs
    cfg = {
        "store_base": store.base,
        "graph_dir": os.path.abspath(kwargs["graph"]),
        "model_path": os.path.abspath(kwargs["model"]),
        "parts": 4,
        "states": True,
    }
    for job, p, out in skipped[:20]:
        ran = cgp_worker.partition_task(p, cfg, edges_of_partition(job, p))
        assert sorted(ran) == sorted(out) and ran["input"] is None, (job["kind"], p)
        np.testing.assert_array_equal(ran["input_rows"], out["input_rows"])
        assert [len(ran.get(k, ())) for k in ("states", "index")] == [len(out.get(k, ())) for k in ("states", "index")]
        assert ran.get("partial_bytes") == out.get("partial_bytes")


@pytest.mark.slow
def test_mixed_pools_stay_exact_when_a_shard_worker_is_killed_mid_stream(deployment):
    """Two shards (each its own broker), shard 0 hot with two replicas, next to a replicated
    in-process pool: requests stream in, one replica of shard 0 and the lone worker of shard 1
    are SIGKILLed; every answer is exact, each dead worker is replaced (shard 1's reloads its
    shard) and the sharded pool answers again."""
    kwargs, G, model, store, wl = deployment
    pools = [
        {"name": "shards", "kind": "sharded", "shards": 2, "memory_budget_bytes": 1 << 30, "replicas": [2, 1]},
        {"name": "replica", "kind": "inprocess"},
    ]
    config = ServeConfig(**kwargs, modes=["exact", "he"], mode="exact", pools=pools, http=None)
    reference = QueryEngine(G, model, mode="exact", store=store)
    with Server(config) as server:
        sharded = server.pools[0]
        assert [len(c.workers) for c in sharded.clusters] == [2, 1] and len(sharded.worker_pids()) == 3
        with Client(server.zmq_endpoint, timeout_s=60) as client:
            for r in wl.requests:
                client.send(r, "exact")
            os.kill(sharded.clusters[0].workers[0].pid, signal.SIGKILL)  # mid-stream: a replica of shard 0
            os.kill(sharded.clusters[1].workers[0].pid, signal.SIGKILL)  # and shard 1's only worker
            replies = {}
            while len(replies) < len(wl.requests):
                got = client.receive(60)
                assert got is not None, "a request was never answered after a shard worker died"
                replies[got[0]] = reply_of(got)
            for r in wl.requests:
                assert close(replies[r.request_id].h, reference.answer(r).h), r.request_id
            again = client.answer(wl.requests[0], mode="exact")  # the idle sharded pool takes it
            assert close(again.h, reference.answer(wl.requests[0]).h)
        assert sharded.replaced >= 2 and len(sharded.worker_pids()) == 3
        assert {b["pool"] for b in server.batch_log} >= {"shards"}


def test_shards_over_the_memory_budget_refuse_the_start_naming_the_numbers(deployment):
    kwargs, G, model, store, _ = deployment
    sizes = shard_bytes(graph_ids(kwargs["graph"]), model, store, 2, True)
    budget = max(sizes) - 1
    pools = [{"name": "shards", "kind": "sharded", "shards": 2, "memory_budget_bytes": budget}]
    with pytest.raises(ServeError) as refused:
        Server(ServeConfig(**kwargs, modes=["he", "exact"], pools=pools, http=None))
    text = str(refused.value)
    assert f"memory_budget_bytes {budget}" in text and str(max(sizes)) in text and "3 shards fit" in text
    assert "\n" not in text


@pytest.mark.parametrize(
    "settings, why",
    [
        ({"modes": ["he", "full"]}, "cannot serve mode(s) full"),
        ({"mode": "ns", "modes": ["he"]}, "cannot serve mode(s) ns"),
        ({"modes": ["srpe"], "mode": "srpe", "mode_options": {"srpe": {"policy": "ae"}}}, "'ae' policy"),
        ({"mode_options": {"exact": {"partitions": 2}}}, "may not set partitions"),
        ({"cache": {"policy": "degree", "bytes": 1024}}, "hot cache must be off"),
        ({"follow_store": True}, "follow_store"),
        ({"store": None}, "needs a PE store"),
    ],
)
def test_what_a_sharded_pool_cannot_serve_is_refused_at_config(deployment, settings, why):
    kwargs = dict(deployment[0], **settings)
    pools = [{"name": "shards", "kind": "sharded", "shards": 2}]
    with pytest.raises(ServeError, match="sharded pool 'shards'") as refused:
        ServeConfig(**kwargs, pools=pools).check()
    assert why in str(refused.value)


@pytest.mark.parametrize(
    "pool, why",
    [
        ({"name": "s", "kind": "sharded"}, "needs shards"),
        ({"name": "w", "kind": "workers", "shards": 2}, "shards applies to a 'sharded' pool only"),
        ({"name": "w", "kind": "inprocess", "memory_budget_bytes": 10}, "memory_budget_bytes applies"),
        ({"name": "w", "kind": "workers", "transport": "inprocess"}, "transport must be one of ipc, tcp"),
        ({"name": "s", "kind": "sharded", "shards": 2, "transport": "udp"}, "ipc, tcp, inprocess"),
        ({"name": "s", "kind": "sharded", "shards": 0}, "shards must be >= 1"),
        ({"name": "w", "kind": "workers", "replicas": 2}, "replicas applies to a 'sharded' pool only"),
        ({"name": "s", "kind": "sharded", "shards": 2, "replicas": [2]}, "a list of one such per shard (2 shards)"),
        ({"name": "s", "kind": "sharded", "shards": 2, "replicas": 0}, "replicas must be an integer in 1..64"),
        ({"name": "s", "kind": "sharded", "shards": 2, "replicas": [1, "2"]}, "got [1, '2']"),
    ],
)
def test_malformed_sharded_pool_settings_are_refused(deployment, pool, why):
    with pytest.raises(ServeError) as refused:
        ServeConfig(**deployment[0], pools=[pool]).check()
    assert why in str(refused.value)
