"""The online service end to end: a real Server (ZeroMQ + HTTP fronts, GSM scheduler, pools)
answers what QueryEngine.answer answers, for every mode, through both protocols, in one process
and with two sparkgnn-worker processes; bad requests get clear errors and the service lives on;
a full queue answers BUSY; a worker killed mid-request costs no answer."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request

import numpy as np
import pytest
from serving_testkit import pyg_model

from sparkgnn.graph import write_graph_dir
from sparkgnn.messenger import protocol
from sparkgnn.models import Model
from sparkgnn.pe.local import precompute_local
from sparkgnn.serving import QueryEngine
from sparkgnn.serving.online.client import Client, ServiceError, reply_of
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.server import Server
from sparkgnn.serving.request import Request

MODES = ["full", "ns", "he", "srpe", "exact"]


@pytest.fixture(scope="module")
def deployment(skewed_workload, tmp_path_factory):
    """(config kwargs, G, model, store, workload) for a 2-layer SAGE on the skewed graph."""
    d = tmp_path_factory.mktemp("online")
    wl = skewed_workload
    G = wl.graph_G
    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=3))
    model.save(str(d / "model.pt"))
    write_graph_dir(G, str(d / "g"))
    store = precompute_local(G, model, str(d / "store"))
    kwargs = {"graph": str(d / "g"), "model": str(d / "model.pt"), "store": str(d / "store"), "modes": MODES}
    return kwargs, G, model, store, wl


def close(a, b) -> bool:
    return np.abs(a - b).max() <= 1e-5 * max(np.abs(b).max(), 1e-12)


def check_modes(server: Server, G, model, store, requests) -> None:
    for mode in MODES:
        reference = QueryEngine(G, model, mode=mode, store=store)
        for endpoint in (server.zmq_endpoint, server.http_url):
            with Client(endpoint) as client:
                for r in requests:
                    got, want = client.answer(r, mode=mode), reference.answer(r)
                    np.testing.assert_array_equal(got.nodes, r.qid)
                    assert close(got.h, want.h), (mode, endpoint)
                    np.testing.assert_array_equal(got.pred, want.pred)


def test_in_process_service_equals_query_engine(deployment):
    kwargs, G, model, store, wl = deployment
    with Server(ServeConfig(**kwargs)) as server:
        check_modes(server, G, model, store, wl.requests[:2])


@pytest.mark.slow
def test_two_worker_processes_equal_query_engine_and_survive_a_killed_worker(deployment):
    """Over transport "tcp" (loopback ports any local user can reach): the pool's broker and
    workers run on tcp with the run's CURVE keys (the ipc route is what test_swap's pool takes)."""
    kwargs, G, model, store, wl = deployment
    pools = [{"name": "workers", "kind": "workers", "width": 2, "threads": 1, "transport": "tcp"}]
    with Server(ServeConfig(**kwargs, pools=pools)) as server:
        cluster = server.pools[0].cluster
        assert cluster.front.startswith("tcp://127.0.0.1:") and cluster.keys_dir is not None
        check_modes(server, G, model, store, wl.requests[:2])
        reference = QueryEngine(G, model, mode="exact", store=store)
        with Client(server.zmq_endpoint, timeout_s=60) as client:
            for r in wl.requests:
                client.send(r, "exact")
            os.kill(server.pools[0].cluster.workers[0].pid, signal.SIGKILL)  # mid-stream
            replies = {}
            while len(replies) < len(wl.requests):
                got = client.receive(60)
                assert got is not None, "a request was never answered after a worker died"
                replies[got[0]] = reply_of(got)
            for r in wl.requests:
                assert close(replies[r.request_id].h, reference.answer(r).h)
            # the service keeps serving (the pool replaced its dead worker)
            again = client.answer(wl.requests[0], mode="exact")
            assert close(again.h, reference.answer(wl.requests[0]).h)


@pytest.mark.parametrize("t_s", [0, 1])
def test_many_requests_in_flight_are_batched_and_exact(deployment, t_s):
    """With one slot and many requests queued at once, HE batches hold several requests, fused
    into one call, each still answered exactly as alone. t_s = 1 divides every batch into
    one-request sub-batches (with a single slot: each waits for the one before it). EXACT is not
    fusable: each request is its own call, replied to when it is answered."""
    kwargs, G, model, store, wl = deployment
    requests = [
        Request(f"q{i}", r.qid, r.x, r.src, r.dst) for i, r in enumerate(wl.requests * 4)
    ]  # same query ids in different requests: fusion must renumber them apart
    with Server(ServeConfig(**kwargs, t_d=1e9, t_s=t_s)) as server:
        for mode in ("he", "exact"):
            reference = QueryEngine(G, model, mode=mode, store=store)
            with Client(server.zmq_endpoint) as client:
                for r in requests:
                    client.send(r, mode)
                replies = {}
                while len(replies) < len(requests):
                    got = client.receive(30)
                    assert got is not None
                    replies[got[0]] = reply_of(got)
            for r in requests:
                assert close(replies[r.request_id].h, reference.answer(r).h), mode
            sizes = {x.batch_requests for x in replies.values()}
            if mode == "exact":  # answered request by request inside a call: one per call, no waiting on others
                assert sizes == {1}
            elif t_s == 0:
                assert max(sizes) > 1, mode


def test_bad_requests_get_clear_errors_and_the_service_lives_on(deployment):
    kwargs, G, model, store, wl = deployment
    r = wl.requests[0]
    d = G.feature_dim
    unknown = Request("unknown", r.qid, r.x, np.array([10**12]), r.qid[:1])
    wide = Request("wide", r.qid, np.zeros((r.batch_size, d + 1), np.float32), r.src, r.dst)
    nan = Request("nan", r.qid, np.full_like(r.x, np.nan), r.src, r.dst)
    collide = Request("collide", G.ids[:1], r.x[:1], np.zeros(0, np.int64), np.zeros(0, np.int64))
    big = Request("big", np.arange(10**9, 10**9 + 9), np.zeros((9, d), np.float32), np.zeros(0), np.zeros(0))
    with Server(ServeConfig(**kwargs, max_queries=8)) as server:
        with Client(server.zmq_endpoint) as client:
            for bad, words in [
                (unknown, "neither a query nor a vertex"),
                (wide, "width"),
                (nan, "NaN"),
                (collide, "already vertex ids"),
                (big, "at most 8"),
            ]:
                with pytest.raises(ServiceError, match=words):
                    client.answer(bad)
            with pytest.raises(ServiceError, match="mode 'nope' is not served"):
                client.answer(r, mode="nope")
            # frames that are not the protocol at all
            client._sock.send_multipart([b"not json", b"x"])
            got = client.receive(10)
            assert got is not None and got[1]["kind"] == "ERROR"
            # a nodes table without x
            import pyarrow as pa

            client._sock.send_multipart(
                protocol.encode({"kind": "TASK", "request_id": "nox"}, {"nodes": pa.table({"node": [1]})})
            )
            got = client.receive(10)
            assert got[1]["kind"] == "ERROR" and "no column 'x'" in got[1]["error"]
            reference = QueryEngine(G, model, mode="he", store=store)
            assert close(client.answer(r).h, reference.answer(r).h)  # still serving
        body = json.dumps({"nodes": [{"id": 1}]}).encode()
        req = urllib.request.Request(f"{server.http_url}/v1/answer", body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        assert info.value.code == 400 and "missing key 'x'" in json.loads(info.value.read())["error"]
        assert server.stats["errors"] >= 7


def test_full_queue_answers_busy(deployment):
    kwargs, *_, wl = deployment
    server = Server(ServeConfig(**kwargs, capacity=1, http=None), start_pools=False)  # nothing drains it
    first = server.submit(wl.requests[0])
    second = server.submit(wl.requests[1])
    assert not first.done()
    outcome = second.result(timeout=5)
    assert outcome.kind == "busy" and "capacity" in outcome.error
    server.scheduler.close()


def test_http_token_and_loopback_rules(deployment):
    kwargs, G, model, store, wl = deployment
    from sparkgnn.serving.online.pools import ServeError

    with pytest.raises(ServeError, match="token"):
        Server(ServeConfig(**kwargs, http="0.0.0.0:0"), start_pools=False)
    with pytest.raises(ServeError, match="HTTPS"):  # a token off loopback travels only over TLS
        Server(ServeConfig(**kwargs, http="0.0.0.0:0", token="s3cret"), start_pools=False)
    with Server(ServeConfig(**kwargs, token="s3cret")) as server:
        with pytest.raises(ServiceError, match="token"):
            Client(server.http_url).answer(wl.requests[0])
        got = Client(server.http_url, token="s3cret").answer(wl.requests[0])
        assert close(got.h, QueryEngine(G, model, mode="he", store=store).answer(wl.requests[0]).h)


def test_remote_engine_answers_like_query_engine(deployment):
    """The streaming job's `--engine serve://...` view of the service."""
    from sparkgnn.serving.online.remote_engine import RemoteEngine

    kwargs, G, model, store, wl = deployment
    with Server(ServeConfig(**kwargs)) as server:
        engine = RemoteEngine(f"serve://{server.zmq_endpoint}", "exact")
        reference = QueryEngine(G, model, mode="exact", store=store)
        for r in wl.requests[:3]:
            got, want = engine.answer(r), reference.answer(r)
            assert close(got.h, want.h)
            np.testing.assert_array_equal(got.qid, r.qid)
        bad = Request("bad", r.qid, np.full_like(r.x, np.nan), r.src, r.dst)
        with pytest.raises(ServiceError, match="NaN"):
            engine.answer(bad)
        engine.close()
    with pytest.raises(ValueError, match="serve://"):
        RemoteEngine("tcp://127.0.0.1:1")


