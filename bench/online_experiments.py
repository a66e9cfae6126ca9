"""The online serving benchmark's experiments (bench/bench_online.py runs them; its module doc
lists what each measures): capacity and schedulers, the big request and EXACT, "workers" pool
width, the hot cache, the PSGS router and the worker pool idle probe.
"""

from __future__ import annotations

import time

import numpy as np
from online_deploy import BIG_B, KINDS, log, server_config, store_bytes
from online_measure import EXACT_SLO_MS, HE_SLO_MS, Bench, merge_results, slo_rate, summarise, wait_idle

# dealer timeout of the bench's "workers" pools (ServeConfig pool spec timeout_s; the default is 60 s):
# a dealer idle longer than the messenger's liveness pays two timeouts on its next call
# (worker_pool_idle_probe), so a short timeout keeps such a stall visible but short
WORKER_TIMEOUT_S = 5.0


def single_query_curve(b: Bench, dep, mode: str, slo_ms: float) -> dict:
    """The p99-vs-load curve of single-vertex queries in `mode` on the sage deployment: the rate
    one query at a time sustains is calibrated first, the sweep starts at a fifth of it (5 rps at
    least) and the curve records that calibrated rate."""
    from sparkgnn.serving.online.server import Server

    with Server(server_config(dep, "sage", mode)) as srv:
        est = b.calibrate(srv, "single", mode)
        curve = b.sweep(srv, "single", mode, max(5.0, 0.2 * est), f"{mode.upper()} single", factor=1.6, slo_ms=slo_ms)
    curve["calibrated_rps_one_at_a_time"] = est
    return curve


def experiment_capacity_and_schedulers(b: Bench, dep, s, facts_mixed) -> dict:
    from sparkgnn.serving.online.server import Server

    out: dict = {}
    log("[1] single-query HE capacity and p99 curve (inprocess pool, degree scheduler)")
    out["he_single"] = single_query_curve(b, dep, "he", HE_SLO_MS)
    mode = s["sched_mode"]
    log(f"[1] mixed-size {mode.upper()} capacity under FIFO, then schedulers at {s['sched_load']:.0%} of it")
    with Server(server_config(dep, "sage", mode, scheduler="fifo")) as srv:
        for other in ("he", "exact", "full"):  # which mode's service time follows the predicted cost?
            if other != mode:
                b.calibrate(srv, "mixed", other, facts_mixed["cost"])
        est = b.calibrate(srv, "mixed", mode, facts_mixed["cost"])
        mixed = b.sweep(srv, "mixed", mode, max(2.0, 0.4 * est), f"{mode} mixed fifo", factor=1.4)
        mixed["calibrated_rps_one_at_a_time"] = est
        out["mixed_fifo"] = mixed
    cap = mixed["capacity_rps"] or mixed["points"][0]["rate"] / 2
    rate = s["sched_load"] * cap
    t_s = int(2 * np.median(facts_mixed["hop"]))
    configs = {
        "fifo": {"scheduler": "fifo"},
        "degree": {"scheduler": "degree"},
        "degree_divider": {"scheduler": "degree", "t_s": t_s},
    }
    repeats = s["sched_repeats"]
    sched: dict = {"rate_rps": rate, "mode": mode, "t_s": t_s, "repeats": repeats, "runs": {}, "per_repeat": {}}
    raw: dict = {}
    nan = float("nan")
    for process in ("poisson", "bursty"):
        sched["per_repeat"][process] = {name: [] for name in configs}
        for rep in range(repeats):  # alternate the order so drift on the box hits every scheduler alike
            order = list(configs) if rep % 2 == 0 else list(reversed(configs))
            for name in order:
                with Server(server_config(dep, "sage", mode, **configs[name])) as srv:
                    seed = 1000 + 10 * rep + (process == "bursty")
                    p, res = b.point(srv, "mixed", mode, rate, process=process, seed=seed)
                sched["per_repeat"][process][name].append(p)
                raw.setdefault((process, name), []).append(res)
                log(
                    f"  {process:7s} {name:15s} {rate:7.1f} req/s: mean {p.get('latency_mean_ms', nan):7.1f}"
                    f" p50 {p.get('latency_p50_ms', nan):7.1f} p99 {p.get('latency_p99_ms', nan):7.1f}"
                    f" ms, batches {p.get('batches')}, busy {p['busy']} lost {p['lost']}"
                )
        sched["runs"][process] = {}
        for name in configs:
            merged = merge_results(raw[(process, name)])
            raw[(process, name)] = merged
            p = summarise(merged)
            reps = sched["per_repeat"][process][name]
            p["batches"] = sum(r.get("batches", 0) for r in reps)
            p["batch_seconds_max"] = max(r.get("batch_seconds_max", 0.0) for r in reps)
            p["repeat_mean_latency_ms"] = [r.get("latency_mean_ms") for r in reps]
            sched["runs"][process][name] = p
    out["schedulers"] = sched
    # wait / own service, per request, under the degree scheduler (and FIFO for comparison)
    ratios = {}
    for process in ("poisson", "bursty"):
        for name in configs:
            res = raw[(process, name)]
            ok = np.array(res["status"]) == "ok"
            q = np.array(res["queue_ms"], np.float64)[ok]
            sv = np.array(res["service_ms"], np.float64)[ok]
            r = q / np.maximum(sv, 1e-3)
            ratios[f"{process}/{name}"] = {
                "max": float(r.max()) if len(r) else None,
                "p99": float(np.percentile(r, 99)) if len(r) else None,
                "mean": float(r.mean()) if len(r) else None,
            }
            # does the wait follow the request's cost? (degree favours cheap requests)
            if len(r):
                cost = facts_mixed["cost"][np.array(res["pick"])[ok]]
                cheap = cost <= np.median(cost)
                ratios[f"{process}/{name}"]["queue_mean_ms_cheap_half"] = float(q[cheap].mean())
                ratios[f"{process}/{name}"]["queue_mean_ms_costly_half"] = (
                    float(q[~cheap].mean()) if (~cheap).any() else None
                )
    out["wait_over_service"] = ratios
    out["cost_model"] = b.cost_model
    return out


