"""The broker: the ZeroMQ guide's load-balancing broker with Paranoid Pirate heartbeats, kept on
the control path.

WHY payloads do not cross it: every payload byte through the broker is one more copy through one
more process, and a forwarding broker was measurably slower than a direct DEALER-ROUTER pair
(messenger/README.md has the probe). So the
broker only hands out *leases*: a dealer asks LEASE for a batch, the broker picks the least
recently used worker with a free slot and answers ASSIGN with that worker's data endpoint; the
dealer sends the TASK there directly and the worker answers RESULT directly and tells the broker
DONE. Heartbeats, expiry after `liveness` silent intervals, requeue of an expired worker's leases
(the dealer gets a fresh ASSIGN for the same batch and re-sends it) and the bounded queue (BUSY
answers = back-pressure) are all here; see dispatch.py for the bookkeeping.

Sockets: ROUTER front (dealers), ROUTER back (workers), both capped at CONTROL_MAX_BYTES per frame.
Malformed messages are counted per socket and dropped, never raised.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

import zmq

from sparkgnn.messenger import cli, endpoints, memory, security, sockets, watchdog
from sparkgnn.messenger.dispatch import Dispatcher, Request
from sparkgnn.messenger.errors import BindError
from sparkgnn.messenger.protocol import Kind, ProtocolError, control, peek_header

log = logging.getLogger("sparkgnn.messenger.broker")  # not __name__: also run as __main__ (-m)
STATS_HIDDEN = ("data", "pid")  # per-worker keys a STATS reply leaves out: endpoints, process ids


class Broker:
    def __init__(
        self,
        front: str,
        back: str,
        heartbeat_s: float = 1.0,
        liveness: int = 3,
        max_queue: int = 1024,
        max_message_bytes: int = sockets.CONTROL_MAX_BYTES,
        curve_keys_dir=None,
        *,
        bind_any: bool = True,
        metrics_interval_s: float = 10.0,
        stuck_after_s: float = 300.0,
        context: zmq.Context | None = None,
    ):
        for endpoint in (front, back):
            endpoints.check_bind(endpoint, curve_keys_dir, bind_any)
        if curve_keys_dir:
            security.check_server_dir(curve_keys_dir, (security.CLIENT, security.WORKER))
        self.front_endpoint, self.back_endpoint = front, back
        self.heartbeat_s = heartbeat_s
        self.max_message_bytes = max_message_bytes
        self.metrics_interval_s = metrics_interval_s
        self.curve_keys_dir = curve_keys_dir
        self.dispatcher = Dispatcher(
            liveness_s=heartbeat_s * liveness,
            max_queue=max_queue,
            lease_grace_s=max(5.0, heartbeat_s * liveness),
            stuck_after_s=stuck_after_s,
        )
        self.counts = dict(malformed_front=0, malformed_back=0, unknown_kind=0, stats_requests=0, refused_workers=0)
        self._auth: security.ServerAuth | None = None
        self._context = context or zmq.Context.instance()
        self._bound = threading.Event()
        self._settled = threading.Event()  # bound, or binding failed (bind_error says why)
        self.bind_error: BindError | None = None
        self._lock = threading.Lock()
        self._snapshot: dict = {}

    # -- public ----------------------------------------------------------------------------
    def metrics(self) -> dict:
        """Counters + gauges; safe to call from another thread while run() is going."""
        with self._lock:
            return dict(self._snapshot)

    def wait_bound(self, timeout: float | None = None) -> bool:
        """True once both sockets are bound, False on timeout; the BindError when binding failed
        (a taken port), so a caller running the broker in a thread does not wait in vain."""
        self._settled.wait(timeout)
        if self.bind_error is not None:
            raise self.bind_error
        return self._bound.is_set()

    def run(self, stop_event: threading.Event | None = None, on_bound=None) -> None:
        """Serve until stop_event is set (or forever). `on_bound(broker)` runs once both sockets
        are bound (the CLI announces the concrete endpoints there, not before a bind fails)."""
        stop_event = stop_event or threading.Event()
        auth = self._auth = security.ServerAuth(self._context, self.curve_keys_dir) if self.curve_keys_dir else None
        cap = self.max_message_bytes
        front = back = None
        bound: list[str] = []
        try:
            front = sockets.make(self._context, zmq.ROUTER, max_frame_bytes=cap, server_auth=auth)
            back = sockets.make(self._context, zmq.ROUTER, max_frame_bytes=cap, server_auth=auth, allow=security.WORKER)
            back.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting worker keeps its identity
            self._bind(front, back, bound)
            if on_bound is not None:
                on_bound(self)
            self._loop(front, back, stop_event)
        finally:
            if back is not None:
                for wid in list(self.dispatcher.workers):
                    self._send(back, wid, control(Kind.DISCONNECT))
            for sock in (front, back):
                if sock is not None:
                    sock.close(0)
            for endpoint in bound:  # never another process's socket file after a failed bind
                endpoints.cleanup_ipc(endpoint)
            if auth is not None:
                auth.close()  # after its sockets: a CURVE socket without a handler admits nobody
            self._settled.set()  # a failure before binding does not leave wait_bound() waiting

    def _bind(self, front, back, bound: list) -> None:
        """Bind both sockets (recording each in `bound`); a failure is kept in bind_error for
        wait_bound() and raised."""
        try:
            self.front_endpoint = sockets.bind(front, self.front_endpoint)
            bound.append(self.front_endpoint)
            self.back_endpoint = sockets.bind(back, self.back_endpoint)
            bound.append(self.back_endpoint)
            self._bound.set()
        except BindError as exc:
            self.bind_error = exc
            raise
        finally:
            self._settled.set()

    # -- loop ------------------------------------------------------------------------------
    def _loop(self, front, back, stop_event) -> None:
        poller = zmq.Poller()
        poller.register(front, zmq.POLLIN)
        poller.register(back, zmq.POLLIN)
        next_beat = time.monotonic()
        next_metrics = time.monotonic() + self.metrics_interval_s
        last_done, last_t = 0, time.monotonic()
        while not stop_event.is_set():
            events = dict(poller.poll(sockets.poll_ms(min(next_beat - time.monotonic(), 0.1))))
            if back in events:
                self._drain(back, self._on_back, front)
            if front in events:
                self._drain(front, self._on_front, back)
            now = time.monotonic()
            if now >= next_beat:
                _, assignments = self.dispatcher.expire(now)
                self._send_assignments(front, assignments)
                for wid in self.dispatcher.workers:
                    self._send(back, wid, control(Kind.HEARTBEAT))
                next_beat = now + self.heartbeat_s
            self._publish()
            if now >= next_metrics:
                done = self.dispatcher.counts["done"]
                self._log_metrics((done - last_done) / max(1e-9, now - last_t))
                last_done, last_t = done, now
                next_metrics = now + self.metrics_interval_s

    def _drain(self, sock, handle, other) -> None:
        """Handle everything already queued on `sock` (bounded, so the other socket is not starved)."""
        for _ in range(1000):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            handle(sock, other, frames)

    def _parse(self, frames, counter: str):
        if len(frames) < 2:
            self.counts[counter] += 1
            return None, None
        try:
            return frames[0].bytes, peek_header(frames[1:], self.max_message_bytes)
        except ProtocolError:
            self.counts[counter] += 1
            return None, None

    def _on_front(self, front, back, frames) -> None:
        client, header = self._parse(frames, "malformed_front")
        if header is None:
            return
        kind, now = header["kind"], time.monotonic()
        if kind == Kind.LEASE.value and isinstance(header.get("token"), str):
            req = Request(
                client,
                header["token"],
                header.get("batch"),
                header.get("op"),
                _positive(header.get("ttl"), 60.0),
                header.get("affinity"),
            )
            assignments, busy = self.dispatcher.request(req, now)
            if busy:
                self._send(
                    front,
                    client,
                    control(
                        Kind.BUSY,
                        token=req.token,
                        batch=req.batch,
                        retry_after=self.heartbeat_s / 4,
                        queue=len(self.dispatcher.queue),
                    ),
                )
            self._send_assignments(front, assignments)
        elif kind == Kind.LEASE.value:
            self.counts["malformed_front"] += 1  # a LEASE without a token cannot be answered
        elif kind == Kind.RELEASE.value:
            self._send_assignments(
                front, self.dispatcher.release(client, now, header.get("lease"), header.get("token"))
            )
        elif kind == Kind.HEARTBEAT.value:
            # the liveness probe: a dealer waiting for a lease learns whether any worker could
            # ever answer it, and where workers connect (for its error message)
            self._send(
                front,
                client,
                control(Kind.HEARTBEAT, live_workers=len(self.dispatcher.workers), back=self.back_endpoint),
            )
        elif kind == Kind.STATS.value:
            self.counts["stats_requests"] += 1
            self._publish()
            self._send(front, client, self._stats_answer())
        else:
            self.counts["unknown_kind"] += 1

    def _on_back(self, back, front, frames) -> None:
        wid, header = self._parse(frames, "malformed_back")
        if header is None:
            return
        kind, now = header["kind"], time.monotonic()
        assignments = []
        if kind == Kind.READY.value or (
            kind == Kind.HEARTBEAT.value and wid not in self.dispatcher.workers and isinstance(header.get("data"), str)
        ):
            # A heartbeat from an unknown worker re-registers it: after a broker restart the
            # workers' sockets reconnect by themselves and keep heartbeating.
            if not isinstance(header.get("data"), str):
                self.counts["malformed_back"] += 1
                return
            if self._auth is not None and not self._auth.allows(frames[1], security.WORKER):
                # the ZAP handler admitted the connection; its key must still be listed to register
                self.counts["refused_workers"] += 1
                return
            assignments = self.dispatcher.ready(
                wid,
                header["data"],
                _positive(header.get("slots"), 1),
                now,
                header.get("curve"),
                {k: header.get(k) for k in ("pid", "device", "host", "shm", "max_bytes", "metrics")},
            )
        elif kind == Kind.HEARTBEAT.value:
            assignments = self.dispatcher.heard(wid, now, header.get("metrics"), header.get("busy_s"))
        elif kind == Kind.DONE.value:
            assignments = self.dispatcher.done(wid, header.get("lease"), now)
        elif kind == Kind.DISCONNECT.value:
            assignments = self.dispatcher.disconnect(wid, now)
        else:
            self.counts["unknown_kind"] += 1
            self.dispatcher.heard(wid, now)
        self._send_assignments(front, assignments)

    def _stats_answer(self) -> list:
        """STATS with per-worker details, or without them when they would not fit one header
        (hundreds of workers): a metrics request must never take the broker down. Any front
        peer may ask, so the details are counts and status only: no worker's data endpoint or
        process id (metrics() in-process keeps them)."""
        metrics = self.metrics()
        metrics["workers"] = [
            {k: v for k, v in worker.items() if k not in STATS_HIDDEN} for worker in metrics.get("workers", [])
        ]
        try:
            return control(Kind.STATS, metrics=metrics)
        except ProtocolError:
            metrics.pop("workers", None)
            return control(Kind.STATS, metrics=dict(metrics, workers_omitted=True))

    # -- output ----------------------------------------------------------------------------
    def _send_assignments(self, front, assignments) -> None:
        for client, fields in assignments:
            self._send(front, client, control(Kind.ASSIGN, **fields))

    @staticmethod
    def _send(sock, identity: bytes, frames) -> None:
        try:
            sock.send_multipart([identity] + frames, zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # peer gone or its queue full: heartbeats/timeouts deal with it

    def _publish(self) -> None:
        snap = dict(self.dispatcher.snapshot(), **self.counts)
        snap["malformed"] = snap["malformed_front"] + snap["malformed_back"] + snap["unknown_kind"]
        with self._lock:
            self._snapshot = snap

    def _log_metrics(self, rate: float) -> None:
        m = self.metrics()
        log.info(
            f"tasks/s={rate:.1f} queue={m['queue_depth']} "
            f"live_workers={m['live_workers']} leases={m['leases_active']} done={m['done']} "
            f"requeued={m['requeued']} busy={m['busy']} malformed={m['malformed']}"
        )


def _positive(value, default):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else default


PROG = "sparkgnn-broker"


def _bind_endpoint(text: str) -> str:
    """argparse type: something a socket can bind (tcp port may be '*')."""
    try:
        endpoints.scheme(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--front",
        default="tcp://127.0.0.1:5555",
        type=_bind_endpoint,
        help="endpoint dealers (Spark tasks, --workers tcp://...) connect to",
    )
    p.add_argument(
        "--back",
        default="tcp://127.0.0.1:5556",
        type=_bind_endpoint,
        help="endpoint workers (sparkgnn-worker --connect ...) connect to",
    )
    p.add_argument("--heartbeat", type=cli.positive_float, default=1.0, help="heartbeat interval, seconds")
    p.add_argument("--liveness", type=cli.positive_int, default=3, help="missed heartbeats before a worker expires")
    p.add_argument("--max-queue", type=cli.positive_int, default=1024, help="queued lease requests before BUSY")
    p.add_argument(
        "--max-message-bytes",
        type=cli.positive_int,
        default=sockets.CONTROL_MAX_BYTES,
        help="cap on one control message (payloads never cross the broker)",
    )
    p.add_argument("--metrics-interval", type=cli.positive_float, default=10.0, help="seconds between metrics lines")
    p.add_argument(
        "--stuck-after",
        type=cli.positive_float,
        default=300.0,
        help="seconds a worker's current task may run before it gets no new leases",
    )
    p.add_argument(
        "--curve-keys",
        default=os.environ.get(security.KEYS_ENV) or None,
        help="keys folder (sparkgnn-keys): server.key_secret, authorized_clients/, authorized_workers/ "
        f"(default ${security.KEYS_ENV})",
    )
    p.add_argument("--bind-any", action="store_true", help="allow non-loopback binds (needs --curve-keys)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """`sparkgnn-broker`: a taken port, an exposed bind without keys and bad arguments end as one
    line on stderr with exit code 2 (messenger.cli)."""
    args = parse_args(argv)
    return cli.run(PROG, lambda: _serve(args))


def _serve(args: argparse.Namespace) -> int:
    cli.install_cli_handler(stream="stderr", prefix=f"[{PROG}] ")  # the announce and metrics lines
    watchdog.start_from_env()
    memory.tune_malloc()
    broker = Broker(
        args.front,
        args.back,
        heartbeat_s=args.heartbeat,
        liveness=args.liveness,
        max_queue=args.max_queue,
        max_message_bytes=args.max_message_bytes,
        curve_keys_dir=args.curve_keys,
        bind_any=args.bind_any,
        metrics_interval_s=args.metrics_interval,
        stuck_after_s=args.stuck_after,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    broker.run(stop, on_bound=_announce)
    return 0


def _announce(broker: Broker) -> None:
    log.info(f"front={broker.front_endpoint} (clients connect here) back={broker.back_endpoint} (workers connect here)")


if __name__ == "__main__":
    sys.exit(main())
