"""The serving benchmark's figures (bench/results/serving_*.png): latency vs batch size, accuracy
recovery vs gamma per policy, and the latency breakdown with bytes fetched (OMEGA Fig. 11)."""

from __future__ import annotations

import os

import numpy as np
from bench_common import RESULTS


def _grid(plt, result: dict, graphs: list, kinds: list, width: float, draw, name: str) -> str:
    """One panel per (graph, model kind): draw(ax, graph, kind, model result); blank where a
    graph was not run with that kind. Returns the PNG path."""
    fig, axes = plt.subplots(len(graphs), len(kinds), figsize=(width * len(kinds), 4 * len(graphs)), squeeze=False)
    for i, g in enumerate(graphs):
        for j, k in enumerate(kinds):
            ax = axes[i][j]
            m = result["graphs"][g]["models"].get(k)
            if m is None:
                ax.axis("off")
                continue
            draw(ax, g, k, m)
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(RESULTS, name)
    fig.savefig(path, dpi=110)
    return path


def _style(label: str):
    colors = {"full": "k", "ns": "tab:gray", "he": "tab:red", "exact": "tab:purple", "auto": "tab:orange"}
    if label.startswith("srpe"):
        return {"color": "tab:blue", "alpha": 0.4 + 0.6 * min(1.0, float(label.split("@")[1]) * 4 + 0.2)}
    return {"color": colors.get(label, "tab:green")}


def plot(result: dict, stem: str = "serving") -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graphs = list(result["graphs"])
    kinds = sorted({k for g in graphs for k in result["graphs"][g]["models"]})
    paths = []

    # latency vs B
    def latency(ax, g, k, m):
        bs = sorted(m["modes"], key=int)
        for label in m["modes"][bs[0]]:
            ax.plot(
                [int(b) for b in bs],
                [m["modes"][b][label]["latency_p50_ms"] for b in bs],
                "o-",
                label=label,
                **_style(label),
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size B")
        ax.set_ylabel("p50 latency per request (ms)")
        ratio = m.get("headline", {}).get("auto_vs_best_ratio_max")
        ax.set_title(f"{g} / {k}" + (f"  (auto / best of full, exact <= {ratio:.2f})" if ratio else ""))

    paths.append(_grid(plt, result, graphs, kinds, 5.5, latency, f"{stem}_latency.png"))
    # recovery vs gamma: accuracy drop (vs labels) and disagreement with FULL (label-free, less noisy)
    pairs = [(g, k) for g in graphs for k in kinds if k in result["graphs"][g]["models"]]
    fig, axes = plt.subplots(len(pairs), 2, figsize=(11, 3.6 * len(pairs)), squeeze=False)
    colors = {"qer": "tab:blue", "is": "tab:orange", "random": "tab:gray", "ae": "tab:green"}
    for i, (g, k) in enumerate(pairs):
        rec = result["graphs"][g]["models"][k]["recovery"]
        for policy, pr in rec["policies"].items():
            gs = sorted(pr["curve"], key=float)
            xs = [float(x) for x in gs]
            axes[i][0].plot(
                xs,
                [pr["curve"][x]["accuracy_drop_pts"] for x in gs],
                "o-",
                color=colors[policy],
                label=f"{policy} (within 1 pt from gamma {pr['smallest_gamma_within_1pt']})",
            )
            axes[i][1].plot(
                xs,
                [100 * (1 - pr["curve"][x]["agreement_with_full"]) for x in gs],
                "o-",
                color=colors[policy],
                label=policy,
            )
        axes[i][0].axhline(1.0, color="k", ls="--", lw=0.8)
        axes[i][0].axhline(0.0, color="k", lw=0.5)
        axes[i][0].set_ylabel("accuracy drop vs FULL (points)")
        axes[i][0].set_title(
            f"{g} / {k}, B={rec['B']}, {rec['requests']} requests (FULL acc {rec['full']['accuracy']:.3f})", fontsize=9
        )
        axes[i][1].set_ylabel("% predictions differing from FULL")
        axes[i][1].set_title(f"{g} / {k}: disagreement with FULL", fontsize=9)
        for ax in axes[i]:
            ax.set_xscale("symlog", linthresh=0.01)
            ax.set_xlim(-0.001, 1.2)
            ax.set_xlabel("recomputation budget gamma")
            ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(os.path.join(RESULTS, f"{stem}_recovery.png"))
    fig.savefig(paths[-1], dpi=110)
    # latency breakdown + bytes at the largest B (Fig. 11)
    parts = (
        ("plan", "tab:olive"),
        ("fetch", "tab:red"),
        ("compute", "tab:blue"),
        ("merge", "tab:purple"),
        ("other", "tab:gray"),
    )

    def breakdown(ax, g, k, m):
        b = max(m["modes"], key=int)
        labels = list(m["modes"][b])
        bottom = np.zeros(len(labels))
        for part, color in parts:
            vals = np.array([max(0.0, m["modes"][b][lb][f"{part}_ms_mean"]) for lb in labels])
            ax.bar(labels, vals, bottom=bottom, color=color, label=part)
            bottom += vals
        for x, lb in enumerate(labels):
            ax.text(
                x,
                bottom[x],
                f"{m['modes'][b][lb]['bytes_fetched_mean'] / 1e6:.1f} MB",
                ha="center",
                va="bottom",
                fontsize=7,
            )
        ax.set_ylabel("mean latency (ms), split by phase")
        ax.set_title(f"{g} / {k}, B={b}: latency breakdown, MB fetched on top")
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)

    paths.append(_grid(plt, result, graphs, kinds, 6.5, breakdown, f"{stem}_bytes.png"))
    plt.close("all")
    return paths
