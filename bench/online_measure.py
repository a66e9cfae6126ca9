"""The online serving benchmark's measurement plumbing (bench/bench_online.py runs it): the load
generator process (LoadGen over online_load.py --serve), one open-loop point or closed-loop run
against a server and its summary (latency from the scheduled send time, CPU cores per role), the
`held` criterion, and the rate sweeps that find a capacity and an SLO rate (Bench).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
from online_deploy import log

LOAD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "online_load.py")
HE_SLO_MS = 20.0
EXACT_SLO_MS = 50.0


class LoadGen:
    """One online_load.py --serve process for the whole bench (module doc there)."""

    def __init__(self, work: str):
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.work = work
        self.count = 0
        self.proc = subprocess.Popen(
            [sys.executable, LOAD_SCRIPT, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        line = self.proc.stdout.readline().strip()  # type: ignore[union-attr]
        if line != "ready":
            raise RuntimeError(f"load generator did not start: {line!r}")

    def run(self, job: dict) -> dict:
        self.count += 1
        job = dict(job, out=os.path.join(self.work, f"run{self.count:04d}.json"))
        self.proc.stdin.write(json.dumps(job) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        line = self.proc.stdout.readline().strip()  # type: ignore[union-attr]
        if not line.startswith("done "):
            raise RuntimeError(f"load generator: {line or 'exited'}")
        with open(line[5:]) as fh:
            return json.load(fh)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def wait_idle(srv, timeout_s: float = 120.0) -> bool:
    """Until every request the server took was answered (a backlog must not leak into the next
    point)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = srv.stats
        if s["answered"] + s["errors"] + s["busy"] >= s["requests"] and len(srv.scheduler) == 0:
            return True
        time.sleep(0.05)
    return False


def summarise(res: dict, srv=None, log_start: int = 0) -> dict:
    """A run's numbers: latency from the scheduled send time over the answered requests."""
    n = res["n"]
    status = np.array(res["status"])
    ok = status == "ok"

    def arr(key):
        return np.array([np.nan if v is None else v for v in res[key]], np.float64)

    sched, recv = arr("scheduled"), arr("received")
    lat = (recv - sched)[ok] * 1e3
    qms, sms = arr("queue_ms")[ok], arr("service_ms")[ok]
    duration = float(res["job"].get("duration", 0.0)) or (float(np.nanmax(recv)) if n else 0.0)
    n_ok = int(ok.sum())
    span = max(float(np.nanmax(recv[ok])) if n_ok else 0.0, duration)
    out = {
        "offered_rps": n / duration if duration else 0.0,
        "rate": float(res["job"].get("rate", 0.0)),
        "requests": n,
        "ok": n_ok,
        "busy": int((status == "busy").sum()),
        "errors": int((status == "error").sum()),
        "lost": int((status == "lost").sum()),
        "achieved_rps": n_ok / span if span else 0.0,
        "queries_per_request": float(np.mean(res["queries"])) if n else 0.0,
    }
    out["keep_up"] = out["achieved_rps"] / out["offered_rps"] if out["offered_rps"] else 0.0
    if n_ok:
        out.update(
            latency_mean_ms=float(lat.mean()),
            latency_p50_ms=float(np.percentile(lat, 50)),
            latency_p90_ms=float(np.percentile(lat, 90)),
            latency_p99_ms=float(np.percentile(lat, 99)),
            latency_max_ms=float(lat.max()),
            queue_mean_ms=float(qms.mean()),
            queue_p99_ms=float(np.percentile(qms, 99)),
            service_mean_ms=float(sms.mean()),
            batch_requests_mean=float(np.mean(np.array(res["batch_requests"])[ok])),
            batch_requests_max=int(np.max(np.array(res["batch_requests"])[ok])),
        )
    for key in ("send_lateness_ms_p50", "send_lateness_ms_p99", "send_lateness_ms_max", "connections_opened"):
        if key in res:
            out[key] = res[key]
    if res.get("errors"):
        out["error_messages"] = dict(list(res["errors"].items())[:3])
    if srv is not None:
        batches = srv.batch_log[log_start:]
        out["batches"] = len(batches)
        out["batch_seconds_max"] = max((b["seconds"] for b in batches), default=0.0)
        pools: dict = {}
        for b in batches:
            pools[b["pool"]] = pools.get(b["pool"], 0) + 1
        out["batches_per_pool"] = pools
    return out


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of a live process (/proc), None when it is gone or /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def process_groups(srv, lg) -> dict:
    """pid lists by role: the bench process (front end + inprocess pools), the load generator,
    the workers and brokers of "workers" and "sharded" pools."""
    groups: dict = {"front_end": [os.getpid()], "generator": [lg.proc.pid], "workers": [], "brokers": []}
    for pool in srv.pools:  # a "workers" pool has one cluster, a sharded pool one per shard
        clusters = [getattr(pool, "cluster", None), *getattr(pool, "clusters", [])]
        for cluster in (c for c in clusters if c is not None):
            groups["workers"] += [w.pid for w in cluster.workers]
            groups["brokers"] += [cluster.broker.pid] if cluster.broker is not None else []
    return groups