def experiment_big_and_exact(b: Bench, dep, s) -> dict:
    from sparkgnn.serving.online.server import Server

    out: dict = {"B": BIG_B, "repeats": s["big_repeats"]}
    for kind in KINDS:
        log(f"[4] one request of {BIG_B} queries, HE vs EXACT, {kind}")
        with Server(server_config(dep, kind, "he")) as srv:
            r = {}
            for mode in ("he", "exact"):
                b.closed(srv, "big", mode, 1, index=0)  # warm-up (lazy indexes of the mode)
                r[mode] = b.closed(srv, "big", mode, s["big_repeats"], index=0)
            r["exact_over_he_latency"] = r["exact"]["latency_median_ms"] / r["he"]["latency_median_ms"]
            r["exact_over_he_service"] = r["exact"]["service_median_ms"] / r["he"]["service_median_ms"]
            log(
                f"  {kind}: HE {r['he']['latency_median_ms']:.1f} ms, EXACT {r['exact']['latency_median_ms']:.1f} ms"
                f" -> {r['exact_over_he_latency']:.2f}x"
            )
            out[kind] = r
    log("[4] single-query EXACT p99 vs load (sage)")
    out["exact_single"] = single_query_curve(b, dep, "exact", EXACT_SLO_MS)
    return out


