"""Open-loop load generator for the online serving benchmark (bench/bench_online.py).

Runs in its OWN process (the bench starts it with subprocess), so that sending and receiving
never share a GIL with the service under test. Open loop: the send times are fixed before the
run starts (Poisson arrivals, or a bursty on/off Markov-modulated Poisson process with the same
mean rate), and a request is sent at its time whether or not earlier ones were answered; replies
are received in the same loop (ZeroMQ poll with short timeouts until the next send time). Latency
is measured from the SCHEDULED send time, so a generator that falls behind shows up as latency
(no coordinated omission) and its own lateness (sent - scheduled) is reported separately.

Per request it records: scheduled / sent / received times (seconds from the run's start), status
(ok / busy / error / lost: no reply by the end of the drain), the service's queue_ms, service_ms,
batch size (requests in the batch) and pool, and which pool request it was.

Request pools are .npz files written by online_deploy.write_pool (concatenated qid / x / src / dst
with offsets). Two ways to run:
    one shot   python bench/online_load.py --endpoint tcp://... --pool P.npz --rate 200 --duration 5 --out R.json
    server     python bench/online_load.py --serve      (one JSON job per stdin line; answers
               "done <out path>" per job on stdout; the bench keeps one such process for all points,
               which saves the ~2 s interpreter + import start per point)
Job fields: endpoint, pool, rate, duration, process ("poisson" | "bursty"), seed, mode, out,
drain_s, keys_dir (this client's CURVE keys for a keyed ZeroMQ front), and for "bursty":
burst_factor, on_fraction, on_mean_s. Or "closed": n requests one after the other (each sent when
the previous answered; optional idle "gaps" before each), for the single large-request latencies
and the calibrations. Or "http": {url, token?, ca_file?, connections?}: the open-loop run POSTs
JSON bodies to the HTTP front instead (run_open_http), with the bearer token and over HTTPS when
the url is https://, over keep-alive connections kept from one job to the next against the same
front (_HttpConnections), as a client's connection pool keeps them.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import numpy as np

_POOLS: dict[str, list] = {}


# -- arrival processes -------------------------------------------------------------------------
def poisson_times(rate: float, duration: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival offsets (s) of a Poisson process of `rate` per second over [0, duration)."""
    n = int(rate * duration * 1.3 + 20)
    t = np.cumsum(rng.exponential(1.0 / rate, size=n))
    while t[-1] < duration:  # rare: draw more
        t = np.concatenate([t, t[-1] + np.cumsum(rng.exponential(1.0 / rate, size=n))])
    return t[t < duration]


def bursty_times(
    rate: float,
    duration: float,
    rng: np.random.Generator,
    burst_factor: float = 3.0,
    on_fraction: float = 0.25,
    on_mean_s: float = 0.2,
) -> np.ndarray:
    """On/off Markov-modulated Poisson process with mean rate `rate`: exponential sojourns (mean
    on_mean_s in the ON state, on_mean_s * (1 - f) / f in OFF, f = on_fraction of the time ON);
    the ON rate is burst_factor * rate and the OFF rate takes what is left of the mean,
    (1 - burst_factor * f) / (1 - f) * rate (burst_factor * f must be <= 1)."""
    f = float(on_fraction)
    if not 0 < f < 1 or burst_factor * f > 1:
        raise ValueError(
            f"bursty: need 0 < on_fraction < 1 and burst_factor * on_fraction <= 1, got {burst_factor}, {f}"
        )
    r_on = burst_factor * rate
    r_off = (1 - burst_factor * f) / (1 - f) * rate
    off_mean_s = on_mean_s * (1 - f) / f
    out, t, on = [], 0.0, bool(rng.random() < f)
    while t < duration:
        length = rng.exponential(on_mean_s if on else off_mean_s)
        r = r_on if on else r_off
        end = min(t + length, duration)
        if r > 0:
            k = rng.poisson(r * (end - t))
            out.append(np.sort(rng.uniform(t, end, size=k)))
        t, on = t + length, not on
    return np.concatenate(out) if out else np.zeros(0)


def send_times(job: dict, rng: np.random.Generator) -> np.ndarray:
    process = job.get("process", "poisson")
    if process == "poisson":
        return poisson_times(float(job["rate"]), float(job["duration"]), rng)
    if process == "bursty":
        return bursty_times(
            float(job["rate"]),
            float(job["duration"]),
            rng,
            float(job.get("burst_factor", 3.0)),
            float(job.get("on_fraction", 0.25)),
            float(job.get("on_mean_s", 0.2)),
        )
    raise ValueError(f"unknown arrival process {process!r} (poisson, bursty)")


