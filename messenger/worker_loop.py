"""The worker loop (Paranoid Pirate worker + a direct data socket): `Worker`, `serve`. The
executables around it (`python -m sparkgnn.messenger.worker`, `sparkgnn-worker`) share their
command line through worker.py, which also re-exports these two names.

Two threads, each owning its sockets (ZeroMQ sockets are not thread-safe):
- the *control* thread talks to the broker: READY, a HEARTBEAT every `heartbeat_s` (carrying the
  data endpoint, so a restarted broker re-learns the worker from any heartbeat), DONE per finished
  lease; when the broker is silent for `liveness` intervals it reconnects with exponential
  backoff. WHY a thread: a GNN layer can run for seconds; heartbeats from the task loop would
  stop meanwhile and the broker would expire a healthy worker and requeue its batch. A broker
  that has never answered within `connect_timeout_s` (a wrong --connect, no broker started)
  stops the worker with BrokerUnreachableError; once connected, a lost broker is waited for
  indefinitely (a restarted broker gets its workers back).
- the *task* loop (the caller's thread) owns the data ROUTER socket that dealers send TASKs to
  directly, decodes them (protocol.decode validates everything), runs the handler and answers
  RESULT, or ERROR when the frames are malformed or the handler raises, and keeps serving. A
  task over `max_message_bytes` is answered with an ERROR marked too_large, naming both
  sizes (never dropped unanswered, when its header frame is readable).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

import pyarrow as pa
import zmq

from sparkgnn.messenger import endpoints, security, shm, sockets
from sparkgnn.messenger.errors import BrokerUnreachableError
from sparkgnn.messenger.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    RESERVED,
    Handler,
    Kind,
    MessageTooLarge,
    ProtocolError,
    control,
    decode_payload,
    encode_header,
    frame_buffer,
    peek_header,
    serialize_table,
    stamp,
)

log = logging.getLogger(__name__)
_ECHOED = ("job", "batch", "op", "layer", "model", "token", "lease", "attempt")


class _Either:
    """Set when either event is: the control thread stops with the caller's stop_event or when
    the task loop ends, without the worker setting an event the caller may share."""

    def __init__(self, a: threading.Event, b: threading.Event):
        self.a, self.b = a, b

    def is_set(self) -> bool:
        return self.a.is_set() or self.b.is_set()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.b.wait(min(left, 0.05))
        return True


class _RowCount:
    """Stands in for a result table in protocol.stamp (which only reads num_rows), so the worker
    can drop the tables themselves before unmapping the request's shared memory."""

    def __init__(self, num_rows: int):
        self.num_rows = num_rows


_ERROR_TEXT = 4000


def error_line(exc: BaseException) -> str:
    """`Type: first line of the message`, at most _ERROR_TEXT characters: what an ERROR reply says."""
    message = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__
    return text[:_ERROR_TEXT]