def experiment_workers(b: Bench, dep, s, he_capacity: float | None) -> dict:
    from sparkgnn.serving.online.server import Server

    out = {}
    for width in (1, 2):
        log(f"[5] 'workers' pool of width {width} (1 torch thread each), single-query HE")
        pools = [{"name": f"w{width}", "kind": "workers", "width": width, "threads": 1, "timeout_s": WORKER_TIMEOUT_S}]
        t0 = time.perf_counter()
        with Server(server_config(dep, "sage", "he", pools=pools)) as srv:
            started = time.perf_counter() - t0
            start = 0.5 * (out["1"]["capacity_rps"] if width == 2 and out["1"]["capacity_rps"] else (he_capacity or 50))
            curve = b.sweep(srv, "single", "he", max(5.0, start), f"HE workers x{width}")
        curve["start_seconds"] = started
        out[str(width)] = curve
    return out


def experiment_cache(b: Bench, dep, s) -> dict:
    from sparkgnn.serving.online.server import Server

    try:
        from sparkgnn.serving.online.hotcache import attach_hot_cache  # noqa: F401
    except ImportError as exc:
        return {"skipped": f"hot cache not available: {exc}"}
    base = server_config(dep, "sage", "he")
    total = store_bytes(base)
    budget = int(s["cache_fraction"] * total)
    out: dict = {"store_bytes": total, "budget_bytes": budget, "fraction": s["cache_fraction"], "mode": "he"}
    rate = None
    for policy in ("off", "degree", "fap"):
        cfg = server_config(dep, "sage", "he", cache={"policy": policy, "bytes": budget})
        with Server(cfg) as srv:
            if rate is None:
                rate = 0.5 * (b.calibrated.get("mixed/he") or b.calibrate(srv, "mixed", "he"))
                out["rate_rps"] = rate
            p, _ = b.point(srv, "mixed", "he", rate, seed=2000)
            stats = srv.cache_stats
        p["cache_stats"] = stats
        p["hit_rate"] = float(stats["hit_rate"]) if stats else 0.0
        out[policy] = p
        log(
            f"[6] cache {policy:6s}: hit rate {p['hit_rate']:.3f}, mean "
            f"{p.get('latency_mean_ms', float('nan')):.1f} ms, p99 {p.get('latency_p99_ms', float('nan')):.1f} ms"
        )
    return out


def experiment_router(b: Bench, dep, s, facts_mixed, rate: float) -> dict:
    """Quiver's PSGS router: batches below the threshold to the first pool ("small": the front
    end's own process, width 1), the rest to the second ("big": 2 sparkgnn-worker processes).
    WHY not two "workers" pools: a pool's dealer that idles longer than the messenger's liveness
    stalls on its next call (worker_pool_idle_probe), and a second workers pool idles while the
    first starts and whenever the router sends it nothing for a while."""
    from sparkgnn.serving.online.server import Server

    threshold = float(np.median(facts_mixed["psgs"]))
    small = {"name": "small", "kind": "inprocess", "width": 1, "threads": 1}
    big = {"name": "big", "kind": "workers", "width": 2, "threads": 1, "timeout_s": WORKER_TIMEOUT_S}
    configs = {
        "psgs_router": {"pools": [small, big], "router": "psgs", "route_psgs": threshold},
        "single_pool_workers_w2": {"pools": [big]},
        "single_pool_inprocess_w1": {"pools": [small]},
    }
    out: dict = {"route_psgs": threshold, "rate_rps": rate, "mode": "he", "runs": {}}
    for name, opts in configs.items():
        with Server(server_config(dep, "sage", "he", **opts)) as srv:
            p, _ = b.point(srv, "mixed", "he", rate, seed=3000)
            p["overflow"] = srv.stats["overflow"]
            per_pool: dict = {}
            for row in srv.batch_log:
                d = per_pool.setdefault(row["pool"], {"batches": 0, "requests": 0, "seconds": 0.0, "psgs": 0.0})
                d["batches"] += 1
                d["requests"] += row["requests"]
                d["seconds"] += row["seconds"]
                d["psgs"] += row["psgs"]
            for d in per_pool.values():
                d["mean_batch_ms"] = d.pop("seconds") / d["batches"] * 1e3
                d["mean_batch_psgs"] = d.pop("psgs") / d["batches"]
            p["per_pool"] = per_pool
        out["runs"][name] = p
        log(
            f"[7] {name:24s} {rate:.1f} req/s: mean {p.get('latency_mean_ms', float('nan')):.1f} p99 "
            f"{p.get('latency_p99_ms', float('nan')):.1f} ms, batches {p.get('batches_per_pool')}, overflow "
            f"{p['overflow']}"
        )
    return out


