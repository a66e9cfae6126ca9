"""bench-online's front-process, overload and idle measurements (bench_online.py, `--only
fronts,overload,idle` or the whole bench):

  fronts    single-query HE over HTTP (JSON bodies, the generator's keep-alive connections) with
            ServeConfig.fronts = 1 and 2 (serving/online/fronts.py), the same generator and send
            times: one saturating point each (offered `fronts_offer` x the one-front closed-loop
            rate); `two_fronts_over_one` = answered req/s with 2 fronts / with 1. CPU of the
            service's process and of its front processes counted per request.
  overload  single-query HE over ZeroMQ with a deployment deadline (`overload_deadline_ms`): the
            capacity held (a sweep, no SLO bound beyond the sweep's own) and the CPU the service
            spent per answered request at that rate (`service_cpu_ms_per_request`: the service's
            process, workers and front processes, CPU seconds / answered requests); then 2 x that
            capacity offered for `overload_seconds`: answered req/s / capacity
            (`overload_goodput_ratio`), the refusals (BUSY) and how fast they came (p50/p99 from
            the send, and from the scheduled time).
  idle      a started, warmed service with fronts = 2 left alone for `idle_seconds`: CPU cores it
            used (its process and its front processes) = `idle_cpu_cores`.
"""

from __future__ import annotations

import time

import numpy as np
from online_deploy import log, server_config
from online_measure import cpu_snapshot, cpu_utilisation, process_groups

SERVICE_ROLES = ("front_end", "workers", "brokers", "fronts")  # the service's processes (not the generator)


def _groups(srv, lg) -> dict:
    """online_measure.process_groups plus the service's front processes."""
    groups = process_groups(srv, lg)
    procs = srv.front_processes.procs.values() if srv.front_processes is not None else ()
    groups["fronts"] = [p.pid for p in procs]
    return groups


def _point(b, srv, pool: str, mode: str, rate: float, **kw) -> tuple[dict, dict]:
    """Bench.point with the front processes' CPU added (cpu_cores["fronts"], cpu_seconds)."""
    groups = {"fronts": _groups(srv, b.lg)["fronts"]}
    before = cpu_snapshot(groups)
    point, res = b.point(srv, pool, mode, rate, **kw)
    after = cpu_snapshot(groups)
    extra = cpu_utilisation(before, after)
    if "fronts" in extra:
        point["cpu_cores"]["fronts"] = extra["fronts"]
        point["cpu_seconds"]["fronts"] = extra["fronts"] * (after[0] - before[0])
    return point, res


def service_cpu_ms_per_request(point: dict) -> float | None:
    """The service's CPU seconds (its process, workers, brokers, front processes) per answered
    request of a point, in ms."""
    if not point.get("ok"):
        return None
    seconds = sum(v for k, v in point["cpu_seconds"].items() if k in SERVICE_ROLES)
    return 1e3 * seconds / point["ok"]


def experiment_fronts(b, dep, s) -> dict:
    """fronts=1 vs 2 at one saturating rate over HTTP (module doc)."""
    from sparkgnn.serving.online.server import Server

    out: dict = {"offer_factor": s["fronts_offer"], "connections": s["fronts_connections"]}
    rate = None
    for count in (1, 2):
        cfg = server_config(dep, "sage", "he", http="127.0.0.1:0", fronts=count)
        with Server(cfg) as srv:
            if rate is None:
                rate = s["fronts_offer"] * b.calibrate(srv, "single", "he")
                out["offered_rps"] = rate
            target = {"http": {"url": srv.http_url, "connections": s["fronts_connections"]}}
            _point(b, srv, "single", "he", rate, target=target, duration=1.0)  # warm-up: every listener
            point, _res = _point(b, srv, "single", "he", rate, target=target)
        point["service_cpu_ms_per_request"] = service_cpu_ms_per_request(point)
        out[str(count)] = point
        log(
            f"  fronts={count}: offered {rate:.0f} req/s -> answered {point['achieved_rps']:.1f} req/s "
            f"(ok {point['ok']}/{point['requests']}, busy {point['busy']}), p99 "
            f"{point.get('latency_p99_ms', float('nan')):.1f} ms, service CPU "
            f"{point['service_cpu_ms_per_request'] or float('nan'):.2f} ms/request, cores "
            + " ".join(f"{k} {v:.2f}" for k, v in point["cpu_cores"].items())
        )
    one, two = out["1"]["achieved_rps"], out["2"]["achieved_rps"]
    out["two_fronts_over_one"] = two / one if one else None
    return out


