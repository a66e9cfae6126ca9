"""The HTTP front against a real Server: a misspelt key is refused naming it (not answered as if
the request had no edges), a deeply nested body is a 400 with one line and no traceback in the
log, a request over the size limits is 413, the server's own limits are 503/504 with Retry-After,
a swap body is strict (timeout_s bounded) and a refused swap names no directory entries, idle and
half-sent connections are closed after the idle timeout, and clients that reset mid-body are
logged as one rate-limited line. After every bad request the service still answers."""

from __future__ import annotations

import json
import logging
import socket
import struct
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
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.http_front import STATUS, ResetLog, outcome_response
from sparkgnn.serving.online.server import Outcome, Server

TOKEN = "s3cret"
DEEP = b"[" * 100_000 + b"]" * 100_000  # 200 KB


@pytest.fixture(scope="module")
def deployed(skewed_workload, tmp_path_factory):
    d = tmp_path_factory.mktemp("http")
    G = skewed_workload.graph_G
    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=3))
    model.save(str(d / "model.pt"))
    write_graph_dir(G, str(d / "g"))
    store = precompute_local(G, model, str(d / "store"))
    config = ServeConfig(
        graph=str(d / "g"),
        model=str(d / "model.pt"),
        store=str(d / "store"),
        token=TOKEN,
        max_edges=10_000,
        http_idle_timeout_s=0.5,
    )
    request = next(r for r in skewed_workload.requests if r.num_edges)
    reference = QueryEngine(G, model, mode="he", store=store)
    with Server(config) as server:
        yield server, request, reference


def post(url: str, body, path: str = "/v1/answer", token: str | None = TOKEN):
    """(status, JSON reply, headers) of a POST of `body` (bytes as they are, else JSON)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(url + path, data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), exc.headers


def as_json(request, **extra) -> dict:
    return {
        "request_id": request.request_id,
        "mode": "he",
        "nodes": [{"id": int(q), "x": row.tolist()} for q, row in zip(request.qid, request.x, strict=True)],
        "edges": [[int(s), int(t)] for s, t in zip(request.src, request.dst, strict=True)],
        **extra,
    }


def still_answers(server, request, reference) -> None:
    status, reply, _ = post(server.http_url, as_json(request))
    assert status == 200, reply
    h = np.asarray([a["h"] for a in reply["answers"]], np.float32)
    np.testing.assert_allclose(h, reference.answer(request).h, rtol=1e-4, atol=1e-5)


def test_health_shows_counts_and_the_version_but_no_host_paths(deployed):
    server, _request, _reference = deployed
    req = urllib.request.Request(server.http_url + "/v1/health", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as response:
        text = response.read().decode()
    health = json.loads(text)
    assert health["status"] == "ok" and "requests" in health["stats"] and health["version"]["version"] >= 1
    assert health["version"]["graph_fingerprint"] == server.stats["graph_fingerprint"]
    assert "graph" not in health["version"] and "store" not in health["version"]
    for path in (server.config.graph, server.config.store):  # nor anywhere else in the reply
        assert path not in text


def test_a_misspelt_key_is_refused_naming_it_not_answered_without_the_edges(deployed):
    server, request, reference = deployed
    body = as_json(request)
    body["edge"] = body.pop("edges")
    status, reply, _ = post(server.http_url, body)
    assert status == 400
    assert (
        "unknown key 'edge'" in reply["error"] and "expected one of: edges, mode, nodes, request_id" in reply["error"]
    )
    for key in ("weights", "nodez"):
        status, reply, _ = post(server.http_url, as_json(request, **{key: 1}))
        assert status == 400 and f"unknown key {key!r}" in reply["error"]
    still_answers(server, request, reference)


def test_booleans_and_strings_are_not_features(deployed):
    server, request, reference = deployed
    body = as_json(request)
    body["nodes"][0]["x"][0] = True
    status, reply, _ = post(server.http_url, body)
    assert status == 400 and "Expected `float`, got `bool`" in reply["error"]
    body["nodes"][0]["x"][0] = "1.5"
    status, reply, _ = post(server.http_url, body)
    assert status == 400 and "Expected `float`, got `str`" in reply["error"]
    still_answers(server, request, reference)


def test_deeply_nested_bodies_are_one_line_400s_without_a_traceback(deployed, caplog):
    server, request, reference = deployed
    nested_x = b'{"nodes": [{"id": 99999, "x": ' + DEEP + b"}]}"
    with caplog.at_level(logging.DEBUG):
        for path, body in [("/v1/answer", DEEP), ("/v1/answer", nested_x), ("/v1/admin/swap", DEEP)]:
            status, reply, _ = post(server.http_url, body, path)
            assert status == 400, (path, reply)
            assert "\n" not in reply["error"] and len(reply["error"]) < 300
    assert not [r for r in caplog.records if r.exc_info or "Error handling request" in r.getMessage()]
    still_answers(server, request, reference)


def test_a_request_over_the_size_limits_is_413(deployed):
    server, request, reference = deployed
    body = as_json(request)
    q = body["nodes"][0]["id"]
    body["edges"] = [[q, 1]] * 10_001  # max_edges=10_000
    status, reply, _ = post(server.http_url, body)
    assert status == 413 and "has 10001 edges; this service takes at most 10000" in reply["error"]
    still_answers(server, request, reference)


def test_the_servers_own_limits_are_5xx_with_retry_after():
    for kind, status in (("busy", 503), ("stopping", 503), ("timeout", 504)):
        response = outcome_response(Outcome("r", kind, error="why"))
        assert response.status == status and int(response.headers["Retry-After"]) >= 1
    assert outcome_response(Outcome("r", "error", error="bad")).status == 400
    assert "Retry-After" not in outcome_response(Outcome("r", "error", error="bad")).headers
    assert STATUS["failed"] == 500


def test_a_request_that_waited_past_the_timeout_is_504_not_400(deployed):
    server, request, reference = deployed
    timeout = server.config.request_timeout_s
    server.config.request_timeout_s = 1e-9  # every request has waited longer than that
    try:
        status, reply, headers = post(server.http_url, as_json(request))
    finally:
        server.config.request_timeout_s = timeout
    assert status == 504 and reply["status"] == "timeout" and "in the queue" in reply["error"]
    assert headers["Retry-After"] == "1"
    still_answers(server, request, reference)


def test_swap_bodies_are_strict_and_a_refused_swap_lists_no_entries(deployed, tmp_path):
    server, request, reference = deployed
    for body, why in [
        ({"graph": server.config.graph, "timeout_s": 1e-9}, ">= 1.0"),
        (b'{"graph": "/g", "timeout_s": Infinity}', "not JSON"),
        ({"graph": server.config.graph, "grpah": "x"}, "unknown key 'grpah'"),
    ]:
        status, reply, _ = post(server.http_url, body, "/v1/admin/swap")
        assert status == 400 and why in reply["error"], reply
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    for name in ("passwd-like-entry", "another-secret-name"):
        (crowded / name).write_text("x")
    status, reply, _ = post(server.http_url, {"graph": str(crowded)}, "/v1/admin/swap")
    assert status == 409 and "refused" in reply["error"] and "still serving version 1" in reply["error"]
    assert "passwd-like-entry" not in reply["error"] and "another-secret-name" not in reply["error"]
    still_answers(server, request, reference)


def _connect(server) -> socket.socket:
    host, port = server.http_url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(closed by the server within `seconds`, what it sent before closing)."""
    sock.settimeout(seconds)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True, got
            got += chunk
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        return True, got