def probe_worker_idle(b: Bench, dep, s) -> dict:
    """A regression check of the dealer's idle-gap fix: single-query requests one after the other
    to a "workers" pool of width 1 (dealer timeout_s 2), after idle gaps of 0 to 3 s. A dealer that
    heard nothing from its broker for longer than liveness x heartbeat (3 x 0.5 s in WorkerPool)
    used to reopen its broker socket right after sending a LEASE, losing it and paying two
    timeouts; latencies must now be flat and broker_reconnects 0."""
    from sparkgnn.serving.online.server import Server

    gaps = [0.0, 0.0, 0.5, 1.0, 2.0, 0.0, 3.0, 0.0]
    pools = [{"name": "w", "kind": "workers", "width": 1, "threads": 1, "timeout_s": 2.0}]
    with Server(server_config(dep, "sage", "he", pools=pools)) as srv:
        wait_idle(srv)
        job = {
            "endpoint": srv.zmq_endpoint,
            "pool": b.pools["single"],
            "mode": "he",
            "closed": True,
            "n": len(gaps),
            "gaps": gaps,
        }
        res = b.lg.run(job)
        counts = dict(srv.pools[0]._dealers[0].counts)
    lat = [(r - t) * 1e3 if r is not None else None for r, t in zip(res["received"], res["scheduled"], strict=True)]
    out = {
        "timeout_s": 2.0,
        "idle_gap_s": gaps,
        "latency_ms": lat,
        "service_ms": res["service_ms"],
        "dealer_counts": counts,
    }
    log(f"[7] worker pool idle probe: gaps {gaps} s -> latencies {[round(v) if v else v for v in lat]} ms")
    return out


# -- authentication cost -----------------------------------------------------------------------------
AUTH_SERVER_ROLES = ("front_end", "workers", "brokers")
# Variants per front, in sweep order (reversed every other repeat). http's "token" is "secured"
# without TLS, so secured vs token is TLS alone and token vs plain the token check with CURVE behind.
AUTH_VARIANTS = {"zmq": ("plain", "secured"), "http": ("plain", "token", "secured")}


def _tls_pair(folder: str) -> tuple[str, str] | None:
    """A self-signed certificate for 127.0.0.1 and its key (PEM, by the openssl command), or None
    when openssl is not installed. An ECDSA P-256 key, as production HTTPS fronts use: its
    handshake signature costs the server a fraction of an RSA key's (RSA-4096: several ms each)."""
    import os
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        return None
    cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
        check=True,
        capture_output=True,
    )
    return cert, key


def _cpu_ms_per_request(point: dict) -> dict:
    """CPU milliseconds per answered request of a point: the service's processes together
    (front end with the HTTP/ZeroMQ fronts, workers, broker) and the load generator apart."""
    ok = max(point["ok"], 1)
    secs = point.get("cpu_seconds", {})
    return {
        "service": 1e3 * sum(secs.get(r, 0.0) for r in AUTH_SERVER_ROLES) / ok,
        "generator": 1e3 * secs.get("generator", 0.0) / ok,
    }


def _cost(rate: float, base: float) -> float | None:
    """1 - rate / base: the held rate a variant gives up against `base` (None when base held none)."""
    return 1 - rate / base if base else None


