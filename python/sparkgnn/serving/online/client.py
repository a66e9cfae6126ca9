"""sparkgnn.serving.Client: ask a running service (serving.online.server) over ZeroMQ or HTTP.

ZeroMQ (`tcp://...`): one DEALER socket; requests go out as the messenger's frames (JSON header
+ one packed buffer, or Arrow tables with `packed=False`: serving.online.wire) and may be many
in flight (`send` / `receive`, what the load generator uses); `answer` is the blocking
one-request form. HTTP (`http://...`): JSON, one
request per call, through the standard library's urllib (a client needs no extra package).
Every wait has a timeout (`timeout_s`): a silent service is an error, not a hang.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import zmq

from sparkgnn.errors import SparkGNNError
from sparkgnn.messenger import protocol
from sparkgnn.messenger.security import client_keys_for, make_client
from sparkgnn.serving.online import wire
from sparkgnn.serving.online.bodies import typed_request_json
from sparkgnn.serving.request import Request

if TYPE_CHECKING:
    from sparkgnn.serving.typed import TypedRequest


class ServiceError(SparkGNNError, RuntimeError):
    """The service refused or failed a request (the message is the service's), or is busy."""


class ServiceBusy(ServiceError):
    """The service's queue is full: retry later (back-pressure)."""


@dataclass
class Reply:
    request_id: str
    nodes: np.ndarray
    h: np.ndarray
    pred: np.ndarray | None
    queue_ms: float
    service_ms: float
    batch_requests: int
    pool: str
    version: int = 0  # the service's version (Server.swap) that answered


@dataclass
class TypedReply:
    """A typed service's answer (typed_service.py), per output node type: the query ids in
    request order (`nodes`), their output rows (`h`) and, for a classifier, `pred`."""

    request_id: str
    mode: str
    nodes: dict[str, np.ndarray]
    h: dict[str, np.ndarray]
    pred: dict[str, np.ndarray] | None
    queue_ms: float
    service_ms: float
    version: int = 0


class Client:
    def __init__(
        self,
        endpoint: str,
        timeout_s: float = 30.0,
        token: str | None = None,
        curve_server_key=None,
        *,
        ca_file: str | None = None,
        keys_dir: str | None = None,
        packed: bool = True,
    ):
        """`ca_file`: PEM certificates an https:// service's certificate must chain to (a
        self-signed one: itself); default: the system's trusted ones. `keys_dir`: this client's
        CURVE keys for a keyed ZeroMQ front (client.key_secret, listed in the service's
        authorized_clients/, and server.key, pinned unless `curve_server_key` is given). `packed`:
        ZeroMQ requests as one packed buffer (wire.pack_request; the service answers in kind, the
        cheaper layout for it to read), else as Arrow tables."""
        self.endpoint, self.timeout_s, self.token = endpoint, float(timeout_s), token
        self.packed = bool(packed)
        self._ssl = None
        if endpoint.startswith("https://"):
            import ssl

            self._ssl = ssl.create_default_context(cafile=ca_file)
        self._sock: zmq.Socket | None = None
        if endpoint.startswith(("tcp://", "ipc://")):
            keys = client_keys_for(keys_dir, curve_server_key)
            self._sock = zmq.Context.instance().socket(zmq.DEALER)
            self._sock.setsockopt(zmq.LINGER, 0)
            if keys is not None:
                make_client(self._sock, keys)
            self._sock.connect(endpoint)
        elif not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint {endpoint!r}: expected tcp://, ipc:// or http(s)://")

    def answer(self, request: Request, mode: str | None = None) -> Reply:
        if self._sock is None:
            return self._answer_http(request, mode)
        self.send(request, mode)
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            got = self.receive(left)
            if got is None:
                raise ServiceError(f"no answer from {self.endpoint} within {self.timeout_s} s")
            if got[0] == request.request_id:
                return _raise_or_reply(*got)

    def send(self, request: Request, mode: str | None = None, tag=None) -> None:
        header = {"kind": "TASK", "op": "answer", "request_id": request.request_id, "tag": tag}
        if mode:
            header["mode"] = mode
        assert self._sock is not None, "send/receive need a ZeroMQ endpoint"
        if self.packed:
            frames = wire.packed_frames(header, "TASK", *wire.pack_request(request))
        else:
            frames = protocol.encode(header, wire.request_tables(request))
        self._sock.send_multipart(frames, copy=False)

    def receive(self, timeout_s: float) -> tuple | None:
        """(request_id, header, tables) of the next reply, or None after timeout_s. A packed
        answer is given as the Arrow table an unpacked one is (`answer`: node, h, pred)."""
        assert self._sock is not None, "send/receive need a ZeroMQ endpoint"
        if not self._sock.poll(max(0, int(timeout_s * 1000))):
            return None
        frames = self._sock.recv_multipart(copy=False)
        header = protocol.peek_header(frames)
        packed = header.get(wire.PACKED)
        if packed is None:
            header, tables = protocol.decode(frames)
        else:
            node, h, pred = wire.unpack_answer(packed, wire.packed_payload(header, frames[1:]))
            tables = {"answer": wire.client_answer_table(node, h, pred)}
        return str(header.get("request_id")), header, tables

    def _answer_http(self, request: Request, mode: str | None) -> Reply:
        body = {
            "request_id": request.request_id,
            "nodes": [{"id": int(q), "x": row.tolist()} for q, row in zip(request.qid, request.x, strict=True)],
            "edges": [[int(s), int(d)] for s, d in zip(request.src, request.dst, strict=True)],
        }
        if mode:
            body["mode"] = mode
        data = self._post("/v1/answer", body, self.timeout_s)
        answers = data["answers"]
        h = np.asarray([a["h"] for a in answers], np.float32)
        pred = np.asarray([a["pred"] for a in answers], np.int64) if answers and "pred" in answers[0] else None
        return Reply(
            data["request_id"],
            np.asarray([a["node"] for a in answers], np.int64),
            h,
            pred,
            data["queue_ms"],
            data["service_ms"],
            data["batch_requests"],
            data["pool"],
            int(data.get("version", 0)),
        )

    def answer_typed(self, request: TypedRequest, mode: str | None = None) -> TypedReply:
        """Ask a typed service (HTTP endpoints) to answer a TypedRequest (POST /v1/answer with
        bodies.typed_request_json): its TypedReply, or ServiceError with the refusal."""
        if self._sock is not None:
            raise ValueError("a typed service answers over HTTP only: give its http:// endpoint")
        data = self._post("/v1/answer", typed_request_json(request, mode), self.timeout_s)
        grouped: dict[str, list[dict]] = {}
        for answer in data["answers"]:
            grouped.setdefault(answer["type"], []).append(answer)
        classifier = any("pred" in a for a in data["answers"])
        return TypedReply(
            data["request_id"],
            data["mode"],
            {t: np.asarray([a["node"] for a in rows], np.int64) for t, rows in grouped.items()},
            {t: np.asarray([a["h"] for a in rows], np.float32) for t, rows in grouped.items()},
            {t: np.asarray([a["pred"] for a in rows], np.int64) for t, rows in grouped.items()} if classifier else None,
            data["queue_ms"],
            data["service_ms"],
            int(data.get("version", 0)),
        )

    def swap(self, graph: str, store: str | None = None, timeout_s: float = 300.0) -> dict:
        """Ask the service to serve another version (POST /v1/admin/swap; HTTP endpoints, and
        the service's token): the swap's report, or ServiceError with the refusal."""
        if self._sock is not None:
            raise ValueError("swap is an HTTP admin operation: give the service's http:// endpoint")
        body: dict = {"graph": str(graph), "timeout_s": float(timeout_s)}
        if store is not None:
            body["store"] = str(store)
        return self._post("/v1/admin/swap", body, max(self.timeout_s, timeout_s + 30.0))["swap"]

    def _post(self, path: str, body: dict, timeout_s: float) -> dict:
        """POST `body` as JSON to the HTTP endpoint's `path` (with the token when given): the
        reply's JSON, or ServiceBusy (503) / ServiceError naming the service's refusal."""
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        url = f"{self.endpoint}{path}"
        req = urllib.request.Request(url, json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=self._ssl) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            data = json.loads(exc.read() or b"{}")
            if exc.code == 503:
                raise ServiceBusy(data.get("error", "busy")) from None
            raise ServiceError(data.get("error", f"HTTP {exc.code}")) from None
        except urllib.error.URLError as exc:
            raise ServiceError(f"no service at {self.endpoint}: {exc.reason}") from None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _raise_or_reply(request_id: str, header: dict, tables: dict) -> Reply:
    kind = header.get("kind")
    if kind == "BUSY":
        raise ServiceBusy(header.get("error", "busy"))
    if kind != "RESULT":
        raise ServiceError(header.get("error", f"the service answered {kind}"))
    nodes, h, pred = wire.answer_arrays(tables["answer"])
    return Reply(
        request_id,
        nodes,
        h,
        pred,
        float(header.get("queue_ms", 0.0)),
        float(header.get("service_ms", 0.0)),
        int(header.get("batch_requests", 0)),
        str(header.get("pool", "")),
        int(header.get("version") or 0),
    )


def reply_of(received: tuple) -> Reply:
    """A received (request_id, header, tables) as a Reply, raising the service's error."""
    return _raise_or_reply(*received)
