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
    config = ServeConfig(graph=str(d / "g"), model=str(d / "model.pt"), mode="full", modes=["full", "ns"], http=None)
    request = skewed_workload.requests[0]
    with Server(config) as server:
        yield server, request, QueryEngine(G, model, mode="full")


def exchange(server, frames: list) -> dict:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.zmq_endpoint)
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
    assert "unknown header key 'mdoe'; expected one of: deadline_ms, mode, op, request_id, tag" in reply["error"]
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
        security.make_client(sock, client_keys)
        sock.connect(front.endpoint)
        try:
            sock.send_multipart([b"not a request"])
            return bool(sock.poll(300 if client_dir == stranger else 10_000))
        finally:
            sock.close(0)

    try:
        assert not ask(stranger) and server.refusals == 0  # unlisted: no handshake, nothing read
        assert ask(keys) and server.refusals == 1
    finally:
        stop.set()
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
