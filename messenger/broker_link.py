"""The dealer's link to its broker: one DEALER socket on the broker's front endpoint carrying only
control messages (LEASE, ASSIGN, BUSY, RELEASE, HEARTBEAT); payloads never cross it.

- Lazy Pirate: while a batch waits for a worker the dealer pings every `heartbeat_s`; after
  `liveness` silent intervals it reopens the socket (backoff doubling up to 8 heartbeats) and
  every waiting batch asks again, so a restarted broker picks up where the old one stopped.
- Stalls: a batch that has heard nothing from any broker since it started asking fails after
  `connect_timeout_s` (BrokerUnreachableError); one that waits while the broker reports no
  connected worker fails after `no_worker_timeout_s` (NoWorkerError).

A mixin of MessengerTransport (dealer.py), which sets the state annotated below in its __init__
and decides what each message means for its batches.
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from sparkgnn.messenger import security, sockets
from sparkgnn.messenger.batches import Batch
from sparkgnn.messenger.errors import (
    BrokerUnreachableError,
    NoWorkerError,
    TransportError,
    no_worker_message,
    unreachable_message,
)
from sparkgnn.messenger.protocol import Kind, ProtocolError, control, peek_header


class BrokerLink:
    # set by MessengerTransport.__init__
    endpoint: str
    _client_keys: security.ClientKeys | None
    heartbeat_s: float
    liveness: int
    connect_timeout_s: float | None
    no_worker_timeout_s: float | None
    counts: dict
    _context: zmq.Context
    _poller: zmq.Poller
    _broker: Any  # the socket, once _open_broker ran
    _last_heard: float  # any message from the broker, ever
    _no_workers_since: float | None  # the broker has reported 0 workers since
    _broker_back: str | None  # the broker's worker endpoint, from its answers
    # set here
    _broker_heard: float  # last message on the current socket (or when to judge it)
    _next_ping: float
    _backoff: float

    def _open_broker(self) -> None:
        self._broker = sockets.make(
            self._context, zmq.DEALER, max_frame_bytes=sockets.CONTROL_MAX_BYTES, client_keys=self._client_keys
        )
        sockets.connect(self._broker, self.endpoint)
        self._poller.register(self._broker, zmq.POLLIN)
        self._broker_heard = time.monotonic()
        self._next_ping = self._broker_heard + self.heartbeat_s
        self._backoff = getattr(self, "_backoff", self.heartbeat_s)

    def _reopen_broker(self, now: float) -> None:
        """Lazy Pirate: a silent broker gets a fresh socket (the dealer then has every waiting
        batch ask again)."""
        self._poller.unregister(self._broker)
        self._broker.close(0)
        self.counts["broker_reconnects"] += 1
        backoff = self._backoff
        self._open_broker()
        self._broker_heard = now + backoff  # do not judge the new socket before backoff ends
        self._backoff = min(backoff * 2, 8 * self.heartbeat_s)

    def _send_broker(self, frames) -> None:
        try:
            self._broker.send_multipart(frames, zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # queue full / no peer: the liveness check reconnects

    def _read_broker(self, frames) -> tuple[dict, float] | None:
        """A message from the broker: its header and when it was heard (the broker is alive), or
        None for one that is not a valid message (counted as an orphan)."""
        try:
            header = peek_header(frames, sockets.CONTROL_MAX_BYTES)
        except ProtocolError:
            self.counts["orphans"] += 1
            return None
        now = self._broker_heard = self._last_heard = time.monotonic()
        self._backoff = self.heartbeat_s
        return header, now

    def _on_broker_heartbeat(self, header: dict, now: float) -> None:
        """Remember whether the broker has a worker (a broker that does not say is trusted)."""
        live, back = header.get("live_workers"), header.get("back")
        if isinstance(back, str):
            self._broker_back = back
        if isinstance(live, int) and not isinstance(live, bool) and live == 0:
            if self._no_workers_since is None:
                self._no_workers_since = now
        else:
            self._no_workers_since = None

    def _broker_not_needed(self, now: float) -> None:
        """No batch waits for a worker: only judge the broker while we need it."""
        self._broker_heard = now
        self._no_workers_since = None
        self._next_ping = now + self.heartbeat_s

    def _broker_silent(self, now: float) -> bool:
        """Silent for `liveness` heartbeat intervals: time to reopen the socket."""
        return now - self._broker_heard > self.heartbeat_s * self.liveness

    def _ping_broker(self, now: float) -> None:
        """A HEARTBEAT when one is due (the answer says how many workers the broker has)."""
        if now >= self._next_ping:
            self._send_broker(control(Kind.HEARTBEAT))
            self._next_ping = now + self.heartbeat_s

    def _stall(self, batch: Batch, now: float) -> TransportError | None:
        """Why a waiting batch cannot get a worker (no broker, or a broker without workers, for
        too long), or None while it may still get one."""
        h = batch.header
        what = f"batch {h.get('batch')!r} op {h.get('op')!r} (job {h.get('job')!r}) cannot run"
        if (
            self.connect_timeout_s
            and self._last_heard < batch.asking_since
            and now - batch.asking_since >= self.connect_timeout_s
        ):
            return BrokerUnreachableError(f"{what}: {unreachable_message(self.endpoint, self.connect_timeout_s)}")
        if (
            self.no_worker_timeout_s
            and self._no_workers_since is not None
            and now - max(self._no_workers_since, batch.asking_since) >= self.no_worker_timeout_s
        ):
            waited = no_worker_message(self.endpoint, self._broker_back, self.no_worker_timeout_s)
            return NoWorkerError(f"{what}: {waited}")
        return None