def cpu_snapshot(groups: dict) -> tuple:
    return time.perf_counter(), {k: [_cpu_seconds(pid) for pid in pids] for k, pids in groups.items()}


def cpu_utilisation(before: tuple, after: tuple) -> dict:
    """Cores used per role between two snapshots (CPU seconds / wall seconds)."""
    wall = after[0] - before[0]
    out = {}
    for key, values in after[1].items():
        pairs = [(a, b) for a, b in zip(before[1][key], values, strict=True) if a is not None and b is not None]
        if pairs:
            out[key] = sum(b - a for a, b in pairs) / wall if wall > 0 else 0.0
    return out


def merge_results(results: list) -> dict:
    """Several generator runs as one (columns concatenated, durations added): statistics over
    all their requests."""
    if len(results) == 1:
        return results[0]
    out = dict(results[0])
    out["job"] = dict(results[0]["job"], duration=sum(float(r["job"]["duration"]) for r in results))
    out["n"] = sum(r["n"] for r in results)
    for key in ("pick", "queries", "scheduled", "sent", "received", "status", "queue_ms", "service_ms"):
        out[key] = [v for r in results for v in r[key]]
    for key in ("batch_requests", "pool"):
        out[key] = [v for r in results for v in r[key]]
    for key in ("send_lateness_ms_p50", "send_lateness_ms_p99", "send_lateness_ms_max"):
        out[key] = max(r.get(key, 0.0) for r in results)
    if any("connections_opened" in r for r in results):
        out["connections_opened"] = sum(r.get("connections_opened", 0) for r in results)
    errors: dict = {}
    for r in results:
        for k, v in (r.get("errors") or {}).items():
            errors[k] = errors.get(k, 0) + v
    out["errors"] = errors
    return out


def held(point: dict, p99_bound_ms: float) -> bool:
    """A load is held when every request was answered ok, the answers kept up with the offer
    (achieved >= 0.9 x offered) and p99 stayed under the bound."""
    return (
        point["ok"] == point["requests"]
        and point["requests"] > 0
        and point["keep_up"] >= 0.9
        and point.get("latency_p99_ms", float("inf")) <= p99_bound_ms
    )