def _refusal_latency(res: dict) -> dict:
    """How fast BUSY replies came: ms from the send and from the scheduled time (p50, p99, max)."""
    status = np.array(res["status"])
    busy = status == "busy"
    if not busy.any():
        return {"refused": 0}
    recv = np.array(res["received"], np.float64)[busy]
    sent = np.array([np.nan if v is None else v for v in res["sent"]], np.float64)[busy]
    sched = np.array(res["scheduled"], np.float64)[busy]
    from_sent, from_sched = (recv - sent) * 1e3, (recv - sched) * 1e3
    return {
        "refused": int(busy.sum()),
        "refusal_ms_p50": float(np.nanpercentile(from_sent, 50)),
        "refusal_ms_p99": float(np.nanpercentile(from_sent, 99)),
        "refusal_ms_max": float(np.nanmax(from_sent)),
        "refusal_from_scheduled_ms_p99": float(np.nanpercentile(from_sched, 99)),
    }


def experiment_overload(b, dep, s) -> dict:
    """Capacity, CPU per request at it, then 2 x capacity offered (module doc)."""
    from sparkgnn.serving.online.server import Server

    cfg = server_config(dep, "sage", "he", deadline_ms=s["overload_deadline_ms"])
    out: dict = {"deadline_ms": s["overload_deadline_ms"], "front": "zeromq"}
    with Server(cfg) as srv:
        start = 0.5 * b.calibrate(srv, "single", "he")
        sweep = b.sweep(srv, "single", "he", start, "overload capacity", refine=s["refine"])
        capacity = sweep["capacity_rps"]
        out["capacity_sweep"] = sweep
        out["capacity_rps"] = capacity
        if not capacity:
            out["skipped"] = "no rate was held: no capacity to double"
            return out
        at = max((p for p in sweep["points"] if p["held"]), key=lambda p: p["rate"])
        out["service_cpu_ms_per_request"] = service_cpu_ms_per_request(at)
        point, res = _point(b, srv, "single", "he", 2.0 * capacity, duration=s["overload_seconds"])
    point.update(_refusal_latency(res))
    out["overload"] = point
    out["overload_goodput_ratio"] = point["achieved_rps"] / capacity
    out["every_excess_refused"] = point["errors"] == 0 and point["lost"] == 0
    log(
        f"  overload: capacity {capacity:.1f} req/s (service CPU {out['service_cpu_ms_per_request'] or 0:.2f} "
        f"ms/request); offered {2 * capacity:.0f} -> answered {point['achieved_rps']:.1f} req/s "
        f"(ratio {out['overload_goodput_ratio']:.2f}), refused {point.get('refused', 0)} in p99 "
        f"{point.get('refusal_ms_p99', float('nan')):.1f} ms, lost {point['lost']}, errors {point['errors']}"
    )
    return out


def experiment_idle(b, dep, s) -> dict:
    """CPU cores of an idle, warmed service with two fronts (module doc)."""
    from sparkgnn.serving.online.server import Server

    cfg = server_config(dep, "sage", "he", http="127.0.0.1:0", fronts=2)
    with Server(cfg) as srv:
        b.closed(srv, "single", "he", 5)  # warm: every thread has run once
        time.sleep(1.0)
        groups = {k: v for k, v in _groups(srv, b.lg).items() if k in SERVICE_ROLES}
        before = cpu_snapshot(groups)
        time.sleep(s["idle_seconds"])
        after = cpu_snapshot(groups)
    cores = cpu_utilisation(before, after)
    out = {"seconds": s["idle_seconds"], "fronts": 2, "cpu_cores": cores, "idle_cpu_cores": sum(cores.values())}
    log(f"  idle: {out['idle_cpu_cores']:.4f} cores over {s['idle_seconds']:g} s ({cores})")
    return out