def _auth_options(front: str, variant: str, keys: str, token: str, tls) -> tuple[dict, list]:
    """The ServeConfig options of one variant and the list of what it has on."""
    pool = {"name": "w", "kind": "workers", "width": 1, "threads": 1, "timeout_s": WORKER_TIMEOUT_S}
    if variant == "plain":
        options: dict = {"pools": [dict(pool, transport="ipc")]}
        on: list = []
    else:
        options = {"pools": [dict(pool, transport="tcp")], "curve_keys": keys}
        on = ["ZeroMQ front CURVE (Ironhouse: allow-listed client key, pinned server key)", "worker pool tcp + CURVE"]
    if front == "http":
        options["http"] = "127.0.0.1:0"
        if variant == "token":
            options.update(token=token)
            on = ["bearer token over plain HTTP (no TLS)", *on]
        elif variant == "secured":
            options.update(token=token, tls_cert=tls[0], tls_key=tls[1])
            on = ["HTTPS (TLS 1.2+, self-signed certificate)", "bearer token", *on]
    return options, on


def _target(front: str, variant: str, srv, keys: str, token: str, tls) -> dict | None:
    """How the load generator reaches the variant's service (Bench.point's target)."""
    if front == "zmq":
        return {"keys_dir": keys} if variant == "secured" else None
    spec = {"url": srv.http_url}
    if variant == "token":
        spec.update(token=token)
    elif variant == "secured":
        spec.update(token=token, ca_file=tls[0])
    return {"http": spec}