def test_modes_are_chosen_explicitly_and_others_are_refused_naming_the_setting(deployment):
    kwargs, *_, wl = deployment
    config = ServeConfig(**{**kwargs, "modes": ServeConfig(graph="g", model="m").modes}, http=None)
    assert config.modes == ["he", "srpe"]  # the cheap reuse modes unless a deployment lists others
    server = Server(config, start_pools=False)
    outcome = server.submit(wl.requests[0], "full").result(timeout=5)
    assert outcome.kind == "error" and "mode 'full' is not served here" in outcome.error
    assert "`modes`" in outcome.error
    server.scheduler.close()


def test_the_queue_is_bounded_in_bytes(deployment):
    from sparkgnn.serving.online.server import request_bytes

    kwargs, *_, wl = deployment
    first, second = wl.requests[0], wl.requests[1]
    budget = request_bytes(first) + request_bytes(second) - 1  # both together do not fit
    server = Server(ServeConfig(**kwargs, queue_bytes=budget, http=None), start_pools=False)  # nothing drains it
    accepted = server.submit(first)
    outcome = server.submit(second).result(timeout=5)
    assert not accepted.done()
    assert outcome.kind == "busy" and f"budget of {budget} bytes" in outcome.error
    assert server.stats["busy"] == 1
    server.stop()  # the queued one is answered, its bytes leave the budget
    assert accepted.result(timeout=5).kind == "stopping" and server.intake.queued_bytes == 0


