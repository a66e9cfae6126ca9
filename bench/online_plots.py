"""The online serving benchmark's figures (bench/results/online_latency.png: p99 latency vs
offered load per sweep; online_schedulers.png: the schedulers, hot cache hit rates and the PSGS
router vs a single pool; online_auth.png: with vs without authentication)."""

from __future__ import annotations

import os

import numpy as np
from bench_common import RESULTS
from online_measure import EXACT_SLO_MS, HE_SLO_MS


def plot(result: dict, name: str = "online") -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(8, 5))
    capacity = result.get("capacity", {})
    curves = [
        ("HE single, inprocess", capacity.get("he_single")),
        ("EXACT single, inprocess", result.get("big_request", {}).get("exact_single")),
        ("HE single, workers x1", result.get("workers", {}).get("1")),
        ("HE single, workers x2", result.get("workers", {}).get("2")),
        (f"{result['settings']['sched_mode'].upper()} mixed, FIFO", capacity.get("mixed_fifo")),
    ]
    for label, curve in curves:
        if not curve:
            continue
        pts = [p for p in curve["points"] if "latency_p99_ms" in p]
        ax.plot([p["offered_rps"] for p in pts], [p["latency_p99_ms"] for p in pts], "o-", label=f"{label} p99")
    ax.axhline(HE_SLO_MS, ls="--", c="gray", lw=0.8)
    ax.axhline(EXACT_SLO_MS, ls=":", c="gray", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("p99 latency (ms, from scheduled send)")
    ax.set_title("online serving: p99 latency vs offered load (20 / 50 ms lines)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(RESULTS, f"{name}_latency.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    paths.append(path)
    if "auth" in result:
        paths.append(_plot_auth(plt, result["auth"], name))
    if not capacity:  # a result of `--only auth` alone: no scheduler runs to draw
        return paths

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.5))
    runs = result["capacity"]["schedulers"]["runs"]
    names = ["fifo", "degree", "degree_divider"]
    width = 0.13
    for j, process in enumerate(runs):
        for k, stat in enumerate(("latency_mean_ms", "latency_p50_ms", "latency_p99_ms")):
            vals = [runs[process][n].get(stat, np.nan) for n in names]
            axes[0].bar(np.arange(3) + (j * 3 + k - 2.5) * width, vals, width, label=f"{process} {stat[8:-3]}")
    axes[0].set_xticks(np.arange(3), names)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("ms")
    axes[0].set_title(f"schedulers at {result['capacity']['schedulers']['rate_rps']:.0f} req/s")
    axes[0].legend(fontsize=7)
    cache = result.get("cache", {})
    if "off" in cache:
        pol = ["off", "degree", "fap"]
        axes[1].bar(pol, [cache[p]["hit_rate"] for p in pol])
        axes[1].set_ylim(0, 1)
        axes[1].set_title(f"hot cache hit rate at {cache['fraction']:.0%} of store bytes")
    router = result.get("router", {}).get("runs", {})
    if router:
        labels = list(router)
        x = np.arange(len(labels))
        axes[2].bar(x - 0.2, [router[r].get("latency_mean_ms", np.nan) for r in labels], 0.4, label="mean")
        axes[2].bar(x + 0.2, [router[r].get("latency_p99_ms", np.nan) for r in labels], 0.4, label="p99")
        axes[2].set_xticks(range(len(labels)), [lab.replace("_", "\n") for lab in labels], fontsize=7)
        axes[2].set_ylabel("ms")
        axes[2].set_title("PSGS router vs single pool")
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(RESULTS, f"{name}_schedulers.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    paths.append(path)
    return paths


def _plot_auth(plt, auth: dict, name: str) -> str:
    """{name}_auth.png: per front, p99 vs offered load of every plain (solid), token (dotted, http
    only) and secured (dashed) sweep; last panel, the service's CPU ms per request of each repeat
    (bars) with the load generator's stacked on top (hatched)."""
    fronts = [f for f, d in auth["variants"].items() if "skipped" not in d]
    fig, axes = plt.subplots(1, len(fronts) + 1, figsize=(5 * (len(fronts) + 1), 4.5))
    for ax, front in zip(axes, fronts, strict=False):
        doc = auth["variants"][front]
        for variant, style in (("plain", "o-"), ("token", "^:"), ("secured", "s--")):
            for rep, curve in enumerate(doc.get(variant, [])):
                pts = [p for p in curve["points"] if "latency_p99_ms" in p]
                ax.plot(
                    [p["offered_rps"] for p in pts],
                    [p["latency_p99_ms"] for p in pts],
                    style,
                    label=f"{variant} #{rep + 1}: held {curve['single_query_rps'] or 0:.0f} req/s",
                )
        ax.axhline(auth["slo_ms"], ls="--", c="gray", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered load (requests/s)")
        ax.set_ylabel("p99 latency (ms)")
        kinds = " vs ".join(v for v in ("plain", "token", "secured") if v in doc)
        ax.set_title(f"{front}: {kinds} (cost {doc['auth_cost'] or 0:.0%})", fontsize=9)
        ax.legend(fontsize=7)
    ax = axes[-1]
    seen: set = set()
    for k, front in enumerate(fronts):
        doc = auth["variants"][front]
        for j, variant in enumerate(("plain", "token", "secured")):
            if variant not in doc:
                continue
            vals = doc[f"cpu_ms_per_request_{variant}_repeats"]
            gen = doc.get(f"generator_cpu_ms_per_request_{variant}_repeats", [0.0] * len(vals))
            x = k * 4 + j + np.arange(len(vals)) * 0.2 - 0.1 * (len(vals) - 1)
            color = {"plain": "C0", "token": "C2", "secured": "C1"}[variant]
            ax.bar(x, vals, 0.18, color=color, label=variant if variant not in seen else None)
            ax.bar(x, gen, 0.18, bottom=vals, color=color, alpha=0.4, hatch="//")
            seen.add(variant)
    ax.set_xticks([k * 4 + 1 for k in range(len(fronts))], fronts)
    ax.set_ylabel("CPU ms / request (hatched: load generator)")
    ax.set_title(f"CPU per request at {auth['variants'][fronts[0]]['cpu_at_rps']:.0f} req/s, each repeat", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(RESULTS, f"{name}_auth.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