# -- request pools -----------------------------------------------------------------------------
def load_pool(path: str) -> list:
    """The Requests of a pool file (cached per process: the bench reuses its pools)."""
    found = _POOLS.get(path)
    if found is not None:
        return found
    from sparkgnn.serving.request import Request

    with np.load(path) as z:
        qid, x, src, dst, q_off, e_off = (z[k] for k in ("qid", "x", "src", "dst", "q_off", "e_off"))
    out = [
        Request(
            f"p{i}",
            qid[q_off[i] : q_off[i + 1]],
            x[q_off[i] : q_off[i + 1]],
            src[e_off[i] : e_off[i + 1]],
            dst[e_off[i] : e_off[i + 1]],
        )
        for i in range(len(q_off) - 1)
    ]
    _POOLS[path] = out
    return out


def _renamed(request, request_id: str):
    """A shallow copy under another id (dataclasses.replace would re-validate the arrays)."""
    r = copy.copy(request)
    r.request_id = request_id
    return r


# -- the loop ----------------------------------------------------------------------------------
class _Recorder:
    def __init__(self, n: int, pick: np.ndarray, queries: np.ndarray):
        self.n = n
        self.pick = pick
        self.queries = queries
        self.scheduled = np.full(n, np.nan)
        self.sent = np.full(n, np.nan)
        self.received = np.full(n, np.nan)
        self.status = ["lost"] * n
        self.queue_ms = np.full(n, np.nan)
        self.service_ms = np.full(n, np.nan)
        self.batch = np.zeros(n, np.int64)
        self.pool = [""] * n
        self.errors: dict[str, int] = {}
        self.done = 0

    def record(self, got: tuple, now: float) -> None:
        rid, header, _tables = got
        try:
            i = int(rid)
        except ValueError:
            return
        if not 0 <= i < self.n or self.status[i] != "lost":
            return
        kind = header.get("kind")
        self.received[i] = now
        self.status[i] = {"RESULT": "ok", "BUSY": "busy"}.get(kind, "error")
        self.queue_ms[i] = float(header.get("queue_ms", np.nan))
        self.service_ms[i] = float(header.get("service_ms", np.nan))
        self.batch[i] = int(header.get("batch_requests", 0))
        self.pool[i] = str(header.get("pool", ""))
        if self.status[i] == "error":
            message = str(header.get("error", "?"))[:200]
            self.errors[message] = self.errors.get(message, 0) + 1
        self.done += 1

    def as_json(self, job: dict, extra: dict) -> dict:
        def col(a):
            return [None if not np.isfinite(v) else round(float(v), 7) for v in a]

        return {
            "job": job,
            **extra,
            "n": self.n,
            "pick": self.pick.tolist(),
            "queries": self.queries.tolist(),
            "scheduled": col(self.scheduled),
            "sent": col(self.sent),
            "received": col(self.received),
            "status": self.status,
            "queue_ms": col(self.queue_ms),
            "service_ms": col(self.service_ms),
            "batch_requests": self.batch.tolist(),
            "pool": self.pool,
            "errors": self.errors,
        }


def run_open(job: dict) -> dict:
    """One open-loop run (module doc)."""
    from sparkgnn.serving.online.client import Client

    pool = load_pool(job["pool"])
    rng = np.random.default_rng([int(job.get("seed", 0)), 7])
    times = send_times(job, rng)
    n = len(times)
    pick = rng.integers(len(pool), size=n)
    requests = [_renamed(pool[k], str(i)) for i, k in enumerate(pick)]  # built before the clock starts
    rec = _Recorder(n, pick, np.array([pool[k].batch_size for k in pick], np.int64))
    rec.scheduled[:] = times
    mode = job.get("mode")
    drain_s = float(job.get("drain_s", 10.0))
    client = Client(job["endpoint"], timeout_s=drain_s, keys_dir=job.get("keys_dir"))
    clock = time.perf_counter
    t0 = clock() + 0.02
    i = 0
    try:
        while True:
            now = clock() - t0
            while i < n and times[i] <= now:
                client.send(requests[i], mode, i)
                rec.sent[i] = clock() - t0
                i += 1
                now = rec.sent[i - 1]
            if i >= n and (n == 0 or rec.done >= n or now > times[-1] + drain_s):
                break
            wait = (times[i] - now) if i < n else 0.05
            got = client.receive(wait if wait >= 0.001 else 0.0)
            while got is not None:
                rec.record(got, clock() - t0)
                got = client.receive(0.0)
            if i < n:
                left = times[i] - (clock() - t0)
                if 0 < left < 0.001:
                    time.sleep(left)
    finally:
        client.close()
    lateness = rec.sent - rec.scheduled
    extra = {
        "send_lateness_ms_p50": float(np.nanpercentile(lateness, 50) * 1e3) if n else 0.0,
        "send_lateness_ms_p99": float(np.nanpercentile(lateness, 99) * 1e3) if n else 0.0,
        "send_lateness_ms_max": float(np.nanmax(lateness) * 1e3) if n else 0.0,
    }
    return rec.as_json(job, extra)


