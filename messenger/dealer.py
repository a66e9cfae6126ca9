"""MessengerTransport: the dealer client used inside Spark tasks.

Per batch: LEASE to the broker -> ASSIGN(worker data endpoint) -> TASK straight to that worker ->
RESULT straight back; the broker never carries payload bytes (see broker.py for why). Batches are
encoded once (Arrow IPC into exactly sized buffers, hashed) and the same payload frames are
re-sent, copy=False, on every retry; only the small header changes.

Failure handling, each bounded by `timeout_s` per attempt and `retries` re-sends:
- worker dies: the broker expires it and re-ASSIGNs its leases (same token, requeued=True); the
  dealer re-sends the batch to the new worker. A slow result from the old worker still counts if
  it arrives first; whichever valid result comes second is dropped as a duplicate, so each batch
  is delivered exactly once.
- broker dies: results of batches already sent keep arriving (the data path does not cross the
  broker). Batches waiting for a lease ping the broker every heartbeat; after `liveness` silent
  intervals the dealer reconnects (fresh socket) and asks again, so a restarted broker picks up
  where the old one stopped; no broker within the attempt deadline -> TransportError naming the
  batch, op and endpoint.
- no broker at all: a batch that has heard nothing from the broker since it started asking
  fails after `connect_timeout_s` with BrokerUnreachableError (names the endpoint and the
  command that starts a broker) instead of waiting out `timeout_s` x `retries`.
- no worker: the broker's HEARTBEAT answers say how many workers are connected; a batch that
  waits while the broker reports none for `no_worker_timeout_s` fails with NoWorkerError.
- too large: a batch over the assigned worker's advertised limit (or this dealer's own) fails
  before sending with MessageTooLargeError; a worker refusing one answers an ERROR frame marked
  too_large (with both sizes), raised as the same error. Nothing oversize is dropped unanswered.
- queue full: the broker answers BUSY; the dealer waits `retry_after` and asks again. The dealer's
  own memory is bounded by the in-flight window.
- ERROR from the worker: raised at once as RemoteTaskError (handler errors are deterministic),
  unless marked retryable (the worker could not decode the frames).
Not thread-safe: one transport per Spark task / thread.

Its parts, one job each: batches.py (a batch's states), broker_link.py (the control socket to the
broker: liveness, reconnects, stalls), payload_route.py (shared memory segment or frames),
probe.py (broker checks without a batch: probe_broker, broker_stats); the refusals' texts are in
errors.py. This module is the state machine that ties them together, and the public API.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
import weakref
from collections import deque
from collections.abc import Iterable, Iterator

import zmq

from sparkgnn.messenger import endpoints, memory, security, shm, sockets, verify
from sparkgnn.messenger.batches import DONE, FAILED, SENT, WAITING, Batch
from sparkgnn.messenger.broker_link import BrokerLink
from sparkgnn.messenger.errors import (
    MessageTooLargeError,
    RemoteTaskError,
    TransportError,
    no_worker_message,
    too_large_message,
    unreachable_message,
)
from sparkgnn.messenger.payload_route import PayloadRoute, nbytes
from sparkgnn.messenger.probe import CONNECT_TIMEOUT_S, NO_WORKER_TIMEOUT_S, broker_stats, probe_broker
from sparkgnn.messenger.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Kind,
    MessageTooLarge,
    ProtocolError,
    control,
    decode_payload,
    frame_buffer,
    peek_header,
)

# What `from sparkgnn.messenger.dealer import ...` has always offered, now defined next door.
__all__ = [
    "MessengerTransport",
    "CONNECT_TIMEOUT_S",
    "NO_WORKER_TIMEOUT_S",
    "broker_stats",
    "probe_broker",
    "unreachable_message",
    "no_worker_message",
    "too_large_message",
]


class MessengerTransport(BrokerLink, PayloadRoute):
    """Dealer client of a messenger broker at `endpoint` (its front socket). With `keys_dir` (a
    folder with client.key_secret and server.key, security.py) every socket it opens is a CURVE
    client with that persistent key pair, pinning server.key (or `curve_server_key` when given)
    for the broker and every worker alike; without it, plain sockets (loopback brokers without
    keys)."""

    def __init__(
        self,
        endpoint: str,
        timeout_s: float = 60.0,
        retries: int = 3,
        window: int = 4,
        curve_server_key=None,
        *,
        heartbeat_s: float = 1.0,
        liveness: int = 3,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        job: str | None = None,
        context: zmq.Context | None = None,
        tune_malloc: bool = True,
        shm_payloads: bool = True,
        shm_min_bytes: int = 256 * 1024,
        connect_timeout_s: float | None = CONNECT_TIMEOUT_S,
        no_worker_timeout_s: float | None = NO_WORKER_TIMEOUT_S,
        keys_dir: str | os.PathLike | None = None,
    ):
        endpoints.check_connect(endpoint)
        self._client_keys = security.client_keys_for(keys_dir, curve_server_key)
        if tune_malloc:
            memory.tune_malloc()
        self.endpoint = endpoint
        # 0 / None: wait as long as timeout_s x retries allow (the behaviour before these existed)
        self.connect_timeout_s = connect_timeout_s or None
        self.no_worker_timeout_s = no_worker_timeout_s or None
        self._last_heard = float("-inf")  # any message from the broker, ever
        self._no_workers_since: float | None = None  # the broker has reported 0 workers since
        self._broker_back: str | None = None  # the broker's worker endpoint, from its answers
        self.timeout_s = timeout_s
        self.retries = retries
        self.window = window
        self.curve_server_key = curve_server_key
        self.heartbeat_s = heartbeat_s
        self.liveness = liveness
        self.max_message_bytes = max_message_bytes
        self.job = job
        self._context = context or zmq.Context.instance()
        self._client = uuid.uuid4().hex[:12]
        self._pool = (
            shm.SegmentPool(self._client, max_free=2 * max(2, window)) if shm_payloads and shm.supported() else None
        )
        # segments are files in /dev/shm: unlink them when the transport is collected or the
        # interpreter exits without close() (a cached transport in a Spark Python worker)
        self._finalizer = weakref.finalize(self, self._pool.close) if self._pool is not None else None
        self._shm_ok = True
        self.shm_min_bytes = shm_min_bytes  # below this, mapping a segment costs more than a copy
        self._host = shm.host_id()
        self._no_shm: set[str] = set()
        self._result_sizes: dict = {}  # op -> largest result seen: sizes the reply segments
        self._seq = itertools.count()
        self._batches: dict[int, Batch] = {}
        self._data: dict[str, zmq.Socket] = {}
        self._poller = zmq.Poller()
        self._broker = None
        self._closed = False
        self.counts = dict(
            sent=0, sent_shm=0, results=0, duplicates=0, resent=0, busy=0, broker_reconnects=0, bad_results=0, orphans=0
        )
        self._open_broker()

    # -- Transport interface ---------------------------------------------------------------
    def call(self, header: dict, tables: dict) -> tuple[dict, dict]:
        return next(iter(self.map([(header, tables)], window=1)))

    def map(self, requests: Iterable[tuple[dict, dict]], window: int | None = None) -> Iterator[tuple[dict, dict]]:
        """Results in request order, at most `window` batches in flight (encoded and unanswered)."""
        if self._closed:
            raise TransportError(f"transport to {self.endpoint} is closed")
        window = max(1, window or self.window)
        source = iter(requests)
        order: deque[Batch] = deque()
        exhausted = False
        try:
            while True:
                while not exhausted and len(order) < window:
                    try:
                        header, tables = next(source)
                    except StopIteration:
                        exhausted = True
                        break
                    order.append(self._submit(header, tables))
                if not order:
                    return
                head = order[0]
                if head.state == DONE:
                    order.popleft()
                    self._batches.pop(head.seq, None)
                    assert head.result is not None  # set together with DONE
                    yield head.result
                    continue
                failed = next((b for b in order if b.state == FAILED), None)
                if failed is not None:
                    assert failed.error is not None  # set together with FAILED
                    raise failed.error
                self._pump()
        finally:
            for batch in order:
                self._abandon(batch)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for batch in list(self._batches.values()):
            self._abandon(batch)
        for sock in [self._broker, *self._data.values()]:
            if sock is not None:
                sock.close(0)
        self._data.clear()
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def stats(self, timeout_s: float = 5.0) -> dict:
        """The broker's metrics (a STATS round trip on a throw-away socket)."""
        return broker_stats(self.endpoint, timeout_s, self._client_keys, self._context)

    # -- submission ------------------------------------------------------------------------
    def _submit(self, header: dict, tables: dict) -> Batch:
        seq = next(self._seq)
        header = dict(header)
        if header.get("batch") is None:
            header["batch"] = f"{self._client}-{seq}"
        if self.job is not None:
            header.setdefault("job", self.job)
        if any(b.header.get("batch") == header["batch"] for b in self._batches.values()):
            raise ValueError(f"batch id {header['batch']!r} is already in flight")
        tables = dict(tables)
        size = sum((n + 7) // 8 * 8 for n in shm.stream_sizes(tables.values()))
        if size > self.max_message_bytes:
            raise MessageTooLargeError(
                too_large_message(
                    header,
                    size,
                    self.max_message_bytes,
                    "this client's",
                    "pass a larger max_message_bytes to the transport",
                )
            )
        header["kind"] = Kind.TASK.value
        batch = Batch(seq, header, tables, size, verify.request_ids(header, tables))
        now = time.monotonic()
        if not any(b.state == WAITING for b in self._batches.values()):
            # Idle until now: nothing pumped, so the last word heard from the broker may be
            # older than `liveness` heartbeats. Judging it silent would reopen the socket right
            # after this batch's LEASE went out on the old one, and the worker the broker then
            # assigns to that lost ask would sit idle until its lease expired (2 x timeout_s).
            self._broker_not_needed(now)
        self._batches[seq] = batch
        self._new_attempt(batch, now, "")
        return batch

    def _new_attempt(self, batch: Batch, now: float, reason: str) -> None:
        if reason:
            batch.history.append(reason)
            batch.reason = reason
        if batch.lease is not None or batch.token:
            self._send_broker(control(Kind.RELEASE, lease=batch.lease, token=batch.token))
        if batch.tries > self.retries:
            self._fail(batch, TransportError(self._describe(batch, f"gave up after {batch.tries} attempts")))
            return
        batch.tries += 1
        if batch.tries > 1:
            self.counts["resent"] += 1
        batch.token = f"{self._client}:{batch.seq}:{batch.tries}"
        batch.lease, batch.state = None, WAITING
        batch.deadline = now + self.timeout_s
        batch.asking_since = now
        self._ask_lease(batch)

    def _ask_lease(self, batch: Batch) -> None:
        h = batch.header
        self._send_broker(
            control(
                Kind.LEASE,
                token=batch.token,
                batch=h.get("batch"),
                op=h.get("op"),
                ttl=self.timeout_s,
                affinity=h.get("affinity"),
            )
        )
        batch.retry_lease_at = 0.0

    def _abandon(self, batch: Batch) -> None:
        if batch.state in (WAITING, SENT):
            self._send_broker(control(Kind.RELEASE, lease=batch.lease, token=batch.token))
            batch.state = FAILED
            batch.error = TransportError(self._describe(batch, "abandoned"))
        self._drop_payload(batch, reusable=False)
        self._batches.pop(batch.seq, None)

    def _give_up(self, batch: Batch, error: Exception) -> None:
        """Fail a batch that may hold a lease or a queued request: tell the broker first, so a
        worker that turns up later is not leased to a batch nobody waits for."""
        self._send_broker(control(Kind.RELEASE, lease=batch.lease, token=batch.token))
        self._fail(batch, error)

    def _fail(self, batch: Batch, error: Exception) -> None:
        batch.state, batch.error = FAILED, error
        self._drop_payload(batch, reusable=False)

    def _describe(self, batch: Batch, what: str) -> str:
        h = batch.header
        detail = f"; last: {batch.reason}" if batch.reason else ""
        return (
            f"batch {h.get('batch')!r} op {h.get('op')!r} (job {h.get('job')!r}) via broker "
            f"{self.endpoint}, last worker {batch.worker or 'none'}: {what}{detail}"
        )

    # -- event loop ------------------------------------------------------------------------
    def _pump(self) -> None:
        now = time.monotonic()
        live = [b for b in self._batches.values() if b.state in (WAITING, SENT)]
        wake = min(
            [b.deadline for b in live]
            + [b.retry_lease_at for b in live if b.retry_lease_at]
            + [self._next_ping, now + 0.1]
        )
        for sock, _ in self._poller.poll(sockets.poll_ms(wake - now)):
            while not sock.closed:  # handling one message may close another worker's socket
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                if sock is self._broker:
                    self._on_broker(frames)
                else:
                    self._on_data(frames)
        self._on_time(time.monotonic())

    def _on_time(self, now: float) -> None:
        waiting = False
        for batch in list(self._batches.values()):
            if batch.state not in (WAITING, SENT):
                continue
            if now >= batch.deadline:
                what = "no worker assigned" if batch.state == WAITING else "no result"
                self._new_attempt(batch, now, f"{what} within timeout_s={self.timeout_s}")
            elif batch.state == WAITING and batch.retry_lease_at and now >= batch.retry_lease_at:
                self._ask_lease(batch)
            waiting = waiting or batch.state == WAITING
        if not waiting:
            self._broker_not_needed(now)
            return
        if self._fail_stalled(now):
            return
        if self._broker_silent(now):
            self._reconnect_broker(now)
        else:
            self._ping_broker(now)

    def _fail_stalled(self, now: float) -> bool:
        """Fail every batch that waits for a worker which cannot come: no broker has answered
        since it started asking (connect_timeout_s), or the broker has reported no connected
        worker for no_worker_timeout_s. Whether any batch failed."""
        failed = False
        for batch in list(self._batches.values()):
            if batch.state != WAITING:
                continue
            error = self._stall(batch, now)
            if error is not None:
                self._give_up(batch, error)
                failed = True
        return failed

    def _on_broker(self, frames) -> None:
        heard = self._read_broker(frames)
        if heard is None:
            return
        header, now = heard
        kind = header["kind"]
        batch = self._by_token(header.get("token"))
        if kind == Kind.HEARTBEAT.value:
            self._on_broker_heartbeat(header, now)
        elif kind == Kind.ASSIGN.value:
            self._no_workers_since = None
            self._on_assign(batch, header)
        elif kind == Kind.BUSY.value and batch is not None and batch.state == WAITING:
            self.counts["busy"] += 1
            retry_after = header.get("retry_after")
            retry_after = retry_after if isinstance(retry_after, (int, float)) else self.heartbeat_s
            batch.retry_lease_at = time.monotonic() + min(max(retry_after, 0.001), self.heartbeat_s)

    def _on_assign(self, batch: Batch | None, header: dict) -> None:
        lease, data = header.get("lease"), header.get("data")
        if batch is None or batch.state not in (WAITING, SENT) or not isinstance(data, str):
            self._send_broker(control(Kind.RELEASE, lease=lease))
            return
        if lease == batch.lease:
            return  # the broker repeating itself (idempotent LEASE)
        if batch.state == SENT and not header.get("requeued"):
            self._send_broker(control(Kind.RELEASE, lease=lease))
            return
        if batch.state == SENT:  # requeued: the worker we sent to was declared dead
            batch.history.append(f"worker {batch.worker} expired; requeued")
            self._forget_worker(batch.worker, batch)
            if batch.tries > self.retries:
                self._send_broker(control(Kind.RELEASE, lease=lease))
                self._fail(batch, TransportError(self._describe(batch, f"gave up after {batch.tries} attempts")))
                return
            batch.tries += 1
            self.counts["resent"] += 1
        now = time.monotonic()
        cap = header.get("max_bytes")
        if isinstance(cap, int) and batch.nbytes > cap:
            # the worker's socket would drop it unread and we would only see a timeout
            self._refuse_oversize(batch, lease, batch.nbytes, cap, data)
            return
        batch.lease, batch.worker, batch.state = lease, data, SENT
        batch.deadline = now + self.timeout_s
        frames, use_shm = self._frames_for(batch, header, data, lease)
        wire = sum(nbytes(f) for f in frames)
        if isinstance(cap, int) and len(frames) > 1 and wire > cap:
            # the payload fits but not with its header: the worker counts whole messages
            self._refuse_oversize(batch, lease, wire, cap, data)
            return
        sock = self._data_socket(data)
        try:
            sock.send_multipart(frames, copy=False)
            self.counts["sent"] += 1
            self.counts["sent_shm"] += use_shm and len(frames) == 1
        except zmq.ZMQError as exc:
            self._new_attempt(batch, now, f"send to {data} failed: {exc}")

    def _refuse_oversize(self, batch: Batch, lease, size: int, cap: int, worker: str) -> None:
        self._send_broker(control(Kind.RELEASE, lease=lease))
        batch.worker = worker
        self._fail(
            batch,
            MessageTooLargeError(
                too_large_message(
                    batch.header, size, cap, f"worker {worker}'s", "start the worker with a larger --max-message-bytes"
                )
            ),
        )

    def _on_data(self, frames) -> None:
        try:
            header = peek_header(frames, self.max_message_bytes)
        except MessageTooLarge as exc:
            self._on_oversize_result(exc)
            return
        except ProtocolError:
            self.counts["orphans"] += 1
            return
        batch = self._by_seq_of(header.get("token"))
        if batch is None or batch.state not in (WAITING, SENT):
            self.counts["duplicates" if batch is not None or header.get("token") else "orphans"] += 1
            return
        try:
            if header.get("shm") is not None:
                buffers = self._reply_buffers(batch, header, len(frames))
            else:
                buffers = [frame_buffer(f) for f in frames[1:]]
            header, tables = decode_payload(header, buffers, self.max_message_bytes)
        except ProtocolError as exc:
            self.counts["bad_results"] += 1
            if batch.state == SENT and header.get("token") == batch.token:
                self._new_attempt(batch, time.monotonic(), f"undecodable result: {exc}")
            return
        op = batch.header.get("op")
        self._result_sizes[op] = max(self._result_sizes.get(op, 0), sum(b.size for b in buffers))
        if header["kind"] == Kind.ERROR.value:
            if header.get("token") != batch.token:
                self.counts["duplicates"] += 1  # an earlier attempt's refusal; a later one is out
                return
            message = f"worker {header.get('worker') or batch.worker} answered ERROR: {header.get('error')}"
            if header.get("too_large"):
                self._fail(batch, self._refused_as_too_large(batch, header))
                return
            if header.get("error_type") == "ShmUnavailable" and batch.worker:
                self._no_shm.add(batch.worker)  # e.g. same host name, other /dev/shm: use frames
            if header.get("retryable"):
                self._new_attempt(batch, time.monotonic(), message)
            else:
                self._fail(batch, RemoteTaskError(self._describe(batch, message)))
            return
        if header["kind"] != Kind.RESULT.value:
            self.counts["bad_results"] += 1
            return
        try:
            verify.check_result(batch.header, header, tables, batch.ids)
        except ProtocolError as exc:
            self.counts["bad_results"] += 1
            self._new_attempt(batch, time.monotonic(), f"result failed verification: {exc}")
            return
        if batch.state == WAITING:  # an earlier attempt answered after all: cancel the new ask
            self._send_broker(control(Kind.RELEASE, lease=batch.lease, token=batch.token))
        batch.state, batch.result = DONE, (header, tables)
        self._drop_payload(batch, reusable=batch.tries == 1 and header.get("shm_pinned") is False)
        self.counts["results"] += 1

    def _refused_as_too_large(self, batch: Batch, header: dict) -> MessageTooLargeError:
        """The worker's too_large ERROR as the same error a pre-send check raises."""
        size, limit = header.get("size"), header.get("limit")
        worker = header.get("worker") or batch.worker
        if isinstance(size, int) and isinstance(limit, int):
            return MessageTooLargeError(
                too_large_message(
                    batch.header,
                    size,
                    limit,
                    f"worker {worker}'s",
                    "start the worker with a larger --max-message-bytes",
                )
            )
        return MessageTooLargeError(self._describe(batch, f"worker {worker} refused it: {header.get('error')}"))

    def _on_oversize_result(self, exc: MessageTooLarge) -> None:
        """A reply over this dealer's cap: fail its batch by name (the header was readable) rather
        than drop it and wait for a timeout."""
        batch = self._by_seq_of((exc.header or {}).get("token"))
        if batch is None or batch.state not in (WAITING, SENT):
            self.counts["orphans"] += 1
            return
        self.counts["bad_results"] += 1
        self._give_up(
            batch,
            MessageTooLargeError(
                too_large_message(
                    batch.header,
                    exc.size,
                    exc.limit,
                    "this client's",
                    "pass a larger max_message_bytes to the transport",
                    what="the result of",
                )
            ),
        )

    # -- lookup ----------------------------------------------------------------------------
    def _by_token(self, token) -> Batch | None:
        batch = self._by_seq_of(token)
        return batch if batch is not None and batch.token == token else None

    def _by_seq_of(self, token) -> Batch | None:
        """Any attempt's token finds its batch: results of earlier attempts are still valid."""
        if not isinstance(token, str):
            return None
        client, _, rest = token.partition(":")
        seq = rest.partition(":")[0]
        if client != self._client or not seq.isdigit():
            return None
        return self._batches.get(int(seq))

    # -- sockets ---------------------------------------------------------------------------
    def _reconnect_broker(self, now: float) -> None:
        """Lazy Pirate: a silent broker gets a fresh socket and every waiting batch asks again."""
        self._reopen_broker(now)
        for batch in self._batches.values():
            if batch.state == WAITING:
                self._ask_lease(batch)

    def _forget_worker(self, endpoint: str | None, moving: Batch) -> None:
        """Close the data socket of a worker the broker declared dead, unless another batch still
        waits on it (its result may yet come: a slow worker is not always a dead one)."""
        if endpoint is None or endpoint not in self._data:
            return
        if any(b is not moving and b.state == SENT and b.worker == endpoint for b in self._batches.values()):
            return
        sock = self._data.pop(endpoint)
        self._poller.unregister(sock)
        sock.close(0)

    def _data_socket(self, endpoint: str) -> zmq.Socket:
        """The DEALER to a worker's data socket. It pins the server key this transport was
        configured with, never the key a worker advertised through the broker: a worker holding
        another key completes no handshake and gets no task."""
        sock = self._data.get(endpoint)
        if sock is None:
            sock = sockets.make(
                self._context, zmq.DEALER, max_frame_bytes=self.max_message_bytes, client_keys=self._client_keys
            )
            sockets.connect(sock, endpoint)
            self._data[endpoint] = sock
            self._poller.register(sock, zmq.POLLIN)
        return sock
