"""bench-online's express-lane comparison (bench_online.py `--only lanes`): the same service with
ServeConfig.express_lanes = 0 and = the default, in one run, on the same deployment and arrivals.

  schedulers  mixed-size requests in `sched_mode` under the degree scheduler at `sched_load` of
              the mixed capacity (found with lanes off): mean / p99 latency and the longest
              queue wait over the request's own service time, Poisson and bursty, `sched_repeats`
              runs per arm in alternating order (drift on the box hits both arms alike).
  overload    single-query HE over ZeroMQ with the overload deadline: capacity found with lanes
              off, then 2 x that capacity offered to each arm: answered req/s / capacity.

WHY: lanes let a cheap request start beside an expensive batch instead of behind it (the wait
bound), but they take requests out of the batches the general slot would fuse, and on two cores
their threads share the CPU with it; whether the default pays is measured here, not assumed.
"""

from __future__ import annotations

import numpy as np
from online_deploy import log, server_config


def _wait_over_service(res: dict) -> dict:
    """max / p99 / mean of queue time over own service time, over the answered requests."""
    ok = np.array(res["status"]) == "ok"
    q = np.array(res["queue_ms"], np.float64)[ok]
    sv = np.array(res["service_ms"], np.float64)[ok]
    r = q / np.maximum(sv, 1e-3)
    if not len(r):
        return {"max": None, "p99": None, "mean": None}
    return {"max": float(r.max()), "p99": float(np.percentile(r, 99)), "mean": float(r.mean())}


def experiment_lanes(b, dep, s, default_lanes: int) -> dict:
    """Lanes off vs `default_lanes` (module doc)."""
    from sparkgnn.serving.online.server import Server

    arms = {"lanes_0": 0, f"lanes_{default_lanes}": default_lanes}
    mode = s["sched_mode"]
    out: dict = {"arms": arms, "mode": mode, "sched_load": s["sched_load"]}
    log(f"[lanes] mixed {mode.upper()} capacity (degree scheduler, lanes off)")
    with Server(server_config(dep, "sage", mode, scheduler="degree", express_lanes=0)) as srv:
        est = b.calibrate(srv, "mixed", mode)
        mixed = b.sweep(srv, "mixed", mode, max(2.0, 0.4 * est), f"{mode} mixed lanes 0", factor=1.4)
    cap = mixed["capacity_rps"] or mixed["points"][0]["rate"] / 2
    rate = s["sched_load"] * cap
    out["mixed_capacity_rps"], out["rate_rps"] = cap, rate
    runs: dict = {}
    for process in ("poisson", "bursty"):
        for rep in range(s["sched_repeats"]):
            order = list(arms) if rep % 2 == 0 else list(reversed(arms))
            for name in order:
                cfg = server_config(dep, "sage", mode, scheduler="degree", express_lanes=arms[name])
                with Server(cfg) as srv:
                    p, res = b.point(srv, "mixed", mode, rate, process=process, seed=2000 + 10 * rep)
                p["wait_over_service"] = _wait_over_service(res)
                runs.setdefault(process, {}).setdefault(name, []).append(p)
                log(
                    f"  {process:7s} {name:8s} {rate:7.1f} req/s: mean {p.get('latency_mean_ms')} p99 "
                    f"{p.get('latency_p99_ms')} ms, max wait/service {p['wait_over_service']['max']}, "
                    f"busy {p['busy']} lost {p['lost']}"
                )
    summary: dict = {}
    for process, by_arm in runs.items():
        for name, reps in by_arm.items():
            summary[f"{process}/{name}"] = {
                "latency_mean_ms": float(np.mean([r.get("latency_mean_ms") or np.nan for r in reps])),
                "latency_p99_ms": float(np.max([r.get("latency_p99_ms") or np.nan for r in reps])),
                "max_wait_over_service": float(np.max([r["wait_over_service"]["max"] or np.nan for r in reps])),
            }
    out["runs"], out["summary"] = runs, summary

    log("[lanes] single-query HE capacity (lanes off), then 2 x capacity offered to each arm")
    with Server(server_config(dep, "sage", "he", deadline_ms=s["overload_deadline_ms"], express_lanes=0)) as srv:
        start = 0.5 * b.calibrate(srv, "single", "he")
        he = b.sweep(srv, "single", "he", start, "overload capacity lanes 0", refine=s["refine"])
    capacity = he["capacity_rps"]
    out["he_capacity_rps"] = capacity
    if capacity:
        for name, lanes in arms.items():
            cfg = server_config(dep, "sage", "he", deadline_ms=s["overload_deadline_ms"], express_lanes=lanes)
            with Server(cfg) as srv:
                p, _ = b.point(srv, "single", "he", 2.0 * capacity, duration=s["overload_seconds"])
            summary[f"overload/{name}"] = {
                "goodput_ratio": p["achieved_rps"] / capacity,
                "refused": p.get("busy"),
                "lost": p["lost"],
                "errors": p["errors"],
            }
            log(f"  overload {name}: answered {p['achieved_rps']:.1f} req/s of {2 * capacity:.0f} offered")
    return out