def _http_body(request, mode) -> bytes:
    """The POST /v1/answer body of `request` (JSON, as any HTTP client would send it)."""
    body = {
        "request_id": request.request_id,
        "nodes": [{"id": int(q), "x": row.tolist()} for q, row in zip(request.qid, request.x, strict=True)],
        "edges": [[int(a), int(b)] for a, b in zip(request.src, request.dst, strict=True)],
    }
    if mode:
        body["mode"] = mode
    return json.dumps(body).encode()


class _HttpConnections:
    """The generator's keep-alive connections to one HTTP front, kept from one job to the next as
    a real client's connection pool keeps them: a job against the same url and CA reuses the
    connections the previous one left open, so a run of points pays one TCP connect and TLS
    handshake per connection, not one per connection per point (with 16 connections and a few
    hundred requests per point, fresh handshakes would be a large share of the server's TLS work
    and of the first requests' latency). New connections are opened, handshake included, before
    the job's clock starts. `opened` counts the connections made (the job reports it)."""

    def __init__(self, url, ca_file: str | None):
        import ssl
        import threading

        self.key = (url.geturl(), ca_file)
        self.url = url
        self.context = ssl.create_default_context(cafile=ca_file) if url.scheme == "https" else None
        self.idle: list = []
        self.opened = 0
        self._lock = threading.Lock()

    def connect(self, timeout: float, now: bool = True):
        """A new connection, connected (and TLS-handshaken) now, or at its first request when
        not `now` (after a failure: a service that is gone then fails that request, not this)."""
        import http.client

        if self.context is not None:
            conn = http.client.HTTPSConnection(self.url.hostname, self.url.port, timeout=timeout, context=self.context)
        else:
            conn = http.client.HTTPConnection(self.url.hostname, self.url.port, timeout=timeout)
        if now:
            conn.connect()
        with self._lock:
            self.opened += 1
        return conn

    def take(self, n: int, timeout: float) -> list:
        """`n` open connections: the idle ones still open (the server closes a connection idle
        past its keep-alive timeout: one readable while idle was closed), new ones for the rest."""
        import select

        out = []
        while self.idle and len(out) < n:
            conn = self.idle.pop()
            sock = conn.sock
            if sock is None or select.select([sock], [], [], 0)[0]:
                conn.close()
                continue
            conn.timeout = timeout
            sock.settimeout(timeout)
            out.append(conn)
        out += [self.connect(timeout) for _ in range(n - len(out))]
        return out

    def give_back(self, conn) -> None:
        with self._lock:
            if conn.sock is not None:
                self.idle.append(conn)

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()


_HTTP: list[_HttpConnections] = []  # the pool of the front the last HTTP job ran against


def _http_connections(url, ca_file: str | None) -> _HttpConnections:
    """The kept pool when the job goes to the same url with the same CA, else a new one (the
    old one's connections closed: its service is gone or not this job's)."""
    if _HTTP and _HTTP[0].key == (url.geturl(), ca_file):
        return _HTTP[0]
    for old in _HTTP:
        old.close()
    _HTTP[:] = [_HttpConnections(url, ca_file)]
    return _HTTP[0]