class Worker:
    def __init__(
        self,
        connect: str,
        handler: Handler,
        heartbeat_s: float = 1.0,
        liveness: int = 3,
        *,
        slots: int = 2,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        curve_keys_dir=None,
        data_bind: str | None = None,
        advertise_host: str | None = None,
        max_backoff_s: float | None = None,
        context: zmq.Context | None = None,
        info: dict | None = None,
        shm_payloads: bool = True,
        connect_timeout_s: float | None = None,
    ):
        self.connect = endpoints.check_connect(connect)
        self.connect_timeout_s = connect_timeout_s or None  # None / 0: wait for a broker forever
        self.failure: Exception | None = None  # why the worker stopped by itself (run() raises it)
        self._abort = threading.Event()
        self._connected = threading.Event()
        self.shm = shm_payloads and shm.supported()
        self.handler = handler
        self.heartbeat_s = heartbeat_s
        self.liveness = liveness
        self.slots = slots
        self.max_message_bytes = max_message_bytes
        self.curve_keys_dir = curve_keys_dir
        self.data_bind = data_bind or endpoints.data_bind_for(connect)
        endpoints.check_bind(self.data_bind, curve_keys_dir)
        # with keys: the data socket admits listed clients only, and the broker sees this
        # worker's own persistent key (its allow-list decides whether READY registers it)
        self._client_keys: security.ClientKeys | None = None
        self._server_public: str | None = None
        if curve_keys_dir:
            security.check_server_dir(curve_keys_dir, (security.CLIENT,))
            self._client_keys = security.ClientKeys.from_dir(curve_keys_dir, security.WORKER)
            self._server_public = self._client_keys.server.decode()
        self.advertise_host = advertise_host
        self.max_backoff_s = max_backoff_s if max_backoff_s is not None else max(2.0, 16 * heartbeat_s)
        self.info = dict(info or {}, pid=os.getpid(), host=shm.host_id(), shm=self.shm, max_bytes=max_message_bytes)
        self.data_endpoint: str | None = None
        self.identity = b"w-" + uuid.uuid4().bytes
        self._context = context or zmq.Context.instance()
        self._pipe_name = f"inproc://sparkgnn-worker-ctl-{uuid.uuid4().hex}"
        self._busy_since: float | None = None  # when the running handler call started
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self.counts = dict(
            tasks=0,
            results=0,
            errors=0,
            malformed=0,
            unknown_kind=0,
            reconnects=0,
            heartbeats=0,
            broker_messages=0,
            reply_shm_unavailable=0,
            oversize=0,
        )

    def metrics(self) -> dict:
        with self._lock:
            return dict(self.counts)

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    def wait_connected(self, timeout: float | None = None) -> bool:
        """True once the broker has answered (its first heartbeat)."""
        return self._connected.wait(timeout)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    # -- task loop -------------------------------------------------------------------------
    def run(self, stop_event: threading.Event | None = None) -> None:
        stop_event = stop_event or threading.Event()
        auth = security.ServerAuth(self._context, self.curve_keys_dir) if self.curve_keys_dir else None
        try:
            data = sockets.make(self._context, zmq.ROUTER, max_frame_bytes=self.max_message_bytes, server_auth=auth)
        except BaseException:
            if auth is not None:
                auth.close()
            raise
        pipe = self._context.socket(zmq.PAIR)
        pipe.linger = 0
        # a PAIR send blocks while its peer is gone: the control thread drains the pipe every
        # 100 ms, so a send still waiting after a few heartbeats means that thread has stopped
        pipe.sndtimeo = int(1000 * max(1.0, 5 * self.heartbeat_s))
        pipe.bind(self._pipe_name)
        halt = threading.Event()
        control_thread = threading.Thread(
            target=self._control, args=(_Either(stop_event, halt),), name="sparkgnn-worker-control", daemon=True
        )
        try:
            bound = sockets.bind(data, self.data_bind)
            self.data_endpoint = endpoints.advertised(bound, self.advertise_host)
            self._bound_at = bound
            control_thread.start()
            while not (stop_event.is_set() or self._abort.is_set()):
                if data.poll(100):
                    frames = data.recv_multipart(copy=False)
                    self._serve_one(data, pipe, frames)
        finally:
            halt.set()
            control_thread.join(timeout=5 * self.heartbeat_s + 1) if control_thread.ident else None
            data.close(0)
            pipe.close(0)
            if auth is not None:
                auth.close()  # after its socket: a CURVE socket without a handler admits nobody
            endpoints.cleanup_ipc(getattr(self, "_bound_at", ""))
        if self.failure is not None:
            raise self.failure

    def _serve_one(self, data, pipe, frames) -> None:
        identity, body = frames[0].bytes, frames[1:]
        try:
            reply, lease = self._answer(body)
        except Exception as exc:  # last line of defence: a worker never dies of one message
            reply, lease = self._error({}, exc, retryable=False), None
        try:
            data.send_multipart([identity] + reply, copy=False)
        except zmq.ZMQError:
            pass
        if lease is not None:
            try:
                pipe.send_multipart(control(Kind.DONE, lease=lease))
            except zmq.Again:  # the control thread stopped (the worker is stopping): the lease expires
                log.warning(f"worker: DONE for lease {lease} not passed on: the control thread is not reading")

    def _answer(self, body) -> tuple[list, object]:
        """(reply frames, lease to report DONE for)."""
        try:
            header = peek_header(body, self.max_message_bytes)
        except MessageTooLarge as exc:
            return self._too_large(exc), (exc.header or {}).get("lease")
        except ProtocolError as exc:
            self._count("malformed")
            return self._error({}, exc, retryable=True), None
        lease = header.get("lease")
        mapping = None
        try:
            if header.get("shm") is not None:
                mapping = self._map(header, len(body))
                buffers = mapping.views(header["shm"].get("parts"))
            else:
                buffers = [frame_buffer(f) for f in body[1:]]
            result = self._run(header, buffers)
            del buffers
        except shm.ShmUnavailable as exc:
            self._count("malformed")
            return self._error(header, exc, retryable=True, error_type="ShmUnavailable"), lease
        except MessageTooLarge as exc:
            return self._too_large(exc), lease
        except (ProtocolError, ValueError) as exc:
            self._count("malformed")
            return self._error(header, exc, retryable=True), lease
        finally:
            # The handler's views of the dealer's segment must be gone before the dealer reuses
            # it; if anything still holds one, the segment is pinned and the dealer retires it.
            pinned = mapping is not None and not mapping.close()
        if isinstance(result, list):
            return result, lease  # an ERROR reply
        fields, payload, out_tables_meta, reply_mapping, shm_ref = result
        del result
        fields["shm_pinned"] = pinned
        reply = stamp(fields, Kind.RESULT.value, out_tables_meta, payload)
        if reply_mapping is None:
            return [encode_header(reply)] + payload, lease
        # the result was written into the dealer's reply segment: the header says where
        reply["shm"] = shm_ref
        del payload
        reply_mapping.close()
        return [encode_header(reply)], lease

    def _map(self, header: dict, nframes: int) -> shm.Mapping:
        if nframes != 1:
            raise ProtocolError("a shared memory task must not carry payload frames")
        if not self.shm:
            raise shm.ShmUnavailable("this worker does not take shared memory payloads")
        ref = header["shm"]
        if not isinstance(ref, dict):
            raise ProtocolError(f"header 'shm' must be an object, got {ref!r}")
        try:
            return shm.Mapping(ref.get("name"), self.max_message_bytes, key=ref.get("key"))
        except ValueError as exc:  # a bad name or key, a segment that is not the sender's (ShmRefused)
            raise ProtocolError(str(exc)) from None

    def _run(self, header: dict, buffers: list):
        """Decode, run the handler, serialize its result. Everything that may reference the
        input lives in this frame only, so it is released when this returns."""
        header, tables = decode_payload(header, buffers, self.max_message_bytes)
        if header["kind"] != Kind.TASK.value:
            self._count("unknown_kind")
            return self._error(header, ProtocolError(f"worker expects TASK, got {header['kind']}"), retryable=False)
        self._count("tasks")
        self._busy_since = time.monotonic()
        try:
            fields, out_tables = self.handler(header, tables)
            if not isinstance(fields, dict) or not isinstance(out_tables, dict):
                raise TypeError("handler must return (dict of header fields, dict of tables)")
            for name, table in out_tables.items():
                if not isinstance(name, str) or not isinstance(table, pa.Table):
                    raise TypeError(f"handler returned {name!r}: {type(table).__name__}, want str -> pyarrow.Table")
            reply = {k: v for k, v in fields.items() if k not in RESERVED}
            reply.update({k: header.get(k) for k in _ECHOED})
            size = shm.aligned_size(shm.stream_sizes(out_tables.values()))
            cap = header.get("max_result_bytes")
            if isinstance(cap, int) and size > cap:
                # the dealer would drop the connection on it and only see a timeout
                raise ValueError(f"result is {size} bytes, over the dealer's max_message_bytes={cap}")
            meta = {name: _RowCount(t.num_rows) for name, t in out_tables.items()}
            mapping, shm_ref, payload = self._reply_segment(header.get("reply_shm"), size, out_tables)
            if mapping is None:
                payload = [serialize_table(t) for t in out_tables.values()]
        except Exception as exc:
            self._count("errors")
            # the traceback stays in this worker's log; the peer gets one line (_error)
            log.warning("task %s (op %s) failed in the handler", header.get("token"), header.get("op"), exc_info=True)
            return self._error(header, exc, retryable=False)
        finally:
            self._busy_since = None
        self._count("results")
        return reply, payload, meta, mapping, shm_ref

    def _reply_segment(self, ref, size: int, out_tables: dict):
        """Write the result straight into the dealer's reply segment when it offered one that
        fits (one copy instead of serialize + socket in + socket out); else (None, None, None)
        and the result goes back as frames. Only a segment whose key the task holds is written
        (shm.Mapping checks it): a peer cannot make this worker write into another job's."""
        if not (
            self.shm
            and isinstance(ref, dict)
            and isinstance(ref.get("size"), int)
            and size + shm.HEADER_BYTES <= ref["size"]
        ):
            return None, None, None
        try:
            mapping = shm.Mapping(ref.get("name"), self.max_message_bytes, key=ref.get("key"), writable=True)
        except (OSError, ValueError):
            self._count("reply_shm_unavailable")
            return None, None, None
        try:
            parts, views = mapping.write_tables(out_tables.values())
        except ValueError:
            mapping.close()
            return None, None, None
        return mapping, {"name": mapping.name, "parts": parts}, views

    def _error(self, header: dict, exc: BaseException, retryable: bool, error_type: str | None = None, **extra) -> list:
        """An ERROR reply: the exception's type and the first line of its message, never a
        traceback (it would show a peer this worker's paths, code and locals)."""
        fields = {k: header.get(k) for k in _ECHOED}
        return control(
            Kind.ERROR,
            **fields,
            **extra,
            error=error_line(exc),
            error_type=error_type or type(exc).__name__,
            retryable=retryable,
            worker=self.data_endpoint,
        )

    def _too_large(self, exc: MessageTooLarge) -> list:
        """An oversize task: answered (echoing the sender's token when its header was readable)
        with both sizes, not retryable (any attempt at this worker would be refused the same)."""
        self._count("malformed")
        self._count("oversize")
        # error_type stays the protocol family (ProtocolError, as for every refused frame);
        # too_large + size + limit let the dealer name both sizes in its error
        return self._error(
            exc.header or {},
            exc,
            retryable=False,
            error_type="ProtocolError",
            too_large=True,
            size=exc.size,
            limit=exc.limit,
        )

    # -- control thread --------------------------------------------------------------------
    def _broker_socket(self):
        sock = sockets.make(
            self._context,
            zmq.DEALER,
            max_frame_bytes=sockets.CONTROL_MAX_BYTES,
            identity=self.identity,
            client_keys=self._client_keys,
        )
        sockets.connect(sock, self.connect)
        return sock

    def _announce(self, sock, kind: Kind) -> None:
        curve = self._server_public  # tells a key-less dealer why it gets nothing (dealers pin their own)
        busy_since = self._busy_since
        busy_s = time.monotonic() - busy_since if busy_since is not None else 0.0
        message = control(
            kind,
            data=self.data_endpoint,
            slots=self.slots,
            curve=curve,
            metrics=self.metrics(),
            busy_s=round(busy_s, 3),
            **self.info,
        )
        try:
            # never block: with no connection (a broker that refused this worker's key, or none
            # yet) a DEALER has no pipe to queue on; the next heartbeat announces it again
            sock.send_multipart(message, zmq.NOBLOCK)
        except zmq.Again:
            pass

    def _control(self, stop_event: _Either) -> None:
        pipe = self._context.socket(zmq.PAIR)
        pipe.linger = 0
        pipe.connect(self._pipe_name)
        sock = self._broker_socket()
        self._announce(sock, Kind.READY)
        self._ready.set()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(pipe, zmq.POLLIN)
        silence_limit = self.heartbeat_s * self.liveness
        started = heard = time.monotonic()
        next_beat = heard + self.heartbeat_s
        backoff = self.heartbeat_s
        online = False
        try:
            while not stop_event.is_set():
                events = dict(poller.poll(sockets.poll_ms(min(next_beat - time.monotonic(), 0.1))))
                if pipe in events:
                    while pipe.poll(0):
                        sock.send_multipart(pipe.recv_multipart())
                lost = False
                if sock in events:
                    while sock.poll(0):
                        frames = sock.recv_multipart()
                        try:
                            header = peek_header(frames, sockets.CONTROL_MAX_BYTES)
                        except ProtocolError:
                            self._count("malformed")
                            continue
                        heard, backoff = time.monotonic(), self.heartbeat_s
                        self._count("broker_messages")
                        online = online or self._on_connected()
                        lost = lost or header["kind"] == Kind.DISCONNECT.value
                now = time.monotonic()
                if self._connect_expired(started, now):
                    return
                if now >= next_beat:
                    self._announce(sock, Kind.HEARTBEAT)
                    self._count("heartbeats")
                    next_beat = now + self.heartbeat_s
                if lost or now - heard > silence_limit:
                    # Paranoid Pirate: drop the socket, wait, reconnect; double the wait each time.
                    if online:
                        log.warning(
                            f"lost the broker at {self.connect} (silent for {now - heard:.1f} s "
                            f"or said DISCONNECT); reconnecting"
                        )
                    online = False
                    poller.unregister(sock)
                    sock.close(0)
                    if stop_event.wait(self._pause(backoff, started)):
                        return
                    if self._connect_expired(started, time.monotonic()):
                        return
                    backoff = min(backoff * 2, self.max_backoff_s)
                    self._count("reconnects")
                    sock = self._broker_socket()
                    poller.register(sock, zmq.POLLIN)
                    self._announce(sock, Kind.READY)
                    heard = time.monotonic()
                    next_beat = heard + self.heartbeat_s
        finally:
            try:
                sock.send_multipart(control(Kind.DISCONNECT), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            sock.close(0 if not stop_event.is_set() else 100)
            pipe.close(0)

    def _on_connected(self) -> bool:
        """The broker answered after a silence (or for the first time): say so. Returns True."""
        if self._connected.is_set():
            log.info(f"reconnected to broker at {self.connect}")
        else:
            self._connected.set()
            log.info(f"connected to broker at {self.connect}; tasks arrive at {self.data_endpoint}")
        return True

    def _pause(self, backoff: float, started: float) -> float:
        """The reconnect backoff, cut short so a never-answering broker is judged on time."""
        if self._connected.is_set() or self.connect_timeout_s is None:
            return backoff
        return max(0.0, min(backoff, started + self.connect_timeout_s - time.monotonic()))

    def _connect_expired(self, started: float, now: float) -> bool:
        """True (and the worker told to stop with BrokerUnreachableError) when no broker has ever
        answered within connect_timeout_s. Never after the first answer: from then on a lost
        broker is waited for, since a restarted one takes its workers back."""
        if self._connected.is_set() or self.connect_timeout_s is None or now - started < self.connect_timeout_s:
            return False
        self.failure = BrokerUnreachableError(
            f"no broker answered at {self.connect} within {self.connect_timeout_s:g} s: start one "
            f"with `sparkgnn-broker --back {self.connect}` (workers connect to the broker's --back "
            f"endpoint), or fix --connect (--connect-timeout 0 waits forever)"
            + (
                "; a keyed broker admits this worker only when its worker.key is listed in the "
                "broker's authorized_workers/ (sparkgnn-keys allow worker)"
                if self._client_keys is not None
                else ""
            )
        )
        self._abort.set()
        return True


def serve(
    connect: str,
    handler: Handler,
    heartbeat_s: float = 1.0,
    liveness: int = 3,
    stop_event: threading.Event | None = None,
    **options,
) -> None:
    """Run a worker until stop_event is set: READY, heartbeats, TASK -> handler -> RESULT/ERROR,
    reconnect with exponential backoff when the broker goes away. Options: see `Worker`."""
    Worker(connect, handler, heartbeat_s, liveness, **options).run(stop_event)