def experiment_auth(b: Bench, dep, s, work: str, fronts=("zmq", "http"), repeats: int = 2) -> dict:
    """Single-query HE throughput held at p99 <= HE_SLO_MS, and CPU per request, with and
    without authentication: same deployment, pool width, load generator and rate grid (the start
    rate from one closed-loop calibration, shared by every sweep; the SLO boundary bisected
    `refine` + 2 times, to about 6% of the rate). The pool is a "workers" pool of width 1 (a route
    between processes to secure): plain over ipc, secured over tcp with every messenger socket
    CURVE-keyed (LocalCluster's per-run keys). Per front (_auth_options):
      zmq   plain: no keys | secured: the ZeroMQ front Ironhouse (the generator's client key on
            the allow-list, the server key pinned)
      http  plain: http://, no token | token: http:// + bearer token, CURVE behind as secured |
            secured: HTTPS (a self-signed certificate the generator trusts) + bearer token, the
            ZeroMQ front keyed as well
    Variants alternate `repeats` times (AUTH_VARIANTS' order, reversed every other repeat) so
    drift on the shared box hits all alike; rps_* is the median over repeats of each sweep's held
    rate (0 when none was held). CPU per request: one fixed-rate point per sweep at 1.5 x the start
    rate (held by every variant), twice the settings' seconds; the service's CPU seconds per
    answered request (cpu_ms_per_request_*) decide throughput on a CPU-bound box, without the p99
    criterion's noise, and the load generator's (generator_cpu_ms_per_request_*) show what the
    client's own work (TLS included) takes from the same cores."""
    import os
    import secrets

    from sparkgnn.messenger import security
    from sparkgnn.serving.online.server import Server

    keys = security.make_full_set(os.path.join(work, "auth-keys"))
    tls = _tls_pair(work)
    token = secrets.token_urlsafe(24)
    out: dict = {
        "slo_ms": HE_SLO_MS,
        "repeats": repeats,
        "pool": "workers, width 1, 1 torch thread; plain over ipc, secured over tcp with CURVE on every socket",
        "variants": {},
    }
    start = None
    refine = s["refine"] + 2
    for front in fronts:
        if front == "http" and tls is None:
            out["variants"]["http"] = {"skipped": "openssl is not installed: no certificate for HTTPS"}
            continue
        variants = AUTH_VARIANTS[front]
        runs: dict = {v: [] for v in variants}
        cpu: dict = {v: [] for v in variants}
        gen_cpu: dict = {v: [] for v in variants}
        on_of: dict = {}
        for rep in range(repeats):
            order = variants if rep % 2 == 0 else variants[::-1]
            for variant in order:
                options, on = _auth_options(front, variant, keys, token, tls)
                on_of[variant] = on
                with Server(server_config(dep, "sage", "he", **options)) as srv:
                    if start is None:
                        start = max(5.0, 0.2 * b.calibrate(srv, "single", "he"))
                        out["start_rps"] = start
                    target = _target(front, variant, srv, keys, token, tls)
                    log(f"[auth] {front} {variant} (repeat {rep + 1}): {', '.join(on) or 'no authentication'}")
                    curve = b.sweep(
                        srv,
                        "single",
                        "he",
                        start,
                        f"auth {front} {variant}",
                        factor=1.6,
                        slo_ms=HE_SLO_MS,
                        target=target,
                        refine=refine,
                    )
                    point, _ = b.point(
                        srv, "single", "he", 1.5 * start, seed=4000 + rep, target=target, duration=2 * s["duration"]
                    )
                rate, p99 = slo_rate(curve, HE_SLO_MS)
                curve.update(single_query_rps=rate, single_query_p99_ms=p99)
                point["cpu_ms_per_request"] = _cpu_ms_per_request(point)
                curve["cpu_point"] = point
                runs[variant].append(curve)
                cpu[variant].append(point["cpu_ms_per_request"]["service"])
                gen_cpu[variant].append(point["cpu_ms_per_request"]["generator"])
                log(
                    f"  -> held {rate} req/s at p99 <= {HE_SLO_MS:g} ms; CPU ms/request at {1.5 * start:.1f} req/s: "
                    f"service {point['cpu_ms_per_request']['service']:.2f}, "
                    f"generator {point['cpu_ms_per_request']['generator']:.2f}"
                )
        rps = {v: float(np.median([c["single_query_rps"] or 0.0 for c in runs[v]])) for v in runs}
        cap = {v: float(np.median([c["capacity_rps"] or 0.0 for c in runs[v]])) for v in runs}
        cpu_ms = {v: float(np.median(cpu[v])) for v in cpu}
        doc: dict = {"on": on_of["secured"], "cpu_at_rps": 1.5 * start}
        for v in variants:
            doc[v] = runs[v]
            if v == "token":
                doc["on_token"] = on_of[v]
            doc[f"rps_{v}"] = rps[v]
            doc[f"rps_{v}_repeats"] = [c["single_query_rps"] for c in runs[v]]
            doc[f"capacity_rps_{v}"] = cap[v]
            doc[f"cpu_ms_per_request_{v}"] = cpu_ms[v]
            doc[f"cpu_ms_per_request_{v}_repeats"] = cpu[v]
            doc[f"generator_cpu_ms_per_request_{v}"] = float(np.median(gen_cpu[v]))
            doc[f"generator_cpu_ms_per_request_{v}_repeats"] = gen_cpu[v]
        doc["auth_cost"] = _cost(rps["secured"], rps["plain"])
        doc["capacity_cost"] = _cost(cap["secured"], cap["plain"])
        doc["cpu_cost"] = cpu_ms["secured"] / cpu_ms["plain"] - 1 if cpu_ms["plain"] else None
        if "token" in variants:  # the secured drop split: token (with CURVE behind) vs TLS on top of it
            doc["token_cost"] = _cost(rps["token"], rps["plain"])
            doc["tls_cost"] = _cost(rps["secured"], rps["token"])
            doc["token_cpu_cost"] = cpu_ms["token"] / cpu_ms["plain"] - 1 if cpu_ms["plain"] else None
            doc["tls_cpu_cost"] = cpu_ms["secured"] / cpu_ms["token"] - 1 if cpu_ms["token"] else None
        out["variants"][front] = doc
        log(
            f"[auth] {front}: held req/s "
            + " -> ".join(f"{v} {rps[v]:.1f}" for v in variants)
            + f" (cost {doc['auth_cost']}); CPU ms/request service "
            + " -> ".join(f"{cpu_ms[v]:.2f}" for v in variants)
            + ", generator "
            + " -> ".join(f"{doc[f'generator_cpu_ms_per_request_{v}']:.2f}" for v in variants)
        )
    return out