def run_open_http(job: dict) -> dict:
    """One open-loop run against the HTTP front (job["http"]: url, token?, ca_file?): the same
    send times and requests as run_open, POSTed by `connections` sender threads (default 16), each
    holding one keep-alive connection (HTTPS when the url says so; _HttpConnections: kept across
    jobs to the same front, new ones connected before the clock) and sending the next request
    due; a request no thread was free for at its time is sent late, which counts as latency
    (from the scheduled time) like the ZeroMQ loop's. `connections_opened` in the result: the
    connections (TCP connect + TLS handshake) this job made."""
    import http.client
    import queue
    import threading
    import urllib.parse

    spec = job["http"]
    url = urllib.parse.urlsplit(spec["url"])
    headers = {"Content-Type": "application/json"}
    if spec.get("token"):
        headers["Authorization"] = f"Bearer {spec['token']}"
    pool = load_pool(job["pool"])
    rng = np.random.default_rng([int(job.get("seed", 0)), 7])
    times = send_times(job, rng)
    n = len(times)
    pick = rng.integers(len(pool), size=n)
    mode = job.get("mode")
    bodies = [_http_body(_renamed(pool[k], str(i)), mode) for i, k in enumerate(pick)]  # before the clock
    rec = _Recorder(n, pick, np.array([pool[k].batch_size for k in pick], np.int64))
    rec.scheduled[:] = times
    drain_s = float(job.get("drain_s", 10.0))
    todo: queue.Queue = queue.Queue()
    for i in range(n):
        todo.put(i)
    lock = threading.Lock()
    connections = _http_connections(url, spec.get("ca_file"))
    opened_before = connections.opened
    held = connections.take(int(spec.get("connections", 16)), drain_s)
    clock = time.perf_counter
    t0 = clock() + 0.05

    def sender(conn) -> None:
        try:
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                wait = times[i] - (clock() - t0)
                if wait > 0:
                    time.sleep(wait)
                sent = clock() - t0
                try:
                    conn.request("POST", "/v1/answer", body=bodies[i], headers=headers)
                    response = conn.getresponse()
                    data = json.loads(response.read() or b"{}")
                    status = response.status
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    conn.close()
                    conn = connections.connect(drain_s, now=False)
                    data, status = {"error": f"{type(exc).__name__}: {exc}"}, 0
                now = clock() - t0
                kind = "RESULT" if status == 200 else "BUSY" if status == 503 else "ERROR"
                header = {
                    "kind": kind,
                    "queue_ms": data.get("queue_ms", np.nan),
                    "service_ms": data.get("service_ms", np.nan),
                    "batch_requests": data.get("batch_requests", 0),
                    "pool": data.get("pool", ""),
                    "error": data.get("error", f"HTTP {status}"),
                }
                with lock:
                    rec.sent[i] = sent
                    rec.record((str(i), header, {}), now)
        finally:
            connections.give_back(conn)

    threads = [threading.Thread(target=sender, args=(conn,), daemon=True) for conn in held]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(0.0, float(times[-1] if n else 0.0) + drain_s + 5.0 - (clock() - t0)))
    with lock:  # a thread still waiting on a reply leaves its request "lost"
        lateness = rec.sent - rec.scheduled
        extra = {
            "send_lateness_ms_p50": float(np.nanpercentile(lateness, 50) * 1e3) if n else 0.0,
            "send_lateness_ms_p99": float(np.nanpercentile(lateness, 99) * 1e3) if n else 0.0,
            "send_lateness_ms_max": float(np.nanmax(lateness) * 1e3) if n else 0.0,
            "connections_opened": connections.opened - opened_before,
        }
        return rec.as_json(job, extra)


def run_closed(job: dict) -> dict:
    """`n` requests one after the other: each sent when the previous one was answered (requests
    cycle through the pool in order, or always `index` when given), after `gaps[i]` seconds of
    idling when the job gives gaps."""
    from sparkgnn.serving.online.client import Client

    pool = load_pool(job["pool"])
    n = int(job["n"])
    pick = np.full(n, int(job["index"])) if "index" in job else np.arange(n) % len(pool)
    rec = _Recorder(n, pick, np.array([pool[k].batch_size for k in pick], np.int64))
    client = Client(job["endpoint"], timeout_s=float(job.get("drain_s", 120.0)), keys_dir=job.get("keys_dir"))
    clock = time.perf_counter
    t0 = clock()
    try:
        gaps = job.get("gaps") or []
        for i, k in enumerate(pick):
            if i < len(gaps) and gaps[i] > 0:
                time.sleep(float(gaps[i]))
            r = _renamed(pool[k], str(i))
            rec.scheduled[i] = rec.sent[i] = clock() - t0
            client.send(r, job.get("mode"), i)
            deadline = clock() + float(job.get("drain_s", 120.0))
            while rec.status[i] == "lost" and clock() < deadline:
                got = client.receive(deadline - clock())
                if got is not None:
                    rec.record(got, clock() - t0)
    finally:
        client.close()
    return rec.as_json(job, {})


def run_job(job: dict) -> str:
    if job.get("http"):
        if job.get("closed"):
            raise ValueError("closed-loop jobs run over ZeroMQ only")
        result = run_open_http(job)
    else:
        result = run_closed(job) if job.get("closed") else run_open(job)
    out = job["out"]
    tmp = out + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh)
    os.replace(tmp, out)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help="read one JSON job per stdin line")
    parser.add_argument("--endpoint")
    parser.add_argument("--pool")
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--process", default="poisson", choices=["poisson", "bursty"])
    parser.add_argument("--mode", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drain-s", type=float, default=10.0)
    parser.add_argument("--out")
    args = parser.parse_args()
    if not args.serve:
        if not (args.endpoint and args.pool and args.out):
            parser.error("--endpoint, --pool and --out are needed (or --serve)")
        job = {k: getattr(args, k) for k in ("endpoint", "pool", "rate", "duration", "process", "mode", "seed", "out")}
        job["drain_s"] = args.drain_s
        print(run_job(job))
        return 0
    print("ready", flush=True)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            print("done " + run_job(json.loads(line)), flush=True)
        except Exception as exc:  # noqa: BLE001 - reported to the bench, which raises it
            print(f"failed {type(exc).__name__}: {exc}".replace("\n", " "), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