class Bench:
    def __init__(self, s: dict, lg: LoadGen, pools: dict):
        self.s, self.lg, self.pools = s, lg, pools
        self.seed = 0
        self.cost_model: dict = {}
        self.calibrated: dict = {}

    def point(
        self,
        srv,
        pool: str,
        mode: str,
        rate: float,
        process: str = "poisson",
        seed: int | None = None,
        target: dict | None = None,
        duration: float | None = None,
    ):
        """One open-loop run against `srv`: (summary, the generator's raw records). `target`:
        job fields naming how the generator reaches the service (its endpoint, keys_dir, or
        "http"; default the service's plain ZeroMQ endpoint); `duration`: seconds of sending
        (default the settings')."""
        if not wait_idle(srv):
            log("  warning: the service still had requests in flight after 120 s; this point starts with a backlog")
        start = len(srv.batch_log)
        self.seed += 1
        job = {
            "endpoint": srv.zmq_endpoint,
            "pool": self.pools[pool],
            "rate": float(rate),
            "duration": self.s["duration"] if duration is None else float(duration),
            "process": process,
            "seed": self.seed if seed is None else seed,
            "mode": mode,
            "drain_s": max(3.0, self.s["duration"]),
            **(target or {}),
        }
        groups = process_groups(srv, self.lg)
        before = cpu_snapshot(groups)
        res = self.lg.run(job)
        after = cpu_snapshot(groups)
        wait_idle(srv)
        point = summarise(res, srv, start)
        point["process"] = process
        point["cpu_cores"] = cpu_utilisation(before, after)
        point["cpu_seconds"] = {k: v * (after[0] - before[0]) for k, v in point["cpu_cores"].items()}
        return point, res

    def closed(self, srv, pool: str, mode: str, n: int, index: int | None = None) -> dict:
        wait_idle(srv)
        job = {"endpoint": srv.zmq_endpoint, "pool": self.pools[pool], "mode": mode, "closed": True, "n": n}
        if index is not None:
            job["index"] = index
        res = self.lg.run(job)
        ok = np.array(res["status"]) == "ok"
        lat = (np.array(res["received"], dtype=np.float64) - np.array(res["scheduled"], np.float64))[ok] * 1e3
        sms = np.array(res["service_ms"], np.float64)[ok]
        return {
            "requests": n,
            "ok": int(ok.sum()),
            "pick": [int(k) for k in np.array(res["pick"])[ok]],
            "service_ms": [float(v) for v in sms],
            "latency_ms": [float(v) for v in lat],
            "latency_median_ms": float(np.median(lat)) if ok.any() else None,
            "service_median_ms": float(np.median(sms)) if ok.any() else None,
            "service_mean_ms": float(np.mean(sms)) if ok.any() else None,
        }

    def calibrate(self, srv, pool: str, mode: str, cost: np.ndarray | None = None) -> float:
        """Requests/s one slot would serve back to back (1000 / mean service ms, closed loop);
        with `cost` (the pool's predicted costs) also records how well cost predicts service time."""
        self.closed(srv, pool, mode, 2)  # warm-up
        c = self.closed(srv, pool, mode, self.s["calibrate"])
        rps = 1000.0 / max(c["service_mean_ms"] or 1.0, 0.05)
        self.calibrated[f"{pool}/{mode}"] = rps
        if cost is not None and c["ok"] > 2:
            x, y = cost[np.array(c["pick"])], np.array(c["service_ms"])
            self.cost_model[f"{pool}/{mode}"] = {
                "requests": c["ok"],
                "service_mean_ms": c["service_mean_ms"],
                "service_median_ms": c["service_median_ms"],
                "service_max_ms": float(y.max()),
                "corr_cost_service": float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else None,
                "corr_log_cost_service": float(np.corrcoef(np.log1p(x), y)[0, 1])
                if x.std() > 0 and y.std() > 0
                else None,
            }
        return rps

    def sweep(
        self,
        srv,
        pool: str,
        mode: str,
        start: float,
        label: str,
        factor: float = 1.5,
        slo_ms: float | None = None,
        target: dict | None = None,
        refine: int | None = None,
    ) -> dict:
        """Step the rate by `factor` from `start` until a point is not held (`held`, p99 bound 5 x
        the first point's p99, at least 50 ms), then bisect (geometric mean) `refine` times between
        the last held and the first failed rate. With `slo_ms`, also bisect `refine` times at the
        boundary of p99 <= slo_ms (stepping below the first point when even that one missed it).
        `target`: as in point(); `refine`: bisection steps (default settings' refine)."""
        steps = self.s["refine"] if refine is None else int(refine)
        points: list = []
        bound: float | None = None

        def run(rate: float, tag: str = "") -> bool:
            nonlocal bound
            p, _ = self.point(srv, pool, mode, rate, target=target)
            if bound is None:
                bound = max(50.0, 5.0 * p.get("latency_p99_ms", 10.0))
            points.append(p)
            ok = held(p, bound)
            log(
                f"  {label}{tag}: {rate:8.1f} req/s -> p50 {p.get('latency_p50_ms', float('nan')):7.1f} ms, p99 "
                f"{p.get('latency_p99_ms', float('nan')):7.1f} ms, keep-up {p['keep_up']:.2f}, busy {p['busy']}, "
                f"lost {p['lost']}, batch {p.get('batch_requests_mean', 0):.1f}, late p99 "
                f"{p.get('send_lateness_ms_p99', 0):.1f} ms, cores "
                + " ".join(f"{k[:3]} {v:.2f}" for k, v in p["cpu_cores"].items())
                + f" {'held' if ok else 'NOT held'}"
            )
            return ok

        def boundary(ok_of) -> tuple:
            good = [p["rate"] for p in points if ok_of(p)]
            lo = max(good) if good else None
            hi = min([p["rate"] for p in points if not ok_of(p) and (lo is None or p["rate"] > lo)], default=None)
            return lo, hi

        rate = start
        while len(points) < self.s["max_points"]:
            if run(rate):
                rate *= factor
                continue
            if len(points) == 1 and rate > 1.0:  # started above capacity: step down, new bound
                bound = None
                points.clear()
                rate /= factor * factor
                continue
            break
        for _ in range(steps):
            lo, hi = boundary(lambda p: held(p, bound))
            if lo is None or hi is None:
                break
            run((lo * hi) ** 0.5, " (refine)")
        if slo_ms is not None:
            if not any(held(p, slo_ms) for p in points):
                for _ in range(2):
                    run(min(p["rate"] for p in points) / (factor * factor), f" (below, for {slo_ms:g} ms)")
                    if any(held(p, slo_ms) for p in points):
                        break
            for _ in range(steps):
                lo, hi = boundary(lambda p: held(p, slo_ms))
                if lo is None or hi is None:
                    break
                run((lo * hi) ** 0.5, f" (refine {slo_ms:g} ms)")
        points.sort(key=lambda p: p["rate"])
        for p in points:
            p["held"] = held(p, bound)
        lo, hi = boundary(lambda p: held(p, bound))
        return {
            "points": points,
            "p99_bound_ms": bound,
            "capacity_rps": lo,
            "first_failed_rps": hi,
            "saturation_achieved_rps": max(p["achieved_rps"] for p in points),
        }


def slo_rate(curve: dict, slo_ms: float):
    """Highest offered rate of a sweep that was held with p99 <= slo_ms (and its p99)."""
    good = [p for p in curve["points"] if held(p, slo_ms)]
    if not good:
        return None, None
    best = max(good, key=lambda p: p["rate"])
    return best["rate"], best["latency_p99_ms"]
