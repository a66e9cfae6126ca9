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
"""
from __future__ import annotations

import itertools
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import zmq

from sparkgnn.messenger import endpoints, memory, shm, sockets, verify
from sparkgnn.messenger.errors import (BrokerUnreachableError, MessageTooLargeError, NoWorkerError,
                                       RemoteTaskError, TransportError, size_text)
from sparkgnn.messenger.protocol import (DEFAULT_MAX_MESSAGE_BYTES, Kind, MessageTooLarge,
                                          ProtocolError, control, decode_payload, encode_header,
                                          peek_header, serialize_table, stamp)
from sparkgnn.messenger.protocol import frame_buffer


_WAITING, _SENT, _DONE, _FAILED = "waiting", "sent", "done", "failed"

# How long a batch waits for a broker that never answers / for a worker to connect to a broker
# that has none. Short enough that a wrong address fails while the user still watches, long
# enough for a broker or a worker (torch import) that is being started at the same time.
CONNECT_TIMEOUT_S = 15.0
NO_WORKER_TIMEOUT_S = 15.0


def _nbytes(frame) -> int:
    return frame.size if hasattr(frame, "size") and not isinstance(frame, (bytes, bytearray)) else len(frame)


def unreachable_message(endpoint: str, timeout_s: float) -> str:
    return (f"no broker answered at {endpoint} within {timeout_s:g} s: start one with "
            f"`sparkgnn-broker --front {endpoint} --back <worker endpoint>` (clients connect to "
            f"its --front endpoint), or check the address")


def no_worker_message(endpoint: str, back: str | None, timeout_s: float) -> str:
    where = back or "<the broker's --back endpoint>"
    return (f"no worker is connected to the broker at {endpoint} (none for {timeout_s:g} s): start "
            f"one with `sparkgnn-worker --connect {where} --model-store DIR`")


def too_large_message(header: dict, size: int, limit: int, whose: str, remedy: str,
                      what: str = "") -> str:
    """'batch 17 of job 'x' (op 'y') is 300.0 MiB (N bytes), over worker W's message limit of
    256.0 MiB, max_message_bytes=L: <remedy>, or send smaller batches (more partitions)'."""
    subject = f"{what} batch" if what else "batch"
    return (f"{subject} {header.get('batch')!r} of job {header.get('job')!r} (op {header.get('op')!r}) "
            f"is {size_text(size)} ({size} bytes), over {whose} message limit of {size_text(limit)}, "
            f"max_message_bytes={limit}: {remedy}, or send smaller batches (more partitions)")


@dataclass
class _Batch:
    seq: int
    header: dict                  # the caller's header + kind/batch/job (unstamped)
    tables: dict | None           # the request tables (kept until done: a retry may re-encode)
    nbytes: int                   # total size of the Arrow IPC streams
    ids: str | None               # digest of the request's id column, or None
    framed: tuple | None = None   # (stamped header, payload Buffers) for the frames route
    segment: object = None        # shm.Segment holding the streams, for the shm route
    shm_header: dict | None = None
    replies: dict = field(default_factory=dict)  # lease -> shm.Segment offered for the result
    state: str = _WAITING
    tries: int = 0
    token: str = ""
    lease: object = None
    worker: str | None = None
    deadline: float = 0.0
    retry_lease_at: float = 0.0
    asking_since: float = 0.0     # when this attempt started asking the broker for a worker
    reason: str = ""
    result: tuple | None = None
    error: Exception | None = None
    history: list = field(default_factory=list)


