"""The ZeroMQ front's headers are as strict as the HTTP bodies: an unknown (misspelt) header key
or table is refused naming it and the expected ones, fields have their types, a deeply nested
header is one refusal line (the intake thread lives on), and the service answers afterwards."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import zmq
from serving_testkit import pyg_model

from sparkgnn.graph import write_graph_dir
from sparkgnn.messenger import protocol, security
from sparkgnn.models import Model
from sparkgnn.serving import QueryEngine
from sparkgnn.serving.online import wire
from sparkgnn.serving.online.client import Client
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.server import Server
from sparkgnn.serving.online.zmq_front import ZmqFront
from sparkgnn.serving.request import Request


@pytest.fixture(scope="module")
def deployed(skewed_workload, tmp_path_factory):
    d = tmp_path_factory.mktemp("zmq")
    G = skewed_workload.graph_G
    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=3))
    model.save(str(d / "model.pt"))
    write_graph_dir(G, str(d / "g"))
    # one slot and no express lanes: the admission tests hold that slot and count what queues behind it
    config = ServeConfig(
        graph=str(d / "g"), model=str(d / "model.pt"), mode="full", modes=["full", "ns"], http=None, express_lanes=0
    )
    request = skewed_workload.requests[0]
    with Server(config) as server:
        yield server, request, QueryEngine(G, model, mode="full")


def exchange(server, frames: list) -> dict:
    return exchange_at(server.zmq_endpoint, frames)


def exchange_at(endpoint: str, frames: list) -> dict:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart(frames)
        assert sock.poll(10_000), "no reply"
        header, _tables = protocol.decode(sock.recv_multipart())
        return header
    finally:
        sock.close(0)


def still_answers(server, request, reference) -> None:
    with Client(server.zmq_endpoint) as client:
        got = client.answer(request)
    np.testing.assert_allclose(got.h, reference.answer(request).h, rtol=1e-4, atol=1e-5)


def test_an_unknown_header_key_is_refused_naming_it(deployed):
    server, request, reference = deployed
    header = {"kind": "TASK", "op": "answer", "request_id": "r1", "mdoe": "ns"}
    reply = exchange(server, protocol.encode(header, wire.request_tables(request)))
    assert reply["kind"] == "ERROR" and reply["request_id"] == "r1"
    expected = "unknown header key 'mdoe'; expected one of: deadline_ms, mode, op, packed, request_id, tag"
    assert expected in reply["error"]
    still_answers(server, request, reference)


def test_packed_and_arrow_requests_get_the_same_answers_and_a_bad_packed_payload_is_one_error(deployed):
    server, request, reference = deployed
    want = reference.answer(request)
    for packed in (True, False):
        with Client(server.zmq_endpoint, packed=packed) as client:
            got = client.answer(request)
        np.testing.assert_array_equal(got.nodes, want.qid)
        np.testing.assert_allclose(got.h, want.h, rtol=1e-4, atol=1e-5)
    header = {"kind": "TASK", "op": "answer", "request_id": "p1"}
    counts, payload = wire.pack_request(request)
    frames = wire.packed_frames(header, "TASK", counts, payload)
    tampered = bytearray(payload)
    tampered[0] ^= 1
    reply = exchange(server, [frames[0], bytes(tampered)])
    assert reply["kind"] == "ERROR" and "payload hash mismatch" in reply["error"]
    short = wire.packed_frames(header, "TASK", counts, payload[:-4])
    reply = exchange(server, short)
    assert reply["kind"] == "ERROR" and f"holds {len(payload) - 4} bytes" in reply["error"]
    reply = exchange(server, wire.packed_frames(header, "TASK", {**counts, "edges": -1}, payload))
    assert reply["kind"] == "ERROR" and "packed.edges must be an integer" in reply["error"]
    still_answers(server, request, reference)


def test_unknown_tables_and_wrong_types_are_refused(deployed):
    server, request, reference = deployed
    tables = wire.request_tables(request)
    reply = exchange(server, protocol.encode({"kind": "TASK"}, {"nodes": tables["nodes"], "edge": tables["edges"]}))
    assert reply["kind"] == "ERROR" and "unknown table 'edge'; expected: nodes, edges" in reply["error"]
    reply = exchange(server, protocol.encode({"kind": "TASK", "mode": ["full"]}, tables))
    assert reply["kind"] == "ERROR" and "header 'mode' has the wrong type" in reply["error"]
    reply = exchange(server, protocol.encode({"kind": "TASK", "mode": "exact"}, tables))
    assert reply["kind"] == "ERROR" and "mode 'exact' is not served here" in reply["error"]
    still_answers(server, request, reference)


def test_a_deeply_nested_header_is_one_refusal_and_the_intake_lives_on(deployed):
    server, request, reference = deployed
    depth = 30_000  # 60 KB, under the header cap
    reply = exchange(server, [b"[" * depth + b"]" * depth])
    assert reply["kind"] == "ERROR" and "nests too deeply" in reply["error"] and "\n" not in reply["error"]
    still_answers(server, request, reference)


class _RefusingServer:
    """Just enough of Server for the front: every message here is refused (counted), so a client
    that reaches the front gets an ERROR reply and one that does not gets nothing."""

    class config:
        max_body_bytes = 1 << 20

    def __init__(self):
        self.refusals = 0

    def count_refusal(self) -> None:
        self.refusals += 1

    def refuse_early(self, *_args, **_kwargs) -> bool:
        return False  # no queue: nothing is refused before it is read


def test_a_keyed_front_answers_listed_clients_only(tmp_path):
    keys = security.make_full_set(tmp_path / "keys")
    stranger = tmp_path / "stranger"
    security.make_keypair(stranger, "client")
    server = _RefusingServer()
    front = ZmqFront(server, f"ipc://{tmp_path}/front.ipc", curve_keys=str(keys))
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=front.run, args=(ready, stop), daemon=True)
    thread.start()
    assert ready.wait(5)

    def ask(client_dir) -> bool:
        client_keys = security.ClientKeys(security.load_keypair(client_dir, "client"), security.server_public_key(keys))
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, 2000)  # a handshake refused before the send leaves no pipe to queue on
        security.make_client(sock, client_keys)
        sock.connect(front.endpoint)
        try:
            try:
                sock.send_multipart([b"not a request"])
            except zmq.Again:
                return False  # refused already: nothing reached the front
            return bool(sock.poll(300 if client_dir == stranger else 10_000))
        finally:
            sock.close(0)

    try:
        assert not ask(stranger) and server.refusals == 0  # unlisted: no handshake, nothing read
        assert ask(keys) and server.refusals == 1
    finally:
        stop.set()
        front.wake()  # the socket thread waits in poll() until something arrives
        thread.join(5)


def test_a_message_over_the_body_limit_is_dropped_and_another_client_is_answered(skewed_workload, tmp_path):
    """MAXMSGSIZE on the ROUTER: libzmq disconnects a peer whose message part is over
    max_body_bytes before buffering it; the intake goes on answering others."""
    G = skewed_workload.graph_G
    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=3))
    model.save(str(tmp_path / "model.pt"))
    write_graph_dir(G, str(tmp_path / "g"))
    config = ServeConfig(
        graph=str(tmp_path / "g"), model=str(tmp_path / "model.pt"), mode="full", modes=["full"], http=None
    )
    config.max_body_bytes = 64 * 1024
    request = skewed_workload.requests[0]
    with Server(config) as server:
        big = Request("big", request.qid, np.ones((len(request.qid), 20_000), np.float32), request.src, request.dst)
        frames = protocol.encode({"kind": "TASK", "op": "answer", "request_id": "big"}, wire.request_tables(big))
        assert max(len(bytes(f)) for f in frames) > config.max_body_bytes
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(server.zmq_endpoint)
        try:
            sock.send_multipart(frames)
            still_answers(server, request, QueryEngine(G, model, mode="full"))
            assert not sock.poll(500)  # never answered: its connection was dropped
        finally:
            sock.close(0)
        assert server.stats["requests"] == 1  # only the other client's request reached the service


def big_request(G, n: int, seed: int = 0) -> Request:
    """A valid request of `n` new query nodes, each attached to a random vertex of G."""
    rng = np.random.default_rng(seed)
    qid = np.arange(n, dtype=np.int64) + int(G.ids.max()) + 1
    x = rng.standard_normal((n, G.feature_dim)).astype(np.float32)
    dst = rng.choice(G.ids, n).astype(np.int64)
    return Request("big", qid, x, qid.copy(), dst)


def test_a_large_request_being_parsed_does_not_stall_other_clients(deployed, skewed_workload, monkeypatch):
    """Decoding and validation run on the parse pool, not the socket thread: while the large
    request is held in its decoding (a gate, so the test shows "answered", never a timing),
    small requests from two other clients are answered; then the large one is too."""
    server, request, reference = deployed
    entered, gate = threading.Event(), threading.Event()
    decode = wire.request_from_tables

    def gated(request_id, tables):
        if request_id == "big":
            entered.set()
            gate.wait(30)
        return decode(request_id, tables)

    monkeypatch.setattr(wire, "request_from_tables", gated)
    big = big_request(skewed_workload.graph_G, 2000)
    frames = protocol.encode({"kind": "TASK", "op": "answer", "request_id": "big"}, wire.request_tables(big))
    assert sum(len(bytes(f)) for f in frames) < server.config.max_body_bytes  # large, but allowed
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.zmq_endpoint)
    try:
        sock.send_multipart(frames)
        assert entered.wait(10), "the large request never reached its decoding"
        try:
            for _ in range(2):  # two other clients, one after the other
                with Client(server.zmq_endpoint, timeout_s=10) as client:
                    got = client.answer(request)
                np.testing.assert_allclose(got.h, reference.answer(request).h, rtol=1e-4, atol=1e-5)
        finally:
            gate.set()
        assert sock.poll(30_000), "the large request was never answered"
        header, tables = protocol.decode(sock.recv_multipart())
        assert header["kind"] == "RESULT" and header["request_id"] == "big", header.get("error")
        assert tables["answer"].num_rows == 2000
    finally:
        gate.set()
        sock.close(0)


def test_a_full_parse_pool_answers_busy_at_once_echoing_the_request(deployed):
    """With every parse thread and queue slot taken, a request is answered BUSY (retry later),
    its request_id and tag echoed from the header alone, and counted as a refusal; a small
    packed request is parsed on the socket thread and still answered."""
    server, request, reference = deployed
    pool = server._zmq.parse_pool
    assert pool is server._parse_pool  # the service's pool, which its HTTP front shares
    errors = server.stats["errors"]
    taken = 0
    while pool._slots.acquire(blocking=False):
        taken += 1
    try:
        header = {"kind": "TASK", "op": "answer", "request_id": "r-busy", "tag": 7}
        reply = exchange(server, protocol.encode(header, wire.request_tables(request)))
        with Client(server.zmq_endpoint, packed=True) as client:
            answered = client.answer(request)
    finally:
        for _ in range(taken):
            pool._slots.release()
    assert taken == server.config.parse_threads + server.config.parse_queue
    assert reply["kind"] == "BUSY" and reply["request_id"] == "r-busy" and reply["tag"] == 7
    assert "waiting to be parsed" in reply["error"] and reply["retry_after_s"] == 1.0
    assert server.stats["errors"] == errors + 1
    np.testing.assert_allclose(answered.h, reference.answer(request).h, rtol=1e-4, atol=1e-5)
    still_answers(server, request, reference)


class _FailingServer(_RefusingServer):
    """A server whose submit fails with a bug (not a refusal)."""

    def submit(self, *args, **kwargs):
        raise RuntimeError("/srv/secret/path: a bug")


def test_a_bug_while_reading_a_request_is_one_error_line_without_the_traceback(skewed_workload, tmp_path, caplog):
    server = _FailingServer()
    front = ZmqFront(server, f"ipc://{tmp_path}/front.ipc")
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=front.run, args=(ready, stop), daemon=True)
    thread.start()
    assert ready.wait(5)
    request = skewed_workload.requests[0]
    try:
        with caplog.at_level("ERROR", logger="sparkgnn.serving.online.zmq_front"):
            header = {"kind": "TASK", "op": "answer", "request_id": "r1"}
            reply = exchange_at(front.endpoint, protocol.encode(header, wire.request_tables(request)))
    finally:
        stop.set()
        front.wake()
        thread.join(5)
    assert reply["kind"] == "ERROR" and reply["error"] == "the request could not be read"
    assert server.refusals == 1 and "/srv/secret" in caplog.text  # the traceback stays in the log


def test_past_its_deadline_a_request_is_refused_from_its_header_before_any_slot_frees(deployed):
    """The only slot holds a batch and two requests queue behind it (one batch = 50 ms, taught):
    every later request with a 120 ms deadline (100 ms queued + 50 ms of its own) is answered
    BUSY by the socket thread from its header, never parsed nor submitted, and every refusal
    arrives while the slot is still held (an ordering, not a timing). Released, the held and the
    queued requests are answered."""
    server, request, reference = deployed
    pool, mode = server.pools[0], server.config.mode
    for cost in (10.0, 1000.0) * 200:  # seconds = 0.05 + 0 * cost per batch (older batches decayed away)
        server.admission.observe(mode, cost, 0.05)
    real_call, entered, release = pool.call_requests, threading.Event(), threading.Event()
    real_submit, submitted = server.intake.submit, []

    def held(*args, **kwargs):
        entered.set()
        release.wait(30)
        return real_call(*args, **kwargs)

    def counted(*args, **kwargs):
        submitted.append(args[0].request_id)
        return real_submit(*args, **kwargs)

    pool.call_requests, server.intake.submit = held, counted
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.zmq_endpoint)
    tables = wire.request_tables(request)

    def send(rid: str, deadline_ms: float = 120.0) -> None:
        header = {"kind": "TASK", "op": "answer", "request_id": rid, "deadline_ms": deadline_ms, "tag": rid}
        sock.send_multipart(protocol.encode(header, tables))

    def reply() -> dict:
        assert sock.poll(30_000), "no reply"
        return protocol.decode(sock.recv_multipart())[0]

    try:
        send("held", 60_000.0)  # the first three may wait as long as the test holds the slot
        assert entered.wait(30)  # the slot is taken
        send("q1", 60_000.0)
        send("q2", 60_000.0)
        for _ in range(3000):  # queued once parsed (a loaded test machine may take seconds)
            if len(server.scheduler) == 2:
                break
            threading.Event().wait(0.01)
        assert len(server.scheduler) == 2
        for i in range(15):
            send(f"late{i}")
        refusals = [reply() for _ in range(15)]
        still_held = not release.is_set()
        release.set()
        answers = {h["request_id"]: h for h in (reply() for _ in range(3))}
    finally:
        release.set()
        pool.call_requests, server.intake.submit = real_call, real_submit
        sock.close(0)
    assert still_held and all(h["kind"] == "BUSY" and h["status"] == "busy" for h in refusals)
    assert sorted(h["tag"] for h in refusals) == sorted(f"late{i}" for i in range(15))
    assert all("deadline of 120 ms" in h["error"] and h["retry_after_s"] >= 1 for h in refusals)
    # the refused ones were never parsed nor submitted (q1 and q2 are parsed side by side: either order)
    assert submitted[0] == "held" and sorted(submitted[1:]) == ["q1", "q2"] and len(submitted) == 3
    assert {rid: h["kind"] for rid, h in answers.items()} == {"held": "RESULT", "q1": "RESULT", "q2": "RESULT"}
    still_answers(server, request, reference)