def test_idle_and_half_sent_connections_are_closed_after_the_idle_timeout(deployed):
    server, request, reference = deployed
    with _connect(server) as idle:  # connects and sends nothing
        closed, _ = _closed_within(idle, 5.0)
        assert closed
    with _connect(server) as half:  # half a body, then silence
        half.sendall(
            b"POST /v1/answer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 1000\r\n\r\n".encode()
            + b'{"nodes": [{"id"'
        )
        closed, sent = _closed_within(half, 5.0)
        assert closed and b" 408 " in sent.split(b"\r\n", 1)[0]
    still_answers(server, request, reference)


def test_clients_resetting_mid_body_log_one_line_each_rate_limited(deployed, caplog):
    server, request, reference = deployed
    before = server._http.resets.count  # type: ignore[attr-defined]
    with caplog.at_level(logging.DEBUG):
        for _ in range(5):
            sock = _connect(server)
            sock.sendall(
                b"POST /v1/answer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 1000\r\n\r\n".encode()
                + b'{"nodes": ['
            )
            time.sleep(0.05)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            sock.close()
        deadline = time.monotonic() + 5
        while server._http.resets.count < before + 5 and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.02)
    assert server._http.resets.count == before + 5  # type: ignore[attr-defined]
    resets = [r for r in caplog.records if "reset the connection mid-body" in r.getMessage()]
    assert len(resets) <= 1  # at most one line per RESET_LOG_EVERY_S (one, unless an earlier test logged)
    assert not [r for r in caplog.records if r.exc_info or "Error handling request" in r.getMessage()]
    still_answers(server, request, reference)


def test_reset_log_counts_what_it_suppressed(caplog):
    resets = ResetLog(every_s=3600.0)
    with caplog.at_level(logging.WARNING, logger="sparkgnn.serving.online.http_front"):
        for i in range(4):
            resets.note(f"10.0.0.{i}", ConnectionResetError("Connection lost"))
        resets._last -= 7200.0  # the quiet spell is over
        resets.note("10.0.0.9", ConnectionResetError("Connection lost"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and resets.count == 5
    assert "10.0.0.0" in lines[0] and "(3 more since the last such line)" in lines[1]