def test_a_batch_past_its_deadline_is_answered_timeout_and_the_service_goes_on(deployment):
    import threading

    kwargs, G, model, store, wl = deployment
    with Server(ServeConfig(**kwargs, batch_timeout_s=0.2, http=None)) as server:
        pool = server.pools[0]
        real_call, release = pool.call_requests, threading.Event()  # dispatch's entry into an in-process pool

        def stuck(*args, **kwargs):
            release.wait(30)  # a call that hangs until the test lets it go
            return real_call(*args, **kwargs)

        pool.call_requests = stuck
        outcome = server.submit(wl.requests[0]).result(timeout=30)
        assert outcome.kind == "timeout" and "batch deadline of 0.2 s" in outcome.error
        assert server.stats["batch_timeouts"] == 1
        pool.call_requests = real_call
        release.set()  # the stuck call returns; its slot serves again
        again = server.submit(wl.requests[0]).result(timeout=30)
        assert again.kind == "ok", again.error


def test_stop_ends_every_dispatch_thread_of_a_pool_wider_than_eight(deployment):
    """stop() hands each dispatch thread of each pool its own sentinel: in a pool of 10 slots with
    one batch running and nine threads idle, every thread ends and the running batch is answered."""
    import threading

    kwargs, *_, wl = deployment
    pools = [{"name": "wide", "kind": "inprocess", "width": 10}]
    server = Server(ServeConfig(**kwargs, pools=pools, http=None)).start()
    pool = server.pools[0]
    real_call, entered, release = pool.call_requests, threading.Event(), threading.Event()

    def held(*args, **kwargs):
        entered.set()
        release.wait(30)
        return real_call(*args, **kwargs)

    pool.call_requests = held
    running = server.submit(wl.requests[0])
    assert entered.wait(30)  # one slot holds a call, nine wait for batches
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    release.set()
    stopper.join(60)
    assert running.result(timeout=30).kind == "ok"
    alive = [t.name for t in threading.enumerate() if t.name.startswith("sparkgnn-serve-dispatch-wide-")]
    assert not stopper.is_alive() and alive == []


