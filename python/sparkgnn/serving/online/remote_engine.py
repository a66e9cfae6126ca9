"""RemoteEngine: a QueryEngine-shaped view of a running service (`--engine serve://...`).

WHY: the streaming job answers each micro-batch through `engine.answer(request)`; with this
object the answering happens in the online service's workers (their scheduler, pools and hot
caches), and the job's driver only reads request files and writes answers. A BUSY service is
retried with a growing pause until `timeout_s` has passed (back-pressure slows the stream
instead of failing requests); any other refusal is the service's error, raised as ServiceError
(a SparkGNNError, so the stream writes it as that request's error row).
"""

from __future__ import annotations

import time

from sparkgnn.serving.modes import Answer
from sparkgnn.serving.online.client import Client, ServiceBusy, ServiceError
from sparkgnn.serving.request import Request

SCHEME = "serve://"


class RemoteEngine:
    def __init__(self, url: str, mode: str | None = None, timeout_s: float = 60.0, token: str | None = None):
        if not url.startswith(SCHEME):
            raise ValueError(f"engine {url!r}: expected {SCHEME}tcp://HOST:PORT or {SCHEME}http://HOST:PORT")
        self.endpoint = url[len(SCHEME) :]
        self.mode_name = mode or "service default"
        self._mode = mode
        self.timeout_s = float(timeout_s)
        self.client = Client(self.endpoint, timeout_s=timeout_s, token=token)

    def answer(self, request: Request) -> Answer:
        deadline = time.monotonic() + self.timeout_s
        pause = 0.005
        while True:
            try:
                reply = self.client.answer(request, mode=self._mode)
                break
            except ServiceBusy as exc:
                if time.monotonic() + pause > deadline:
                    raise ServiceError(
                        f"the service at {self.endpoint} stayed busy for {self.timeout_s} s: {exc}"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
        breakdown = {
            "queue_ms": reply.queue_ms,
            "service_ms": reply.service_ms,
            "batch_requests": reply.batch_requests,
        }
        return Answer(reply.nodes, reply.h, reply.pred, breakdown)

    def close(self) -> None:
        self.client.close()