class MessengerTransport:
    """Dealer client of a messenger broker at `endpoint` (its front socket)."""

    def __init__(self, endpoint: str, timeout_s: float = 60.0, retries: int = 3, window: int = 4,
                 curve_server_key=None, *, heartbeat_s: float = 1.0, liveness: int = 3,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, job: str | None = None,
                 context: zmq.Context | None = None, tune_malloc: bool = True,
                 shm_payloads: bool = True, shm_min_bytes: int = 256 * 1024,
                 connect_timeout_s: float | None = CONNECT_TIMEOUT_S,
                 no_worker_timeout_s: float | None = NO_WORKER_TIMEOUT_S):
        endpoints.check_connect(endpoint)
        if tune_malloc:
            memory.tune_malloc()
        self.endpoint = endpoint
        # 0 / None: wait as long as timeout_s x retries allow (the behaviour before these existed)
        self.connect_timeout_s = connect_timeout_s or None
        self.no_worker_timeout_s = no_worker_timeout_s or None
        self._last_heard = float("-inf")      # any message from the broker, ever
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
        self._pool = (shm.SegmentPool(self._client, max_free=2 * max(2, window))
                      if shm_payloads and shm.supported() else None)
        # segments are files in /dev/shm: unlink them when the transport is collected or the
        # interpreter exits without close() (a cached transport in a Spark Python worker)
        self._finalizer = weakref.finalize(self, self._pool.close) if self._pool is not None else None
        self._shm_ok = True
        self.shm_min_bytes = shm_min_bytes  # below this, mapping a segment costs more than a copy
        self._host = shm.host_id()
        self._no_shm: set[str] = set()
        self._result_sizes: dict = {}  # op -> largest result seen: sizes the reply segments
        self._seq = itertools.count()
        self._batches: dict[int, _Batch] = {}
        self._data: dict[str, zmq.Socket] = {}
        self._poller = zmq.Poller()
        self._broker = None
        self._closed = False
        self.counts = dict(sent=0, sent_shm=0, results=0, duplicates=0, resent=0, busy=0, broker_reconnects=0,
                           bad_results=0, orphans=0)
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
        order: deque[_Batch] = deque()
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
                if head.state == _DONE:
                    order.popleft()
                    self._batches.pop(head.seq, None)
                    yield head.result
                    continue
                failed = next((b for b in order if b.state == _FAILED), None)
                if failed is not None:
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
        return broker_stats(self.endpoint, timeout_s, self.curve_server_key, self._context)

    # -- submission ------------------------------------------------------------------------
    def _submit(self, header: dict, tables: dict) -> _Batch:
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
            raise MessageTooLargeError(too_large_message(
                header, size, self.max_message_bytes, "this client's",
                "pass a larger max_message_bytes to the transport"))
        header["kind"] = Kind.TASK.value
        batch = _Batch(seq, header, tables, size, verify.request_ids(header, tables))
        self._batches[seq] = batch
        self._new_attempt(batch, time.monotonic(), "")
        return batch

    def _new_attempt(self, batch: _Batch, now: float, reason: str) -> None:
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
        batch.lease, batch.state = None, _WAITING
        batch.deadline = now + self.timeout_s
        batch.asking_since = now
        self._ask_lease(batch)

    def _ask_lease(self, batch: _Batch) -> None:
        h = batch.header
        self._send_broker(control(Kind.LEASE, token=batch.token, batch=h.get("batch"), op=h.get("op"),
                                  ttl=self.timeout_s, affinity=h.get("affinity")))
        batch.retry_lease_at = 0.0

    def _abandon(self, batch: _Batch) -> None:
        if batch.state in (_WAITING, _SENT):
            self._send_broker(control(Kind.RELEASE, lease=batch.lease, token=batch.token))
            batch.state = _FAILED
            batch.error = TransportError(self._describe(batch, "abandoned"))
        self._drop_payload(batch, reusable=False)
        self._batches.pop(batch.seq, None)

    def _give_up(self, batch: _Batch, error: Exception) -> None:
        """Fail a batch that may hold a lease or a queued request: tell the broker first, so a
        worker that turns up later is not leased to a batch nobody waits for."""
        self._send_broker(control(Kind.RELEASE, lease=batch.lease, token=batch.token))
        self._fail(batch, error)

    def _fail(self, batch: _Batch, error: Exception) -> None:
        batch.state, batch.error = _FAILED, error
        self._drop_payload(batch, reusable=False)

    def _drop_payload(self, batch: _Batch, reusable: bool) -> None:
        """Return the batch's segment to the pool (or retire it) and drop its encodings."""
        if batch.segment is not None:
            self._pool.release(batch.segment, reusable)
            if not reusable:
                self.counts["shm_retired"] = self.counts.get("shm_retired", 0) + 1
        for segment in batch.replies.values():
            # reply segments are private copies' sources; only a second sender could still write
            self._pool.release(segment, batch.tries == 1)
        batch.replies = {}
        batch.segment = batch.shm_header = batch.framed = batch.tables = None

    def _describe(self, batch: _Batch, what: str) -> str:
        h = batch.header
        detail = f"; last: {batch.reason}" if batch.reason else ""
        return (f"batch {h.get('batch')!r} op {h.get('op')!r} (job {h.get('job')!r}) via broker "
                f"{self.endpoint}, last worker {batch.worker or 'none'}: {what}{detail}")

    # -- event loop ------------------------------------------------------------------------
    def _pump(self) -> None:
        now = time.monotonic()
        live = [b for b in self._batches.values() if b.state in (_WAITING, _SENT)]
        wake = min([b.deadline for b in live] + [b.retry_lease_at for b in live if b.retry_lease_at]
                   + [self._next_ping, now + 0.1])
        for sock, _ in self._poller.poll(max(0.0, wake - now) * 1000):
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
            if batch.state not in (_WAITING, _SENT):
                continue
            if now >= batch.deadline:
                what = "no worker assigned" if batch.state == _WAITING else "no result"
                self._new_attempt(batch, now, f"{what} within timeout_s={self.timeout_s}")
            elif batch.state == _WAITING and batch.retry_lease_at and now >= batch.retry_lease_at:
                self._ask_lease(batch)
            waiting = waiting or batch.state == _WAITING
        if not waiting:
            self._broker_heard = now  # only judge the broker while we need it
            self._no_workers_since = None
            self._next_ping = now + self.heartbeat_s
            return
        if self._fail_stalled(now):
            return
        if now - self._broker_heard > self.heartbeat_s * self.liveness:
            self._reconnect_broker(now)
        elif now >= self._next_ping:
            self._send_broker(control(Kind.HEARTBEAT))
            self._next_ping = now + self.heartbeat_s

    def _fail_stalled(self, now: float) -> bool:
        """Fail every batch that waits for a worker which cannot come: no broker has answered
        since it started asking (connect_timeout_s), or the broker has reported no connected
        worker for no_worker_timeout_s. Whether any batch failed."""
        failed = False
        for batch in list(self._batches.values()):
            if batch.state != _WAITING:
                continue
            error = self._stall(batch, now)
            if error is not None:
                self._give_up(batch, error)
                failed = True
        return failed

    def _stall(self, batch: _Batch, now: float) -> TransportError | None:
        h = batch.header
        what = f"batch {h.get('batch')!r} op {h.get('op')!r} (job {h.get('job')!r}) cannot run"
        if (self.connect_timeout_s and self._last_heard < batch.asking_since
                and now - batch.asking_since >= self.connect_timeout_s):
            return BrokerUnreachableError(f"{what}: {unreachable_message(self.endpoint, self.connect_timeout_s)}")
        if (self.no_worker_timeout_s and self._no_workers_since is not None
                and now - max(self._no_workers_since, batch.asking_since) >= self.no_worker_timeout_s):
            return NoWorkerError(f"{what}: {no_worker_message(self.endpoint, self._broker_back, self.no_worker_timeout_s)}")
        return None

    def _on_broker(self, frames) -> None:
        try:
            header = peek_header(frames, sockets.CONTROL_MAX_BYTES)
        except ProtocolError:
            self.counts["orphans"] += 1
            return
        now = self._broker_heard = self._last_heard = time.monotonic()
        self._backoff = self.heartbeat_s
        kind = header["kind"]
        batch = self._by_token(header.get("token"))
        if kind == Kind.HEARTBEAT.value:
            self._on_broker_heartbeat(header, now)
        elif kind == Kind.ASSIGN.value:
            self._no_workers_since = None
            self._on_assign(batch, header)
        elif kind == Kind.BUSY.value and batch is not None and batch.state == _WAITING:
            self.counts["busy"] += 1
            retry_after = header.get("retry_after")
            retry_after = retry_after if isinstance(retry_after, (int, float)) else self.heartbeat_s
            batch.retry_lease_at = time.monotonic() + min(max(retry_after, 0.001), self.heartbeat_s)

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

    def _on_assign(self, batch: _Batch | None, header: dict) -> None:
        lease, data = header.get("lease"), header.get("data")
        if batch is None or batch.state not in (_WAITING, _SENT) or not isinstance(data, str):
            self._send_broker(control(Kind.RELEASE, lease=lease))
            return
        if lease == batch.lease:
            return  # the broker repeating itself (idempotent LEASE)
        if batch.state == _SENT and not header.get("requeued"):
            self._send_broker(control(Kind.RELEASE, lease=lease))
            return
        if batch.state == _SENT:  # requeued: the worker we sent to was declared dead
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
        batch.lease, batch.worker, batch.state = lease, data, _SENT
        batch.deadline = now + self.timeout_s
        use_shm = (self._pool is not None and self._shm_ok and header.get("shm")
                   and batch.nbytes >= self.shm_min_bytes and header.get("host") == self._host
                   and data not in self._no_shm)
        try:
            frames = self._task_frames(batch, use_shm, lease)
        except OSError as exc:  # /dev/shm full or unavailable: frames from now on
            self._shm_ok = False
            frames = self._task_frames(batch, False, lease)
            batch.history.append(f"shared memory unavailable ({exc}); using frames")
        wire = sum(_nbytes(f) for f in frames)
        if isinstance(cap, int) and len(frames) > 1 and wire > cap:
            # the payload fits but not with its header: the worker counts whole messages
            self._refuse_oversize(batch, lease, wire, cap, data)
            return
        sock = self._data_socket(data, header.get("curve"))
        try:
            sock.send_multipart(frames, copy=False)
            self.counts["sent"] += 1
            self.counts["sent_shm"] += use_shm and len(frames) == 1
        except zmq.ZMQError as exc:
            self._new_attempt(batch, now, f"send to {data} failed: {exc}")

    def _refuse_oversize(self, batch: _Batch, lease, size: int, cap: int, worker: str) -> None:
        self._send_broker(control(Kind.RELEASE, lease=lease))
        batch.worker = worker
        self._fail(batch, MessageTooLargeError(too_large_message(
            batch.header, size, cap, f"worker {worker}'s",
            "start the worker with a larger --max-message-bytes")))

    def _task_frames(self, batch: _Batch, use_shm: bool, lease) -> list:
        """The TASK for this attempt: header naming the shm segment, or header + payload frames.
        Each encoding is made once per batch and reused by retries."""
        extra = dict(token=batch.token, lease=lease, attempt=batch.tries,
                     max_result_bytes=self.max_message_bytes)
        if use_shm:
            if batch.segment is None:
                segment = self._pool.acquire(batch.nbytes)
                try:
                    parts, views = segment.write_tables(batch.tables.values())
                    stamped = stamp(batch.header, Kind.TASK.value, batch.tables, views)
                    del views
                except BaseException:
                    self._pool.release(segment, reusable=False)
                    raise
                stamped["shm"] = {"name": segment.name, "parts": parts}
                batch.segment, batch.shm_header = segment, stamped
            reply = self._reply_offer(batch, lease)
            if reply is not None:
                extra["reply_shm"] = reply
            return [encode_header(dict(batch.shm_header, **extra))]
        if batch.framed is None:
            payload = [serialize_table(t) for t in batch.tables.values()]
            batch.framed = (stamp(batch.header, Kind.TASK.value, batch.tables, payload), payload)
        stamped, payload = batch.framed
        return [encode_header(dict(stamped, **extra))] + payload

    def _reply_offer(self, batch: _Batch, lease) -> dict | None:
        """A segment for the worker to write the result into, sized from the largest result this
        op returned so far (the first result of an op comes back as frames)."""
        size = self._result_sizes.get(batch.header.get("op"), 0)
        if size < self.shm_min_bytes:
            return None
        try:
            segment = self._pool.acquire(size)
        except OSError:
            return None
        batch.replies[lease] = segment
        return {"name": segment.name, "size": segment.size}

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
        if batch is None or batch.state not in (_WAITING, _SENT):
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
            if batch.state == _SENT and header.get("token") == batch.token:
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
                err = RemoteTaskError(self._describe(batch, message))
                err.remote_traceback = header.get("traceback")
                self._fail(batch, err)
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
        if batch.state == _WAITING:  # an earlier attempt answered after all: cancel the new ask
            self._send_broker(control(Kind.RELEASE, lease=batch.lease, token=batch.token))
        batch.state, batch.result = _DONE, (header, tables)
        self._drop_payload(batch, reusable=batch.tries == 1 and header.get("shm_pinned") is False)
        self.counts["results"] += 1

    def _refused_as_too_large(self, batch: _Batch, header: dict) -> MessageTooLargeError:
        """The worker's too_large ERROR as the same error a pre-send check raises."""
        size, limit = header.get("size"), header.get("limit")
        worker = header.get("worker") or batch.worker
        if isinstance(size, int) and isinstance(limit, int):
            return MessageTooLargeError(too_large_message(
                batch.header, size, limit, f"worker {worker}'s",
                "start the worker with a larger --max-message-bytes"))
        return MessageTooLargeError(self._describe(batch, f"worker {worker} refused it: {header.get('error')}"))

    def _on_oversize_result(self, exc: MessageTooLarge) -> None:
        """A reply over this dealer's cap: fail its batch by name (the header was readable) rather
        than drop it and wait for a timeout."""
        batch = self._by_seq_of((exc.header or {}).get("token"))
        if batch is None or batch.state not in (_WAITING, _SENT):
            self.counts["orphans"] += 1
            return
        self.counts["bad_results"] += 1
        self._give_up(batch, MessageTooLargeError(too_large_message(
            batch.header, exc.size, exc.limit, "this client's", "pass a larger max_message_bytes "
            "to the transport", what="the result of")))

    # -- lookup ----------------------------------------------------------------------------
    def _by_token(self, token) -> _Batch | None:
        batch = self._by_seq_of(token)
        return batch if batch is not None and batch.token == token else None

    def _by_seq_of(self, token) -> _Batch | None:
        """Any attempt's token finds its batch: results of earlier attempts are still valid."""
        if not isinstance(token, str):
            return None
        client, _, rest = token.partition(":")
        seq = rest.partition(":")[0]
        if client != self._client or not seq.isdigit():
            return None
        return self._batches.get(int(seq))

    # -- sockets ---------------------------------------------------------------------------
    def _open_broker(self) -> None:
        self._broker = sockets.make(self._context, zmq.DEALER, max_frame_bytes=sockets.CONTROL_MAX_BYTES,
                                    curve_server_key=self.curve_server_key)
        sockets.connect(self._broker, self.endpoint)
        self._poller.register(self._broker, zmq.POLLIN)
        self._broker_heard = time.monotonic()
        self._next_ping = self._broker_heard + self.heartbeat_s
        self._backoff = getattr(self, "_backoff", self.heartbeat_s)

    def _reconnect_broker(self, now: float) -> None:
        """Lazy Pirate: a silent broker gets a fresh socket and every waiting batch asks again."""
        self._poller.unregister(self._broker)
        self._broker.close(0)
        self.counts["broker_reconnects"] += 1
        backoff = self._backoff
        self._open_broker()
        self._broker_heard = now + backoff  # do not judge the new socket before backoff ends
        self._backoff = min(backoff * 2, 8 * self.heartbeat_s)
        for batch in self._batches.values():
            if batch.state == _WAITING:
                self._ask_lease(batch)

    def _send_broker(self, frames) -> None:
        try:
            self._broker.send_multipart(frames, zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # queue full / no peer: the liveness check reconnects

    def _forget_worker(self, endpoint: str | None, moving: _Batch) -> None:
        """Close the data socket of a worker the broker declared dead, unless another batch still
        waits on it (its result may yet come: a slow worker is not always a dead one)."""
        if endpoint is None or endpoint not in self._data:
            return
        if any(b is not moving and b.state == _SENT and b.worker == endpoint for b in self._batches.values()):
            return
        sock = self._data.pop(endpoint)
        self._poller.unregister(sock)
        sock.close(0)

    def _data_socket(self, endpoint: str, curve) -> zmq.Socket:
        sock = self._data.get(endpoint)
        if sock is None:
            key = curve or self.curve_server_key
            sock = sockets.make(self._context, zmq.DEALER, max_frame_bytes=self.max_message_bytes,
                                curve_server_key=key)
            sockets.connect(sock, endpoint)
            self._data[endpoint] = sock
            self._poller.register(sock, zmq.POLLIN)
        return sock


    def _reply_buffers(self, batch: _Batch, header: dict, nframes: int) -> list:
        """Copy a result out of the reply segment this dealer offered for that lease."""
        segment = batch.replies.get(header.get("lease"))
        ref = header["shm"]
        if nframes != 1 or segment is None or not isinstance(ref, dict) or ref.get("name") != segment.name:
            raise ProtocolError(f"result names a shared memory segment this dealer did not offer: {ref!r}")
        try:
            buffers = segment.copy_parts(ref.get("parts"))
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        self.counts["results_shm"] = self.counts.get("results_shm", 0) + 1
        return buffers


def broker_stats(endpoint: str, timeout_s: float = 5.0, curve_server_key=None,
                 context: zmq.Context | None = None) -> dict:
    """One STATS round trip to a broker's front endpoint; TransportError if it does not answer."""
    context = context or zmq.Context.instance()
    sock = sockets.make(context, zmq.DEALER, max_frame_bytes=sockets.CONTROL_MAX_BYTES,
                        curve_server_key=curve_server_key)
    try:
        sock.connect(endpoint)
        sock.send_multipart(control(Kind.STATS))
        if not sock.poll(timeout_s * 1000):
            raise TransportError(f"broker {endpoint} did not answer STATS within {timeout_s}s")
        header = peek_header(sock.recv_multipart(), sockets.CONTROL_MAX_BYTES)
        return header.get("metrics") or {}
    finally:
        sock.close(0)


def probe_broker(endpoint: str, connect_timeout_s: float | None = CONNECT_TIMEOUT_S,
                 no_worker_timeout_s: float | None = NO_WORKER_TIMEOUT_S, curve_server_key=None,
                 context: zmq.Context | None = None) -> dict:
    """Check, before a job depends on it, that a broker answers at `endpoint` (BrokerUnreachableError
    after connect_timeout_s) and that at least one worker is connected to it (waits up to
    no_worker_timeout_s for one, then NoWorkerError). Returns the broker's last HEARTBEAT answer.
    WHY: a driver that starts a Spark job against a wrong address would otherwise learn it from
    every task, deep in a JVM stack trace; 0 / None for a timeout waits without limit."""
    endpoints.check_connect(endpoint)
    context = context or zmq.Context.instance()
    sock = sockets.make(context, zmq.DEALER, max_frame_bytes=sockets.CONTROL_MAX_BYTES,
                        curve_server_key=curve_server_key)
    try:
        sockets.connect(sock, endpoint)
        answer = _ping(sock, connect_timeout_s)
        if answer is None:
            raise BrokerUnreachableError(unreachable_message(endpoint, connect_timeout_s))
        since = time.monotonic()
        while answer.get("live_workers") == 0:
            if no_worker_timeout_s and time.monotonic() - since >= no_worker_timeout_s:
                raise NoWorkerError(no_worker_message(endpoint, answer.get("back"), no_worker_timeout_s))
            time.sleep(0.2)
            answer = _ping(sock, connect_timeout_s)
            if answer is None:
                raise BrokerUnreachableError(unreachable_message(endpoint, connect_timeout_s))
        return answer
    finally:
        sock.close(0)


def _ping(sock: zmq.Socket, timeout_s: float | None, resend_s: float = 0.5) -> dict | None:
    """A HEARTBEAT round trip: the broker's answer header, or None when silent for timeout_s.
    The ping is repeated every resend_s, so a broker that starts while we wait still answers."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    while True:
        try:
            sock.send_multipart(control(Kind.HEARTBEAT), zmq.NOBLOCK)
        except zmq.Again:
            pass  # no pipe to queue it on yet: the next round sends it again
        resend_at = time.monotonic() + resend_s
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            wait = (resend_at if deadline is None else min(resend_at, deadline)) - now
            if wait <= 0:
                break
            if not sock.poll(wait * 1000):
                continue
            try:
                header = peek_header(sock.recv_multipart(), sockets.CONTROL_MAX_BYTES)
            except ProtocolError:
                continue
            if header["kind"] == Kind.HEARTBEAT.value:
                return header
