"""The HTTP front against a real Server: a misspelt key is refused naming it (not answered as if
the request had no edges), a deeply nested body is a 400 with one line and no traceback in the
log, a request over the size or cost caps is 413 while another client is answered, bodies beyond
the parse queue are 503, the server's own limits are 503/504 with Retry-After, a swap body is
strict (timeout_s bounded), the admin path refuses the inference token, a swap outside the swap
roots is refused in the words of a missing path and a refused swap names no directory entries,
HTTPS round-trips with a self-signed certificate, idle and half-sent connections are closed after
the idle timeout, and clients that reset mid-body are logged as one rate-limited line. After
every bad request the service still answers."""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import threading
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
from sparkgnn.serving.request import Request

TOKEN = "s3cret"
ADMIN = "adm1n"
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
        admin_token=ADMIN,
        swap_roots=[str(d)],
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


def scrape(url: str, token: str | None) -> tuple[int, dict]:
    """(status, {(sample name, sorted labels): value}) of GET /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url + "/metrics", headers=headers), timeout=30) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, {}
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return 200, samples


def test_metrics_count_requests_by_mode_and_outcome_behind_the_health_token(deployed):
    server, request, reference = deployed
    assert scrape(server.http_url, None)[0] == 401 and scrape(server.http_url, "wrong")[0] == 401
    _, before = scrape(server.http_url, TOKEN)
    ok = ("sparkgnn_serve_requests_total", (("mode", "he"), ("outcome", "ok")))
    for _ in range(2):
        still_answers(server, request, reference)
    post(server.http_url, as_json(request, mode="no_such_mode"))  # refused: counted under "other"
    _, after = scrape(server.http_url, TOKEN)
    assert after[ok] - before.get(ok, 0.0) == 2
    bad = ("sparkgnn_serve_requests_total", (("mode", "other"), ("outcome", "error")))
    assert after[bad] - before.get(bad, 0.0) == 1
    latency = ("sparkgnn_serve_latency_seconds_count", (("mode", "he"),))
    assert after[latency] - before.get(latency, 0.0) == 2
    assert after[("sparkgnn_serve_pool_workers", (("pool", "main"),))] == 1
    assert after[("sparkgnn_serve_pool_slots", (("pool", "main"),))] == 1
    assert after[("sparkgnn_serve_queue_requests", ())] == 0
    fingerprint = server.stats["graph_fingerprint"]
    assert after[("sparkgnn_serve_version", (("graph_fingerprint", fingerprint),))] == server.stats["version"]
    assert after[("sparkgnn_serve_batch_requests_count", ())] >= 2
    # the status line reports the same numbers
    line = server.metrics.status_line()
    assert f"ok={int(after[ok])}" in line and f"version={server.stats['version']}" in line
    assert "main=0/1busy,1workers" in line
    # with metrics_auth "admin" the inference token no longer opens them
    server._http.metrics_auth = "admin"
    try:
        assert scrape(server.http_url, TOKEN)[0] == 401 and scrape(server.http_url, ADMIN)[0] == 200
    finally:
        server._http.metrics_auth = "inference"


def test_a_misspelt_key_is_refused_naming_it_not_answered_without_the_edges(deployed):
    server, request, reference = deployed
    body = as_json(request)
    body["edge"] = body.pop("edges")
    status, reply, _ = post(server.http_url, body)
    assert status == 400
    assert (
        "unknown key 'edge'" in reply["error"]
        and "expected one of: deadline_ms, edge_attr, edges, mode, nodes, request_id" in reply["error"]
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
            status, reply, _ = post(server.http_url, body, path, token=ADMIN if "admin" in path else TOKEN)
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


def test_an_answer_is_json_whose_rows_read_back_to_the_same_float32():
    from sparkgnn.serving.online.wire import BatchAnswers, answer_table

    h = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    h[1, :3] = 1e-30, -3.4e38, 0.1  # tiny, huge and inexact float32 values keep their bits too
    for pred in (np.array([4, 0, 7]), None):
        batch = BatchAnswers(answer_table(np.array([0, 1, 1]), np.array([5, 6, 7]), h, pred), 2)
        outcome = Outcome("r", "ok", answer=batch.rows(1), queue_s=0.001, service_s=0.002, batch_requests=2, pool="p")
        response = outcome_response(outcome)
        assert response.status == 200 and response.content_type == "application/json"
        reply = json.loads(response.body)
        assert [a["node"] for a in reply["answers"]] == [6, 7] and reply["batch_requests"] == 2
        np.testing.assert_array_equal(np.asarray([a["h"] for a in reply["answers"]], np.float32), h[1:])
        assert [a.get("pred") for a in reply["answers"]] == ([0, 7] if pred is not None else [None, None])
        assert all(("pred" in a) == (pred is not None) for a in reply["answers"])  # no pred: no key
        assert reply["queue_ms"] == pytest.approx(1.0) and reply["pool"] == "p"


def test_a_request_that_waited_past_the_timeout_is_504_not_400(deployed):
    server, request, reference = deployed
    timeout = server.config.request_timeout_s
    server.config.request_timeout_s = 1e-9  # every request has waited longer than that
    server.config.deadline_ms = 60_000.0  # admitted at intake (admission reads the deadline)
    try:
        status, reply, headers = post(server.http_url, as_json(request))
    finally:
        server.config.request_timeout_s = timeout
        server.config.deadline_ms = None
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
        status, reply, _ = post(server.http_url, body, "/v1/admin/swap", token=ADMIN)
        assert status == 400 and why in reply["error"], reply
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    for name in ("passwd-like-entry", "another-secret-name"):
        (crowded / name).write_text("x")
    status, reply, _ = post(server.http_url, {"graph": str(crowded)}, "/v1/admin/swap", token=ADMIN)
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


def cheap_request(server) -> Request:
    """One query without edges (predicted cost 0): under any cost cap."""
    return Request(
        "cheap",
        np.array([server.facts.fresh_id()]),
        np.ones((1, server.facts.feature_dim), np.float32),
        np.zeros(0, np.int64),
        np.zeros(0, np.int64),
    )


def test_oversize_and_over_cost_requests_are_413_while_another_client_is_answered(deployed):
    server, request, reference = deployed
    cheap = cheap_request(server)
    heavy = as_json(request, request_id="heavy")
    oversize = as_json(request, request_id="oversize")
    oversize["edges"] = [[oversize["nodes"][0]["id"], 1]] * 10_001  # max_edges=10_000
    assert server.facts.pending(request, None, "he", 0.0)[0].cost >= 1
    saved = server.config.max_cost
    server.config.max_cost = 0.5  # the cheap request's cost is 0, the heavy one's at least 1
    refusals: list = []

    def flood() -> None:
        for _ in range(10):
            for body in (heavy, oversize):
                refusals.append(post(server.http_url, body)[:2])

    floods = [threading.Thread(target=flood) for _ in range(3)]
    try:
        for t in floods:
            t.start()
        for _ in range(10):  # another client, meanwhile: answered every time
            status, reply, _ = post(server.http_url, as_json(cheap))
            assert status == 200, reply
            np.testing.assert_allclose(reply["answers"][0]["h"], reference.answer(cheap).h[0], rtol=1e-4, atol=1e-5)
    finally:
        for t in floods:
            t.join()
        server.config.max_cost = saved
    assert len(refusals) == 60 and all(status == 413 for status, _ in refusals)
    words = {reply["request_id"]: reply["error"] for _, reply in refusals}
    assert "predicted cost" in words["heavy"] and "at most 0 per request" in words["heavy"]
    assert "has 10001 edges" in words["oversize"]
    still_answers(server, request, reference)


def test_bodies_beyond_the_parse_queue_are_503_with_retry_after_and_small_ones_parsed_inline(deployed, monkeypatch):
    from sparkgnn.serving.online import http_front

    server, request, reference = deployed
    front = server._http
    taken = 0
    while front.parse_pool._slots.acquire(blocking=False):  # every parse slot busy
        taken += 1
    try:
        status, reply, _ = post(server.http_url, as_json(request))  # small: parsed on the event loop
        assert status == 200 and reply["status"] == "ok", reply
        monkeypatch.setattr(http_front, "INLINE_BYTES", 0)  # every body goes to the parse pool
        status, reply, headers = post(server.http_url, as_json(request))
    finally:
        for _ in range(taken):
            front.parse_pool._slots.release()
    assert taken == server.config.parse_threads + server.config.parse_queue
    assert status == 503 and "waiting to be parsed" in reply["error"] and headers["Retry-After"] == "1"
    still_answers(server, request, reference)


def test_the_admin_path_refuses_the_inference_token(deployed):
    server, request, reference = deployed
    for token in (TOKEN, None, "wrong"):
        status, reply, _ = post(server.http_url, {"graph": server.config.graph}, "/v1/admin/swap", token=token)
        assert status == 401 and "admin" in reply["error"], reply
    assert server.stats["version"] == 1
    status, reply, _ = post(server.http_url, {"graph": server.config.graph}, "/v1/admin/swap", token=ADMIN)
    assert status == 200 and reply["swap"]["changed"] is False  # the admin token opens it (same version)
    still_answers(server, request, reference)


def test_a_swap_outside_the_roots_is_refused_in_the_words_of_a_missing_path(deployed, tmp_path):
    server, request, reference = deployed
    outside = tmp_path / "outside-graph"
    outside.mkdir()
    inside_missing = os.path.join(server.config.swap_roots[0], "no-such-graph")
    escape = os.path.join(server.config.swap_roots[0], "..", outside.parent.name, "outside-graph")
    link = os.path.join(server.config.swap_roots[0], "link-out")
    os.symlink(str(outside), link)  # a link inside the roots to a folder outside them
    try:
        texts = set()
        for body in (
            {"graph": str(outside)},
            {"graph": inside_missing},
            {"graph": escape},
            {"graph": link},
            {"graph": "s3://bucket/graph"},
            {"graph": server.config.graph, "store": str(outside)},
        ):
            status, reply, _ = post(server.http_url, body, "/v1/admin/swap", token=ADMIN)
            assert status == 409, (body, reply)
            texts.add(reply["error"])
    finally:
        os.remove(link)
    assert len(texts) == 1, texts  # existing or not, outside or missing: one answer
    assert "swap_roots" in texts.pop()
    assert server.stats["version"] == 1
    still_answers(server, request, reference)


def test_https_round_trip_with_a_self_signed_certificate(deployed, tmp_path):
    import shutil
    import subprocess

    from sparkgnn.serving.online.client import Client

    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    server, request, reference = deployed
    config = ServeConfig(
        **{**server.config.__dict__, "tls_cert": str(cert), "tls_key": str(key), "bind": "tcp://127.0.0.1:0"}
    )
    with Server(config) as tls_server:
        assert tls_server.http_url.startswith("https://127.0.0.1:")
        got = Client(tls_server.http_url, token=TOKEN, ca_file=str(cert)).answer(request)
        np.testing.assert_allclose(got.h, reference.answer(request).h, rtol=1e-4, atol=1e-5)
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP is not served there
            urllib.request.urlopen(tls_server.http_url.replace("https", "http") + "/v1/health", timeout=10)
