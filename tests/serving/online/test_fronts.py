"""Extra HTTP front processes (fronts.py) against a real Server: the answers of a front process
equal the service's own front's exactly, every listener checks the token (relayed /v1/answer and
proxied paths alike), a killed front process is restarted and counted, stop() ends every process,
and fronts > 1 is refused with the reason where SO_REUSEPORT is missing or there is no HTTP front."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from serving_testkit import pyg_model

from sparkgnn.graph import write_graph_dir
from sparkgnn.models import Model
from sparkgnn.pe.local import precompute_local
from sparkgnn.serving import QueryEngine
from sparkgnn.serving.online import fronts
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.pools import ServeError
from sparkgnn.serving.online.server import Server

TOKEN = "s3cret"
ADMIN = "adm1n"
TRIES = 24  # new connections per check: all on one of two listeners has odds 2**-23


@pytest.fixture(scope="module")
def files(skewed_workload, tmp_path_factory):
    d = tmp_path_factory.mktemp("fronts")
    G = skewed_workload.graph_G
    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=3))
    model.save(str(d / "model.pt"))
    write_graph_dir(G, str(d / "g"))
    store = precompute_local(G, model, str(d / "store"))
    request = next(r for r in skewed_workload.requests if r.num_edges)
    return d, request, QueryEngine(G, model, mode="he", store=store)


def config_of(d, fronts_count: int) -> ServeConfig:
    return ServeConfig(
        graph=str(d / "g"),
        model=str(d / "model.pt"),
        store=str(d / "store"),
        token=TOKEN,
        admin_token=ADMIN,
        fronts=fronts_count,
    )


@pytest.fixture(scope="module")
def two_fronts(files):
    d, request, reference = files
    with Server(config_of(d, 2)) as server:
        yield server, request, reference


def call(url: str, path: str, body: dict | None, token: str | None) -> tuple[int, dict, str | None]:
    """(status, JSON reply, the front process that answered or None for the service's own) of
    one request on a new connection."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(url + path, data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, json.loads(response.read()), response.headers.get(fronts.FRONT_HEADER)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), exc.headers.get(fronts.FRONT_HEADER)


def as_json(request) -> dict:
    return {
        "request_id": request.request_id,
        "mode": "he",
        "nodes": [{"id": int(q), "x": row.tolist()} for q, row in zip(request.qid, request.x, strict=True)],
        "edges": [[int(s), int(t)] for s, t in zip(request.src, request.dst, strict=True)],
    }


def test_a_front_process_answers_exactly_as_the_service_front(two_fronts):
    server, request, reference = two_fronts
    answers: dict[str | None, list] = {}
    for _ in range(TRIES):
        status, reply, front = call(server.http_url, "/v1/answer", as_json(request), TOKEN)
        assert status == 200 and reply["status"] == "ok", reply
        assert reply["request_id"] == request.request_id and reply["version"] == 1
        answers.setdefault(front, []).append(reply["answers"])
    assert set(answers) == {None, "1"}, "both listeners answer"
    own = answers[None][0]
    for replies in answers.values():
        for got in replies:
            assert got == own  # node, h and pred: the same JSON values
    expected = reference.answer(request).h
    np.testing.assert_allclose(np.asarray([a["h"] for a in own], np.float32), expected, rtol=1e-4, atol=1e-5)


def test_every_front_checks_the_token(two_fronts):
    server, request, _reference = two_fronts
    seen = set()
    for i in range(TRIES):
        path, body = ("/v1/answer", as_json(request)) if i % 2 else ("/v1/health", None)
        status, reply, front = call(server.http_url, path, body, "wrong" if i % 4 < 2 else None)
        assert status == 401 and "bearer token" in reply["error"], (path, reply)
        seen.add((path, front))
    assert {front for _path, front in seen} == {None, "1"}
    # the admin path, proxied from a front process, still refuses the inference token
    for _ in range(8):
        status, reply, _front = call(server.http_url, "/v1/admin/swap", {"graph": "x"}, TOKEN)
        assert status == 401 and "admin" in reply["error"]


def test_a_killed_front_is_restarted_and_stop_ends_every_process(files):
    d, request, _reference = files
    server = Server(config_of(d, 2)).start()
    try:
        procs = server.front_processes
        assert procs.alive() == 1
        victim = procs.procs[1]
        victim.kill()
        victim.wait(timeout=10)
        for _ in range(200):  # the watcher relaunches it (a new interpreter: a few seconds)
            if procs.procs[1] is not victim and procs.alive() == 1:
                break
            time.sleep(0.1)
        assert procs.procs[1] is not victim and procs.alive() == 1
        assert server.stats["front_deaths"] == 1 and server.stats["front_restarts"] == 1
        status, reply, _front = call(server.http_url, "/v1/answer", as_json(request), TOKEN)
        assert status == 200, reply
    finally:
        server.stop()
    assert all(p.returncode is not None for p in server.front_processes.procs.values())
    assert server.front_processes.alive() == 0


def test_fronts_refused_without_reuse_port_or_http(files, monkeypatch):
    d, _request, _reference = files
    monkeypatch.setattr(fronts, "reuse_port_refusal", lambda: "this platform's socket module has no SO_REUSEPORT")
    with pytest.raises(ServeError, match="fronts=2 needs SO_REUSEPORT.*no SO_REUSEPORT"):
        Server(config_of(d, 2))
    config = config_of(d, 2)
    config.http = None
    with pytest.raises(ServeError, match="fronts=2 needs the HTTP front"):
        config.check()
