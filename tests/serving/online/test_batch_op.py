"""sparkgnn.serving.online.batch_op.DeploymentCache: a worker's loaded deployments are its own
object (no module state): bounded in bytes, least recently used first out, never dropping one a
batch still answers from; retirement keeps what is still served and waits for a batch in use;
two workers in one process (dl_ops.WorkerOps, one per handler) hold separate caches. A
Deployment asked for one mode's engine by two threads at once builds it once."""

from __future__ import annotations

import pytest

from sparkgnn.serving import served
from sparkgnn.serving.online import batch_op

SPEC = {"graph": "g", "model": "m", "store": None, "options": {}, "cache": {}}


@pytest.fixture
def key():
    """SPEC served by this process while the test runs (its id)."""
    key = served.register(SPEC)
    try:
        yield key
    finally:
        while served.serves(key):
            served.withdraw(key)


def test_retire_keeps_a_served_deployment_and_waits_for_a_batch_in_use(key):
    cache = batch_op.DeploymentCache()
    loaded = object()
    cache.put(key, loaded, 0)  # type: ignore[arg-type]  # stands for a loaded one
    with cache.using(key) as dep:
        assert dep is loaded
        kept = cache.retire([key])  # still served: retirement cannot take it away
        assert kept["kept"] == [key] and key in cache.keys()
        served.withdraw(key)
        done = cache.retire([key])
        assert done["deferred"] == [key] and key in cache.keys()
    assert key not in cache.keys()  # dropped when its batch ended
    cache.put(key, object(), 0)  # type: ignore[arg-type]
    assert cache.retire([key])["evicted"] == [key] and cache.keys() == []


def test_the_cache_is_bounded_in_bytes_least_recently_used_first_never_one_in_use():
    keys = [served.register(dict(SPEC, graph=f"g{i}")) for i in range(3)]
    cache = batch_op.DeploymentCache(max_bytes=lambda: 250)
    try:
        assert cache.put(keys[0], object(), 100) == [] and cache.put(keys[1], object(), 100) == []  # type: ignore[arg-type]
        with cache.using(keys[0]):  # a batch still answers from the oldest: it stays
            dropped = cache.put(keys[2], object(), 100)  # type: ignore[arg-type]
        assert dropped == [keys[1]] and cache.keys() == sorted([keys[0], keys[2]])
        cache.put(keys[1], object(), 300)  # type: ignore[arg-type]  # alone over the bound: kept, the rest out
        assert cache.keys() == [keys[1]]
    finally:
        for k in keys:
            served.withdraw(k)


def test_two_workers_of_one_process_hold_separate_caches(key):
    from sparkgnn.serving.dl_ops import WorkerOps

    first, second = WorkerOps(), WorkerOps()
    first.cache.put(key, object(), 0)  # type: ignore[arg-type]
    assert first.cache.keys() == [key] and second.cache.keys() == []
    ops = second.registry()
    served.withdraw(key)
    header = {"op": batch_op.EVICT_OP, "retire": [key]}
    ops.lookup(batch_op.EVICT_OP)(None, header, {})  # the second worker's eviction: its own cache
    assert first.cache.keys() == [key]
    first.registry().lookup(batch_op.EVICT_OP)(None, header, {})
    assert first.cache.keys() == []


def test_a_batch_checked_against_the_deployment_graph_is_not_validated_again():
    import numpy as np

    from sparkgnn.serving.modes import Answer
    from sparkgnn.serving.online.costs import GraphFacts
    from sparkgnn.serving.request import Request

    class Engine:  # answers every query with its own id as the embedding
        def answer(self, request):
            h = request.qid.astype(np.float32)[:, None]
            return Answer(request.qid, h, None, {"calls": 1})

    dep = batch_op.Deployment.__new__(batch_op.Deployment)  # a loaded deployment without files
    dep.graph = GraphFacts(np.arange(5), np.zeros(5), np.ones(5), feature_dim=2, num_layers=2)
    dep.engines, dep.fresh_base = {"exact": Engine()}, 5
    unknown = Request("bad", np.array([7]), np.ones((1, 2), np.float32), np.array([99]), np.array([7]))
    results, _ = dep.answer("exact", [unknown])
    assert results[0][0] is None and "neither a query nor a vertex" in results[0][1]
    results, breakdown = dep.answer("exact", [unknown], checked=True)  # the caller vouches: no second check
    assert results[0][1] is None and results[0][0].qid.tolist() == [7] and breakdown == {"calls": 1}


def test_fused_requests_get_fresh_query_ids_each_and_keep_their_graph_endpoints():
    import numpy as np

    from sparkgnn.serving.request import Request

    dep = batch_op.Deployment.__new__(batch_op.Deployment)
    dep.fresh_base = 100
    x = np.ones((2, 1), np.float32)
    a = Request("a", np.array([7, 5]), x, np.array([5, 1, 7]), np.array([7, 5, 2]))  # 7 <- 5 <- 1, 7 -> 2
    b = Request("b", np.array([5]), x[:1], np.array([3]), np.array([5]))  # the same query id as a's, apart
    fused = dep._fused([a, b])
    assert fused.qid.tolist() == [100, 101, 102]
    assert fused.src.tolist() == [101, 1, 100, 3] and fused.dst.tolist() == [100, 101, 2, 102]


def test_two_threads_asking_for_a_new_engine_at_once_get_one_built_once(skewed, tmp_path, monkeypatch):
    import threading
    import time

    from serving_testkit import pyg_model

    from sparkgnn.graph import write_graph_dir
    from sparkgnn.models import Model
    from sparkgnn.serving import engine

    write_graph_dir(skewed, str(tmp_path / "g"))
    Model.from_pyg(pyg_model("sage", skewed.feature_dim, 2)).save(str(tmp_path / "model.pt"))
    dep = batch_op.Deployment(dict(SPEC, graph=str(tmp_path / "g"), model=str(tmp_path / "model.pt")))
    built = []

    class SlowEngine(engine.QueryEngine):  # a build long enough for the other thread to ask meanwhile
        def __init__(self, *args, **kwargs):
            built.append(self)
            time.sleep(0.3)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(engine, "QueryEngine", SlowEngine)
    start, got = threading.Barrier(2), []

    def ask() -> None:
        start.wait(timeout=30)
        got.append(dep.engine("full"))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(built) == 1 and got == [built[0], built[0]] and dep.context is built[0].context
