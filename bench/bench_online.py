"""Online serving benchmark (make bench-online): the long-running service of
sparkgnn.serving.online (Server, its GSM schedulers, worker pools, hot cache and Quiver's PSGS
router) under open-loop load from a separate load-generator process (bench/online_load.py).

Deployment (built once, cached under data/bench/online/ keyed by its parameters): a seeded
power-law synthetic graph (sparkgnn.datasets.synthetic_graph, zipf 1.0, symmetrised: 100K vertices
and 1.09M directed edges by default, 10K / 100K with --quick), a 2-layer GraphSAGE (mean) and a 2-layer GCN with
seeded random weights (PyG modules through Model.from_pyg), and each one's PE store with states and
Quiver's workload metrics (sparkgnn.pe.local.precompute_local, metrics=True: the "fap" cache policy
and the PSGS router read them).

Requests: new query nodes (ids above G's) with features copied from random G vertices, attached to
G by edges in BOTH directions to a few G vertices each (1 + Zipf(2) of them, at most 32); a third of
the queries pick their neighbours in proportion to in-degree + 1 (hubs), the rest uniformly, so the
in-degree sum a request brings (the scheduler's cost) varies by orders of magnitude between
requests. Pools: "single" (one query per request), "mixed" (1, 4, 16 or 64 queries per request),
"big" (one request of 1024 queries).

Measurements (each point a short open-loop run; module doc of online_load.py for how latency is
taken: from the scheduled send time, so the generator's lateness is included):
  1 capacity  single-query HE: offered rate stepped up until a run is not held (`held`), then
              bisected; mixed requests in --sched-mode likewise under FIFO; then FIFO vs degree
              vs degree + divider (T_s > 0) at --sched-load x that capacity, Poisson and bursty.
              --sched-mode defaults to FULL: GSM's exact inference recomputes each request's
              neighbourhood, which is what FULL does here, and its service time follows the
              in-degree sum the scheduler sorts by; sparkgnn's EXACT merges into stored states, so
              its cost hardly depends on in-degree (capacity.cost_model has the correlations)
  2           max over requests of queue time / service time under the degree scheduler
  3           single-query HE p99 vs offered load; the highest load held with p99 <= 20 ms
  4           EXACT vs HE latency for one request of 1024 queries, SAGE and GCN; the highest
              single-query EXACT load held with p99 <= 50 ms
  5           "workers" pool of width 1 vs 2 (1 torch thread each): capacity ratio
  6           hot cache off / degree / fap at --cache-fraction of the store's bytes: hit rates
  7           PSGS router over an inprocess pool (width 1) and a workers pool (width 2) vs each
              alone; and a probe of a "workers" pool after idle gaps, which stalls (see WHAT)
  8 auth      single-query HE throughput held at p99 <= 20 ms and CPU per request, with and
              without authentication (a multi-user deployment's: CURVE on the ZeroMQ front and
              on a tcp worker pool; HTTPS + bearer token on the HTTP front, and the token without
              TLS to split the two), same load generator and rate grid, with the generator's own
              CPU per request (online_experiments.experiment_auth). `--only auth` runs it alone and
              adds its section to the existing result file
  9 sharded   replicated ("workers", width 2) vs sharded pools of 2 and 4 shards, HE and EXACT:
              p50/p99 at one fixed rate, saturation throughput, RSS per worker (online_sharded.py)
Writes bench/results/online.json (every key described under "what"), online_latency.png,
online_schedulers.png and online_auth.png. No Spark is started. Timings on a shared 2-core box are noisy: the load
average at start and end is recorded.

This file is the main (settings, the result's key descriptions, the headline); the parts live in
online_deploy.py (deployment, request pools, server configs), online_measure.py (load generator
process, points, sweeps), online_experiments.py (the measurements above) and online_plots.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import ROOT, machine, write_result  # noqa: E402
from online_deploy import (  # noqa: E402
    BIG_B,
    HUB_FRACTION,
    MAX_NEIGHBOURS,
    MIX_PROBS,
    MIX_SIZES,
    ONLINE_DATA,
    build_deployment,
    describe,
    log,
    make_requests,
    pool_facts,
    server_config,
    write_pool,
)
from online_experiments import (  # noqa: E402
    experiment_auth,
    experiment_big_and_exact,
    experiment_cache,
    experiment_capacity_and_schedulers,
    experiment_router,
    experiment_workers,
    probe_worker_idle,
)
from online_fronts import experiment_fronts, experiment_idle, experiment_overload  # noqa: E402
from online_lanes import experiment_lanes  # noqa: E402
from online_measure import EXACT_SLO_MS, HE_SLO_MS, Bench, LoadGen, slo_rate  # noqa: E402
from online_plots import plot  # noqa: E402
from online_sharded import SETTINGS as SHARDED_SETTINGS  # noqa: E402
from online_sharded import experiment_sharded  # noqa: E402
from serving_models import load_average  # noqa: E402

FULL = {
    "nodes": 100_000,
    "edges": 600_000,  # generated; symmetrised to 1.09M directed edges
    "dim": 128,
    "duration": 6.0,
    "max_points": 8,
    "refine": 2,
    "pool_requests": 2000,
    "calibrate": 40,
    "big_repeats": 5,
    "sched_repeats": 2,
    "overload_seconds": 5.0,
}
QUICK = {
    "nodes": 10_000,
    "edges": 57_000,  # symmetrised to 100K directed edges
    "dim": 128,
    "duration": 2.0,
    "max_points": 6,
    "refine": 1,
    "pool_requests": 500,
    "calibrate": 15,
    "big_repeats": 3,
    "sched_repeats": 1,
    "overload_seconds": 3.0,
}
# fronts / overload / idle (online_fronts.py): the offer over HTTP as a multiple of the one-slot
# closed-loop rate, the generator's connections, the overload run's deadline, the idle window
FRONT_SETTINGS = {"fronts_offer": 3.0, "fronts_connections": 64, "overload_deadline_ms": 100.0, "idle_seconds": 5.0}
ONLY_PARTS = ("auth", "fronts", "overload", "idle", "sharded", "lanes")
FRONT_KEYS = {  # top-level key -> (section, key in it)
    "two_fronts_over_one": ("fronts", "two_fronts_over_one"),
    "service_cpu_ms_per_request": ("overload", "service_cpu_ms_per_request"),
    "overload_goodput_ratio": ("overload", "overload_goodput_ratio"),
    "idle_cpu_cores": ("idle", "idle_cpu_cores"),
}


# -- report ----------------------------------------------------------------------------------------
WHAT = {
    "what": "this: what every key of the result means (nested keys as parent.key; 'point' is one run)",
    "machine": "platform, CPU count, torch version/threads of the bench process (bench_common.machine)",
    "gpu": "null: no GPU on this machine; every pool and the hot cache ran on the CPU",
    "load_average_start": "/proc/loadavg (1, 5, 15 min) when the bench started: the box is shared",
    "load_average_end": "/proc/loadavg when the bench ended",
    "settings": "run parameters (graph size, seconds per point, sweeps, scheduler mode and load, ...)",
    "deployment": "the cached deployment: graph size and degrees, PE store build seconds per model",
    "pools": "request pools: queries per request and the front end's predicted cost (in-degree sum, "
    "GSM), largest layer-subgraph estimate and PSGS per request (mean/p50/p90/p99/max/cv)",
    "capacity": "sweeps: he_single (single-query HE, inprocess pool, degree scheduler) and mixed_fifo "
    "(mixed-size requests in settings.sched_mode under FIFO); each has points (one run per offered "
    "rate), capacity_rps (highest held rate), p99_bound_ms (the held criterion: 5 x the first "
    "point's p99, >= 50 ms), first_failed_rps, saturation_achieved_rps (highest answered rate seen), "
    "calibrated_rps_one_at_a_time (1000 / mean service ms, closed loop)",
    "capacity.schedulers": "FIFO vs degree vs degree + divider (T_s = t_s) on the mixed pool at "
    "rate_rps = settings.sched_load x mixed capacity, Poisson and bursty (on/off MMPP, 3x rate 25% of "
    "the time) arrivals; identical send times and requests across schedulers; `repeats` runs each "
    "(orders alternated), runs = statistics over all their requests, per_repeat = each run",
    "capacity.wait_over_service": "per run: max / p99 / mean over answered requests of queue_ms / "
    "service_ms (the service time of the batch the request ran in), and mean queue ms of the cheaper "
    "and costlier half of the requests by predicted cost",
    "point": "one run: rate (target), offered_rps (sent / duration), requests, ok/busy/errors/lost, "
    "achieved_rps (ok / max(last answer, duration)), keep_up (achieved / offered), latency_*_ms "
    "(received - scheduled send time, answered requests), queue_*_ms and service_mean_ms (the "
    "service's own header fields), batch_requests_mean/max, send_lateness_ms_* (generator: sent - "
    "scheduled), batches, batches_per_pool and batch_seconds_max (server batch log), held (see capacity), "
    "cpu_cores (CPU seconds / wall seconds of the run per role: front_end = the bench process with the "
    "service and its inprocess pools, generator, workers, brokers; the box has 2 cores)",
    "degree_vs_fifo_mean_latency": "mean latency under the degree scheduler / under FIFO (Poisson run "
    "of capacity.schedulers); < 1 means degree-first ordering helped",
    "degree_divider_vs_fifo_mean_latency": "mean latency degree + divider / FIFO (Poisson)",
    "degree_vs_fifo_mean_latency_bursty": "as degree_vs_fifo_mean_latency under bursty arrivals",
    "degree_vs_fifo_p99_latency": "p99 latency degree / FIFO (Poisson)",
    "max_wait_over_service": "max over answered requests of queue time / service time under the "
    "degree scheduler (Poisson run): the promotion rule bounds a request's wait by max_wait_factor "
    "(4) x its predicted service, plus the batch it waits behind",
    "single_query_rps": "highest offered single-query HE rate (inprocess pool) held with p99 <= 20 ms "
    "(the target is 2000 req/s); null if none was",
    "single_query_p99_ms": "p99 latency (ms) at single_query_rps",
    "single_query_capacity_rps": "highest single-query HE rate held under the capacity criterion",
    "exact_over_he_latency_sage": "EXACT / HE median client latency of one request of 1024 queries, SAGE",
    "exact_over_he_latency_gcn": "the same for the GCN",
    "exact_single_query_rps": "highest single-query EXACT rate held with p99 <= 50 ms (SAGE, inprocess)",
    "exact_single_query_p99_ms": "p99 latency at exact_single_query_rps",
    "big_request": "the B=1024 runs: per model, he/exact closed-loop latencies (ms) and service times, "
    "ratios; exact_single is the single-query EXACT sweep",
    "two_workers_over_one": "capacity_rps of a 'workers' pool of width 2 / width 1 (single-query HE, "
    "1 torch thread per worker); the front end and the generator share the same 2 cores",
    "two_workers_over_one_saturation": "the same ratio of saturation_achieved_rps",
    "workers": "the two sweeps behind two_workers_over_one (start_seconds: pool start + warm-up)",
    "cache": "hot cache off / degree / fap at budget_bytes (fraction x store_bytes of the HE engine's "
    "stored arrays): one mixed HE run each at rate_rps; hit_rate and the server's cache_stats",
    "cache_hit_rate": "hit rate per policy (off = 0: nothing cached)",
    "router": "Quiver's PSGS router (route_psgs = median request PSGS) over an inprocess pool of width 1 "
    "('small', batches below the threshold) and a workers pool of width 2 ('big'), vs each pool alone, "
    "same mixed HE load (rate_rps = 0.5 x the closed-loop mixed HE rate); per run batches_per_pool, "
    "per_pool (batches, requests, mean_batch_ms, mean_batch_psgs), overflow (batches sent to the other "
    "pool because theirs was full)",
    "router_vs_single_pool_mean_latency": "mean latency with the router / with the workers pool of width 2 alone",
    "worker_pool_idle_probe": "sequential single-query requests to a 'workers' pool of width 1 (dealer "
    "timeout_s 2) after idle gaps (idle_gap_s): latency_ms per request and the dealer's counters. Before "
    "the dealer fix (commit 'Messenger dealer: a call after an idle gap...') a request after more than "
    "~1.5 s of idling took two timeouts (resent, broker_reconnects > 0); now every latency should be flat",
    "capacity.cost_model": "closed-loop service times of the mixed pool in he / exact / full, and the "
    "correlation of service ms with the predicted cost (in-degree sum) and its log: the scheduler "
    "comparison runs in the mode whose service time follows the cost (settings.sched_mode)",
    "seconds_total": "wall time of the bench",
    "auth": "authentication cost (experiment_auth; 'workers' pool of width 1, plain over ipc, secured over "
    "tcp + CURVE): per front (variants.zmq: ZeroMQ front plain vs CURVE Ironhouse; variants.http: http:// "
    "without a token vs token: http:// + bearer token with CURVE behind as secured, vs secured: HTTPS + bearer "
    "token, ZeroMQ front keyed too) `on` / on_token (what the secured / token variant had on), "
    "plain / token / secured (one sweep per repeat, as capacity's, plus single_query_rps and cpu_point: a fixed-rate "
    "point at cpu_at_rps with cpu_ms_per_request), rps_plain / rps_secured (median over repeats of the "
    "single-query HE rate held with p99 <= slo_ms), auth_cost (1 - secured / plain), capacity_rps_* and "
    "capacity_cost (the same for capacity_rps), cpu_ms_per_request_plain / _secured (median service CPU ms "
    "per answered request: front end + workers + broker) and cpu_cost (secured / plain - 1), "
    "generator_cpu_ms_per_request_* (the load generator's CPU ms per answered request at the same point: it "
    "shares the box's 2 cores with the service), http only: token_cost (1 - token / plain held rate), "
    "tls_cost (1 - secured / token), token_cpu_cost and tls_cpu_cost (the same ratios of service CPU), "
    "*_repeats (each repeat's value: their spread is the run's noise); HTTP points' connections_opened (the "
    "generator's connects + TLS handshakes in that point: its keep-alive connections are kept across the points "
    "of one service, as a client's pool keeps them; the certificate is ECDSA P-256); run (--only "
    "auth or the whole bench), scale, graph, seconds_per_point, machine, loadavg (os.getloadavg() as it "
    "started), load averages, seconds",
    "fronts": "online_fronts.experiment_fronts: single-query HE over HTTP with ServeConfig.fronts 1 and 2 "
    "(keys '1', '2': one point each at offered_rps = offer_factor x the one-slot closed-loop rate, the "
    "generator's `connections` keep-alive connections, cpu_cores/cpu_seconds with the front processes as "
    "'fronts', service_cpu_ms_per_request), two_fronts_over_one (answered req/s 2 / 1); run, scale, graph, "
    "machine, loadavg, load averages, seconds",
    "overload": "online_fronts.experiment_overload: single-query HE over ZeroMQ with deadline_ms: "
    "capacity_sweep / capacity_rps (held, as capacity's sweeps), service_cpu_ms_per_request at the highest "
    "held rate, overload (one point offered 2 x capacity_rps: achieved_rps answered, busy refusals, "
    "refusal_ms_p50/p99/max from the send, refusal_from_scheduled_ms_p99), overload_goodput_ratio "
    "(achieved / capacity), every_excess_refused (no error, none lost); run, scale, ...",
    "idle": "online_fronts.experiment_idle: a warmed service with fronts=2 left idle `seconds`: cpu_cores "
    "per role (front_end: the service's process, fronts: its front processes, workers), idle_cpu_cores "
    "(their sum); run, scale, ...",
    "two_fronts_over_one": "fronts.two_fronts_over_one (the issue asks >= 1.6)",
    "service_cpu_ms_per_request": "overload.service_cpu_ms_per_request: the service's CPU ms per answered "
    "single-query HE request at its held capacity (the issue asks <= 0.5)",
    "overload_goodput_ratio": "overload.overload_goodput_ratio (the issue asks >= 0.9, excess refused fast)",
    "idle_cpu_cores": "idle.idle_cpu_cores (the issue asks <= 0.05)",
    "lanes": "online_lanes.experiment_lanes (--only lanes): ServeConfig.express_lanes 0 vs the default in one run: "
    "summary['poisson|bursty/lanes_N'] = mean latency, p99 and the longest wait / own service of mixed-size requests "
    "under the degree scheduler at sched_load x the lanes-off mixed capacity (sched_repeats runs per arm, "
    "alternating); "
    "summary['overload/lanes_N'] = answered req/s / the lanes-off HE capacity when offered 2 x that capacity",
    "sharded": "online_sharded.experiment_sharded: SAGE single-query HE and EXACT over ZeroMQ served by layouts "
    "replicated ('workers' pool, width 2, whole store per worker), sharded_2 and sharded_4 (sharded pools, one "
    "worker per shard): per layout and mode calibrated_rps (one slot, closed loop), fixed_point at "
    "fixed_rate_rps (sharded_load x sharded_4's calibrated rate, the same for every layout; at least "
    "sharded_fixed_requests requests) with its latency_p50_ms/latency_p99_ms, saturation_point offered "
    "sharded_saturation_offer x calibrated x width and its answered saturation_rps; memory: per worker pid, "
    "VmRSS, RssAnon (private pages) and rows_bytes (store rows it holds: sharded.shard_bytes); row: the "
    "table (p50/p99/saturation per mode, worker RSS, worker_rss_anon_over_replicated); run, scale, graph, "
    "machine, loadavg, load averages, seconds",
}


def _relative_paths(doc):
    """The deployment document with paths under the repository made relative to it."""
    if isinstance(doc, dict):
        return {k: _relative_paths(v) for k, v in doc.items()}
    if isinstance(doc, str) and doc.startswith(ROOT + os.sep):
        return os.path.relpath(doc, ROOT)
    return doc


def _ratio(a, b):
    return a / b if a is not None and b else None


def _auth_section(b, dep, s, work, run: str, load_start, started) -> dict:
    """experiment_auth with how, where and at what scale it ran."""
    loadavg = list(os.getloadavg())
    auth = experiment_auth(b, dep, s, work, repeats=s["auth_repeats"])
    auth.update(
        loadavg=loadavg,
        run=run,
        scale="quick" if s["quick"] else "full",
        graph={"vertices": dep["num_vertices"], "edges": dep["num_edges"]},
        seconds_per_point=s["duration"],
        machine=machine(),
        load_average_start=load_start,
        load_average_end=load_average(),
        seconds=time.perf_counter() - started,
    )
    return auth


def _log_auth(auth: dict) -> None:
    """The auth section's headline: per front, held rates plain (-> token) -> secured, cost, CPU
    per request of the service and of the load generator."""
    for front, doc in auth["variants"].items():
        if "skipped" in doc:
            log(f"  auth {front}: skipped ({doc['skipped']})")
            continue
        names = [v for v in ("plain", "token", "secured") if f"rps_{v}" in doc]

        def chain(key: str, fmt: str, names=names, doc=doc) -> str:
            return " -> ".join(format(doc[key.format(v)], fmt) for v in names)

        log(
            f"  auth {front} ({' -> '.join(names)}): {chain('rps_{}', '.1f')} req/s (p99 <= {auth['slo_ms']:g} ms), "
            f"cost {doc['auth_cost']}; CPU ms/request service {chain('cpu_ms_per_request_{}', '.2f')}, "
            f"generator {chain('generator_cpu_ms_per_request_{}', '.2f')}"
        )


def _front_sections(b, dep, s, parts: set, run: str) -> dict:
    """The fronts / overload / idle (online_fronts.py) and sharded (online_sharded.py) sections
    named in `parts`, each with how, where and at what scale it ran."""
    from sparkgnn.serving.online.config import ServeConfig

    runners = {
        "lanes": lambda b, dep, s: experiment_lanes(b, dep, s, ServeConfig.express_lanes),
        "fronts": experiment_fronts,
        "overload": experiment_overload,
        "idle": experiment_idle,
        "sharded": experiment_sharded,
    }
    out = {}
    for part in ("lanes", "fronts", "overload", "idle", "sharded"):
        if part not in parts:
            continue
        started, loadavg, load_start = time.perf_counter(), list(os.getloadavg()), load_average()
        section = runners[part](b, dep, s)
        section.update(
            loadavg=loadavg,
            run=run,
            scale="quick" if s["quick"] else "full",
            graph={"vertices": dep["num_vertices"], "edges": dep["num_edges"]},
            machine=machine(),
            load_average_start=load_start,
            load_average_end=load_average(),
            seconds=time.perf_counter() - started,
        )
        out[part] = section
    return out


def _front_headline(result: dict) -> None:
    """The top-level keys of the fronts / overload / idle sections present in `result`."""
    for key, (section, inner) in FRONT_KEYS.items():
        if section in result:
            result[key] = result[section].get(inner)


def _write_only(name: str, fresh: dict, sections: dict, work: str) -> int:
    """--only: the sections run written into the existing result `name` (the rest of it kept as
    the last whole run left it), or into a new file holding only this run."""
    import json

    from bench_common import RESULTS

    path = os.path.join(RESULTS, f"{name}.json")
    result = fresh
    if os.path.exists(path):
        with open(path) as fh:
            result = json.load(fh)
    for part, section in sections.items():
        result[part] = section
        result.setdefault("what", {})[part] = WHAT[part]
    _front_headline(result)
    for key in FRONT_KEYS:
        if key in result:
            result["what"][key] = WHAT[key]
    path = write_result(name, result)
    paths = plot(result, name)
    shutil.rmtree(work, ignore_errors=True)
    if "auth" in sections:
        _log_auth(sections["auth"])
    for key in FRONT_KEYS:
        if any(FRONT_KEYS[key][0] == part for part in sections):
            log(f"  {key:<40} {result.get(key)}")
    log(f"\nwrote {path} {' '.join(paths)} in {sum(v['seconds'] for v in sections.values()):.0f} s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100K-edge graph, 2 s per point, shorter sweeps")
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--edges", type=int, help="generated edges (symmetrised: about twice as many directed)")
    parser.add_argument("--duration", type=float, help="seconds per point")
    parser.add_argument("--max-points", type=int)
    parser.add_argument("--refine", type=int, help="bisection steps after a sweep")
    parser.add_argument(
        "--sched-mode", default="full", choices=["he", "exact", "full"], help="mode of the scheduler runs (module doc)"
    )
    parser.add_argument("--sched-load", type=float, default=0.85, help="fraction of the mixed capacity")
    parser.add_argument("--sched-repeats", type=int, help="runs per scheduler and arrival process")
    parser.add_argument("--cache-fraction", type=float, default=0.1)
    parser.add_argument(
        "--skip", default="", help="comma list of: exact, workers, cache, router, auth, fronts, overload, idle, sharded"
    )
    parser.add_argument(
        "--only",
        help=f"comma list of {', '.join(ONLY_PARTS)}: run these parts alone and write their sections into the "
        "existing result file (a few minutes)",
    )
    parser.add_argument("--auth-repeats", type=int, default=2, help="plain/secured sweep pairs per front (auth)")
    parser.add_argument("--build-only", action="store_true", help="build (or find) the deployment and stop")
    parser.add_argument("--name", default=None, help="result stem (default online, online_quick with --quick)")
    args = parser.parse_args()
    only = {x for x in (args.only or "").split(",") if x}
    if only - set(ONLY_PARTS):
        parser.error(f"--only: unknown part(s) {sorted(only - set(ONLY_PARTS))}; known: {', '.join(ONLY_PARTS)}")
    s = dict(QUICK if args.quick else FULL)
    s.update(FRONT_SETTINGS, **SHARDED_SETTINGS)
    for key in ("nodes", "edges", "duration", "max_points", "refine", "sched_repeats"):
        if getattr(args, key) is not None:
            s[key] = getattr(args, key)
    s.update(
        zipf=1.0,
        seed=0,
        sched_mode=args.sched_mode,
        sched_load=args.sched_load,
        cache_fraction=args.cache_fraction,
        quick=args.quick,
        auth_repeats=args.auth_repeats,
    )
    skip = {x for x in args.skip.split(",") if x}
    name = args.name or ("online_quick" if args.quick else "online")
    started = time.perf_counter()
    import torch

    torch.set_num_threads(1)
    load_start = load_average()
    dep = build_deployment(s)
    if args.build_only:
        return 0
    from sparkgnn.graph.reader import read_graph_dir

    G = read_graph_dir(dep["graph"])
    reqs = {
        "single": make_requests(G, s["pool_requests"], (1,), (1.0,), seed=1),
        "mixed": make_requests(G, s["pool_requests"], MIX_SIZES, MIX_PROBS, seed=2),
        "big": make_requests(G, 1, (BIG_B,), (1.0,), seed=3),
    }
    work = tempfile.mkdtemp(prefix="bench-online-", dir=ONLINE_DATA)
    pools = {k: write_pool(os.path.join(work, f"pool_{k}.npz"), v) for k, v in reqs.items()}
    facts = {k: pool_facts(dep, "sage", v) for k, v in reqs.items()}
    pool_doc = {
        k: {
            "requests": len(v),
            "queries_per_request": describe(np.array([r.batch_size for r in v], np.float64)),
            "edges_per_request": describe(np.array([len(r.src) for r in v], np.float64)),
            "cost": describe(facts[k]["cost"]),
            "largest_hop_estimate": describe(facts[k]["hop"].astype(np.float64)),
            "psgs": describe(facts[k]["psgs"]),
        }
        for k, v in reqs.items()
    }
    del G
    log(
        f"pools: single cost cv {pool_doc['single']['cost']['cv']:.2f} (p50 {pool_doc['single']['cost']['p50']:.0f}, "
        f"max {pool_doc['single']['cost']['max']:.0f}); mixed cost cv {pool_doc['mixed']['cost']['cv']:.2f}"
    )
    result: dict = {
        "what": WHAT,
        "machine": machine(),
        "gpu": None,
        "load_average_start": load_start,
        "settings": {
            **s,
            "mix_sizes": list(MIX_SIZES),
            "mix_probs": list(MIX_PROBS),
            "hub_fraction": HUB_FRACTION,
            "max_neighbours_per_query": MAX_NEIGHBOURS,
            "he_slo_ms": HE_SLO_MS,
            "exact_slo_ms": EXACT_SLO_MS,
            "held": "all answered ok, achieved >= 0.9 x offered, p99 <= bound",
            "server": "ServeConfig defaults (T_d 4096, capacity 4096, max_batch 1024, max_wait_factor 4) unless noted; "
            "the service runs in the bench process, the load generator in its own",
        },
        "deployment": _relative_paths({k: v for k, v in dep.items() if k != "root"}),
        "pools": pool_doc,
    }
    lg = LoadGen(work)
    b = Bench(s, lg, pools)
    if only:
        sections = {}
        try:
            if "auth" in only:
                sections["auth"] = _auth_section(b, dep, s, work, "--only auth", load_start, started)
            sections.update(_front_sections(b, dep, s, only, f"--only {args.only}"))
        finally:
            lg.close()
        return _write_only(name, result, sections, work)
    try:
        result["capacity"] = experiment_capacity_and_schedulers(b, dep, s, facts["mixed"])
        he = result["capacity"]["he_single"]
        rate, p99 = slo_rate(he, HE_SLO_MS)
        result["single_query_rps"], result["single_query_p99_ms"] = rate, p99
        result["single_query_capacity_rps"] = he["capacity_rps"]
        runs = result["capacity"]["schedulers"]["runs"]
        mean = lambda process, n: runs[process][n].get("latency_mean_ms")  # noqa: E731
        result["degree_vs_fifo_mean_latency"] = _ratio(mean("poisson", "degree"), mean("poisson", "fifo"))
        result["degree_divider_vs_fifo_mean_latency"] = _ratio(
            mean("poisson", "degree_divider"), mean("poisson", "fifo")
        )
        result["degree_vs_fifo_mean_latency_bursty"] = _ratio(mean("bursty", "degree"), mean("bursty", "fifo"))
        result["degree_vs_fifo_p99_latency"] = _ratio(
            runs["poisson"]["degree"].get("latency_p99_ms"), runs["poisson"]["fifo"].get("latency_p99_ms")
        )
        result["max_wait_over_service"] = result["capacity"]["wait_over_service"]["poisson/degree"]["max"]
        if "exact" not in skip:
            big = experiment_big_and_exact(b, dep, s)
            result["big_request"] = big
            result["exact_over_he_latency_sage"] = big["sage"]["exact_over_he_latency"]
            result["exact_over_he_latency_gcn"] = big["gcn"]["exact_over_he_latency"]
            rate, p99 = slo_rate(big["exact_single"], EXACT_SLO_MS)
            result["exact_single_query_rps"], result["exact_single_query_p99_ms"] = rate, p99
        if "cache" not in skip:
            result["cache"] = experiment_cache(b, dep, s)
            if "off" in result["cache"]:
                result["cache_hit_rate"] = {p: result["cache"][p]["hit_rate"] for p in ("off", "degree", "fap")}
        if "workers" not in skip:
            w = experiment_workers(b, dep, s, he["capacity_rps"])
            result["workers"] = w
            result["two_workers_over_one"] = _ratio(w["2"]["capacity_rps"], w["1"]["capacity_rps"])
            result["two_workers_over_one_saturation"] = _ratio(
                w["2"]["saturation_achieved_rps"], w["1"]["saturation_achieved_rps"]
            )
        if "router" not in skip:
            mixed_he = b.calibrated.get("mixed/he")
            if mixed_he is None:
                from sparkgnn.serving.online.server import Server

                with Server(server_config(dep, "sage", "he")) as srv:
                    mixed_he = b.calibrate(srv, "mixed", "he")
            router = experiment_router(b, dep, s, facts["mixed"], 0.5 * mixed_he)
            result["router"] = router
            result["router_vs_single_pool_mean_latency"] = _ratio(
                router["runs"]["psgs_router"].get("latency_mean_ms"),
                router["runs"]["single_pool_workers_w2"].get("latency_mean_ms"),
            )
            result["worker_pool_idle_probe"] = probe_worker_idle(b, dep, s)
        if "auth" not in skip:
            result["auth"] = _auth_section(b, dep, s, work, "whole bench", load_average(), time.perf_counter())
        result.update(_front_sections(b, dep, s, {"fronts", "overload", "idle", "sharded"} - skip, "whole bench"))
        _front_headline(result)
    finally:
        lg.close()
    result["load_average_end"] = load_average()
    result["seconds_total"] = time.perf_counter() - started
    path = write_result(name, result)
    paths = plot(result, name)
    shutil.rmtree(work, ignore_errors=True)
    log("\nheadline:")
    for key in (
        "single_query_rps",
        "single_query_p99_ms",
        "single_query_capacity_rps",
        "degree_vs_fifo_mean_latency",
        "degree_divider_vs_fifo_mean_latency",
        "degree_vs_fifo_mean_latency_bursty",
        "max_wait_over_service",
        "exact_over_he_latency_sage",
        "exact_over_he_latency_gcn",
        "exact_single_query_rps",
        "two_workers_over_one",
        "cache_hit_rate",
        "router_vs_single_pool_mean_latency",
        *FRONT_KEYS,
    ):
        v = result.get(key)
        log(f"  {key:<40} {round(v, 3) if isinstance(v, float) else v}")
    if "auth" in result:
        _log_auth(result["auth"])
    log(f"\nwrote {path} {' '.join(paths)} in {result['seconds_total']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