def test_a_burst_past_capacity_is_answered_at_capacity_and_the_rest_refused_at_intake(deployment):
    """A burst of EXACT requests far beyond what one slot answers within a deadline a few
    requests long: the first ones are answered, the excess is refused BUSY inside submit (its
    Future resolved before submit returns: nothing queued, no work spent), and every request
    gets an outcome. Counts only, no timings."""
    kwargs, *_, wl = deployment
    with Server(ServeConfig(**kwargs, mode="exact", http=None)) as server:
        costs = [server.facts.pending(r, None, "exact", 0.0)[0].cost for r in wl.requests]
        own = max(server.admission.estimate({}, "exact", c).service_s for c in costs)
        server.config.deadline_ms = 4 * own * 1e3  # about four requests' worth of service
        futures, refused_at_intake = [], []
        for i in range(400):
            future = server.submit(wl.requests[i % len(wl.requests)])
            futures.append(future)
            refused_at_intake.append(future.done() and future.result().kind == "busy")
        outcomes = [f.result(timeout=120) for f in futures]
    kinds = [o.kind for o in outcomes]
    assert set(kinds) <= {"ok", "busy", "timeout"}, {o.error for o in outcomes if o.kind not in ("ok", "busy")}
    assert kinds.count("ok") >= 1 and kinds.count("busy") >= 100
    assert [k == "busy" for k in kinds] == refused_at_intake  # every refusal came at intake
    assert all("deadline" in o.error and o.retry_after_s >= 1 for o in outcomes if o.kind == "busy")
    assert server.stats["shed"] == kinds.count("busy")


def test_a_request_with_a_deadline_it_cannot_meet_is_503_with_retry_after(deployment):
    kwargs, *_, wl = deployment
    r = wl.requests[0]
    body = {
        "request_id": "hurried",
        "nodes": [{"id": int(q), "x": row.tolist()} for q, row in zip(r.qid, r.x, strict=True)],
        "edges": [[int(s), int(d)] for s, d in zip(r.src, r.dst, strict=True)],
        "deadline_ms": 1e-6,  # shorter than any request's own service
    }
    with Server(ServeConfig(**kwargs)) as server:
        post = urllib.request.Request(f"{server.http_url}/v1/answer", data=json.dumps(body).encode(), method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(post, timeout=30)
        assert info.value.code == 503 and int(info.value.headers["Retry-After"]) >= 1
        reply = json.loads(info.value.read())
        assert reply["status"] == "busy" and "deadline of 0 ms" in reply["error"]
        body["deadline_ms"] = 60_000.0
        post = urllib.request.Request(f"{server.http_url}/v1/answer", data=json.dumps(body).encode(), method="POST")
        assert json.loads(urllib.request.urlopen(post, timeout=30).read())["status"] == "ok"


def test_an_idle_service_uses_almost_no_cpu(deployment):
    """No thread of an idle service polls: over a second of idleness the process's CPU time stays
    far below a busy core's (a resource bound, generous for a loaded test machine)."""
    import time

    kwargs, *_, wl = deployment
    with Server(ServeConfig(**kwargs)) as server:  # both fronts, the batcher, evictor, dispatch
        server.submit(wl.requests[0]).result(timeout=30)
        time.sleep(0.3)
        before = time.process_time()
        time.sleep(1.0)
        assert time.process_time() - before < 0.3
