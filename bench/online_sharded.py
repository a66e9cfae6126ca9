"""bench-online's sharded-vs-replicated measurement (bench_online.py, `--only sharded` or the whole
bench): the same deployment (SAGE, its PE store with states) served by

  replicated  a "workers" pool of width 2: two worker processes, each holding the whole store
  sharded_2   a sharded pool of 2 shards (serving/online/sharded.py): each shard worker holds only
  sharded_4   its rows and every layer's job fans out to the shards with work in it (CGP),
              partials merged in the service process

For each layout and each of HE and EXACT, single-query requests over ZeroMQ: the closed-loop rate
of one slot (`calibrated_rps`); one open-loop point at a FIXED offered rate shared by all layouts
(`sharded_load` x sharded_4's calibrated rate of that mode: below every layout's capacity), long
enough for `sharded_fixed_requests` requests, whose p50/p99 are the latency row; one point
offered `sharded_saturation_offer` x the layout's own calibrated rate (x its width) whose
answered rate is the saturation throughput. Then each worker
process's resident memory (VmRSS, and RssAnon: its private pages, without the shared libraries
mapped from files) next to the bytes of store rows it holds (sharded.shard_bytes: a replicated
worker holds the one shard of S = 1): memory per worker is what sharding buys.
"""

from __future__ import annotations

import dataclasses

from online_deploy import log, server_config
from online_measure import Bench

LAYOUTS = {  # name -> pool spec (order: sharded_4 first, it sets the fixed rate)
    "sharded_4": {"name": "shards", "kind": "sharded", "shards": 4, "threads": 1},
    "sharded_2": {"name": "shards", "kind": "sharded", "shards": 2, "threads": 1},
    "replicated": {"name": "workers", "kind": "workers", "width": 2, "threads": 1},
}
MODES = ("he", "exact")
SETTINGS = {"sharded_load": 0.5, "sharded_saturation_offer": 2.5, "sharded_fixed_requests": 200}


def _rss(pid: int) -> dict:
    """VmRSS and RssAnon of a live process in bytes (/proc/PID/status), {} when it is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        return {}
    return out


def _config(dep: dict, pool: dict):
    """server_config's deployment with `pool` as its only pool, serving HE and EXACT (a sharded
    pool refuses FULL, which server_config lists)."""
    return dataclasses.replace(server_config(dep, "sage", "he"), modes=list(MODES), pools=[dict(pool)])


def _memory(srv, rows_bytes: list[int]) -> dict:
    """Per worker of the served pool: pid, VmRSS, RssAnon, the store-row bytes it holds."""
    pool = srv.pools[0]
    workers = []
    for i, pid in enumerate(pool.worker_pids()):
        workers.append({"pid": pid, **_rss(pid), "rows_bytes": rows_bytes[i] if i < len(rows_bytes) else None})
    rss = [w["VmRSS"] for w in workers if "VmRSS" in w]
    anon = [w["RssAnon"] for w in workers if "RssAnon" in w]
    return {
        "workers": workers,
        "rss_max_bytes": max(rss) if rss else None,
        "rss_anon_max_bytes": max(anon) if anon else None,
        "rows_max_bytes": max(rows_bytes) if rows_bytes else None,
    }


def _whole_store_bytes(dep: dict) -> int:
    """Bytes of the store rows one replicated worker holds: the single shard of S = 1."""
    from sparkgnn.models import Model
    from sparkgnn.pe.store import PEStore
    from sparkgnn.serving.online.sharded import graph_ids, shard_bytes

    m = dep["models"]["sage"]
    model = Model.load(m["model"])
    store = PEStore.open(m["store"], model=model, graph=dep["graph"], verify="sizes")
    return shard_bytes(graph_ids(dep["graph"]), model, store, 1, store.with_states)[0]


def experiment_sharded(b: Bench, dep: dict, s: dict) -> dict:
    """Replicated vs sharded 2 and 4: latency at a fixed rate, saturation, memory (module doc)."""
    from sparkgnn.serving.online.server import Server

    load, offer = (
        s.get("sharded_load", SETTINGS["sharded_load"]),
        s.get("sharded_saturation_offer", SETTINGS["sharded_saturation_offer"]),
    )
    requests = s.get("sharded_fixed_requests", SETTINGS["sharded_fixed_requests"])
    out: dict = {
        "model": "sage",
        "sharded_load": load,
        "sharded_saturation_offer": offer,
        "sharded_fixed_requests": requests,
        "layouts": {},
    }
    whole = _whole_store_bytes(dep)
    fixed: dict = {}
    for layout, pool in LAYOUTS.items():
        log(f"[sharded] {layout}: {pool}")
        with Server(_config(dep, pool)) as srv:
            doc: dict = {"pool": pool}
            width = int(pool.get("width", 1))
            for mode in MODES:
                calibrated = b.calibrate(srv, "single", mode)
                fixed.setdefault(mode, load * calibrated)
                at, _ = b.point(srv, "single", mode, fixed[mode], duration=max(s["duration"], requests / fixed[mode]))
                sat, _ = b.point(srv, "single", mode, offer * calibrated * width)
                doc[mode] = {
                    "calibrated_rps": calibrated,
                    "fixed_rate_rps": fixed[mode],
                    "latency_p50_ms": at.get("latency_p50_ms"),
                    "latency_p99_ms": at.get("latency_p99_ms"),
                    "saturation_rps": sat["achieved_rps"],
                    "fixed_point": at,
                    "saturation_point": sat,
                }
                log(
                    f"  {layout} {mode}: one slot {calibrated:.1f} req/s; at {fixed[mode]:.1f} req/s p50 "
                    f"{at.get('latency_p50_ms', float('nan')):.1f} ms p99 {at.get('latency_p99_ms', float('nan')):.1f} "
                    f"ms (ok {at['ok']}/{at['requests']}); offered {offer * calibrated * width:.0f} -> answered "
                    f"{sat['achieved_rps']:.1f} req/s"
                )
            rows = list(srv.pools[0].shard_bytes) if pool["kind"] == "sharded" else [whole] * width
            doc["memory"] = _memory(srv, rows)
            m = doc["memory"]
            log(
                f"  {layout} memory per worker: RSS max {m['rss_max_bytes'] / 2**20:.0f} MiB, anon max "
                f"{m['rss_anon_max_bytes'] / 2**20:.0f} MiB, store rows max {m['rows_max_bytes'] / 2**20:.1f} MiB"
            )
        out["layouts"][layout] = doc
    rep = out["layouts"]["replicated"]
    out["row"] = {
        layout: {
            **{f"{mode}_p50_ms": doc[mode]["latency_p50_ms"] for mode in MODES},
            **{f"{mode}_p99_ms": doc[mode]["latency_p99_ms"] for mode in MODES},
            **{f"{mode}_saturation_rps": doc[mode]["saturation_rps"] for mode in MODES},
            "worker_rss_bytes": doc["memory"]["rss_max_bytes"],
            "worker_rss_anon_bytes": doc["memory"]["rss_anon_max_bytes"],
            "worker_rows_bytes": doc["memory"]["rows_max_bytes"],
            "worker_rss_anon_over_replicated": (
                doc["memory"]["rss_anon_max_bytes"] / rep["memory"]["rss_anon_max_bytes"]
                if doc["memory"]["rss_anon_max_bytes"] and rep["memory"]["rss_anon_max_bytes"]
                else None
            ),
        }
        for layout, doc in out["layouts"].items()
    }
    out["fixed_rate_rps"] = fixed
    return out
