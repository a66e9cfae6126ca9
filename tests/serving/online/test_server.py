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
    kwargs = {"graph": str(d / "g"), "model": str(d / "model.pt"), "store": str(d / "store")}
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
    kwargs, G, model, store, wl = deployment
    pools = [{"name": "workers", "kind": "workers", "width": 2, "threads": 1}]
    with Server(ServeConfig(**kwargs, pools=pools)) as server:
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
