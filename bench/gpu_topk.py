"""All-node exact top-k on a GPU: `make bench-gpu-topk` -> bench/results/gpu_topk.json + gpu_topk.png.

What only a GPU shows for link prediction: `topk.py --device cuda` scores and selects each task's
tiles on the GPU (sparkgnn.linkpred.tiles). This runs what one task of the job's broadcast path
runs (tiles.table_topk over slices of topk.SOURCE_ROWS sources against every candidate) for EVERY
node as a source, at the candidate counts of bench-linkpred's graphs (200K and 800K nodes, 128-d
outputs, k = 10), per decoder:
  - cuda: every source on the GPU; cold (the first slice: the candidates' copy to the device, the
    kernels' first launch) and the whole all-node run.
  - cpu: the same function on the CPU for a sample of sources, once with all the machine's
    threads in one process and once with one thread (the job runs one task per core, one thread
    each), projected to every source: per-source time x sources, the one-thread figure divided
    by the cores (perfect scaling: a lower bound for the job's CPU time).
  - naive: the brute force a PyTorch user writes on the same GPU, (h_s @ h_c.T).topk(k) per chunk of
    sources (no ties by id, no exclusions): the real alternative in memory.
  - agreement on the sampled sources: the share of (source, rank) whose candidate is the same on the
    GPU as on the CPU, and the largest score difference. A GPU's float32 products sum in another
    order, so near-equal scores at the k-th place can swap (tiles.py's module doc).
The MLP decoder (hadamard, 64 hidden) scores a sample of sources on both devices (its all-node
pair count is out of reach of a session's device time) and is projected the same way.

Runs where the sparkgnn package is not installed and pyspark is absent, like bench_gpu.py (whose
plumbing it reuses). Without CUDA only the CPU parts run; `--quick` shrinks the sizes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpu as bg  # noqa: E402

LOG = logging.getLogger("gpu_topk")
DIM, K = 128, 10
SIZES = [("200K", 200_000), ("800K", 800_000)]
QUICK_SIZES = [("5K", 5_000), ("20K", 20_000)]
CPU_SAMPLE = {"200K": 2048, "800K": 512, "5K": 256, "20K": 256}  # sources the CPU scores
MLP_SAMPLE = {"200K": 256, "800K": 64, "5K": 64, "20K": 64}  # sources the MLP decoder scores on each device
NAIVE_CHUNK = 1024  # sources per product in the naive brute force
DECODERS = ("dot", "cosine", "mlp")


def decoder_of(name: str, seed: int = 0):
    """dot and cosine as built; mlp converted from the PyTorch module a PyG example writes:
    Linear(h_s * h_d) -> ReLU -> Linear -> score."""
    import torch

    from sparkgnn.decoders import build_decoder
    from sparkgnn.models.pyg_decoders import decoder_from_pyg

    if name != "mlp":
        return build_decoder({"kind": name})

    class HadamardMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin1, self.lin2 = torch.nn.Linear(DIM, 64), torch.nn.Linear(64, 1)

        def forward(self, h_src, h_dst):
            return self.lin2(self.lin1(h_src * h_dst).relu()).squeeze(-1)

    torch.manual_seed(seed)
    return decoder_from_pyg(HadamardMLP().eval())


def all_sources(decoder, ids: np.ndarray, h: np.ndarray, sources: np.ndarray, device: str) -> tuple:
    """table_topk over `sources` (row indices) in the job's slices; (seconds, first slice's seconds,
    (src, dst, raw, rank))."""
    from sparkgnn.linkpred.tiles import table_topk
    from sparkgnn.linkpred.topk import SOURCE_ROWS

    parts, first = [], None
    started = time.perf_counter()
    for lo in range(0, len(sources), SOURCE_ROWS):
        rows = sources[lo : lo + SOURCE_ROWS]
        t0 = time.perf_counter()
        parts.append(table_topk(decoder, ids[rows], h[rows], ids, h, K, device=device))
        if first is None:
            first = time.perf_counter() - t0
    seconds = time.perf_counter() - started
    return seconds, first, tuple(np.concatenate(c) for c in zip(*parts, strict=True))


def naive_gpu(h: np.ndarray, device: str) -> tuple[float, np.ndarray]:
    """(seconds, [N, K] candidate rows) of (h_s @ h_c.T).topk(K) per chunk, on the device."""
    import torch

    bg.synchronize(device)
    started = time.perf_counter()
    hc = torch.from_numpy(h).to(device)
    out = []
    with torch.no_grad():
        for lo in range(0, len(h), NAIVE_CHUNK):
            out.append(torch.topk(hc[lo : lo + NAIVE_CHUNK] @ hc.T, K, dim=1).indices.cpu())
    bg.synchronize(device)
    return time.perf_counter() - started, torch.cat(out).numpy()


def agreement(a: tuple, b: tuple) -> dict:
    """Share of (src, rank) with the same dst in both answers, and the largest |score difference|
    where they agree."""
    left = {(int(s), int(r)): (int(d), float(v)) for s, d, v, r in zip(a[0], a[1], a[2], a[3], strict=True)}
    same, diff = 0, 0.0
    for s, d, v, r in zip(b[0], b[1], b[2], b[3], strict=True):
        hit = left.get((int(s), int(r)))
        if hit is not None and hit[0] == int(d):
            same += 1
            diff = max(diff, abs(hit[1] - float(v)))
    return {"same_share": same / max(1, len(left)), "pairs": len(left), "max_abs_score_diff": diff}


def cpu_run(decoder, ids, h, sample, threads: int) -> tuple[float, tuple]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        seconds, _first, answer = all_sources(decoder, ids, h, sample, "cpu")
    finally:
        torch.set_num_threads(before)
    return seconds, answer


def size_section(label: str, n: int, device: str, budget: bg.Budget, cores: int, decoders=DECODERS) -> dict:
    rng = np.random.default_rng(0)
    h = rng.standard_normal((n, DIM), dtype=np.float32)
    ids = np.arange(n, dtype=np.int64)
    sample = np.sort(rng.choice(n, CPU_SAMPLE[label], replace=False))
    out: dict = {"candidates": n, "sources": n, "dim": DIM, "k": K, "cpu_sample": len(sample), "decoders": {}}
    for name in decoders:
        if not budget.allows(20.0):
            out["decoders"][name] = {"skipped": f"budget: {budget.left():.0f} s left"}
            continue
        decoder = decoder_of(name)
        row: dict = {}
        mlp = name == "mlp"
        cpu_sources = sample[: MLP_SAMPLE[label]] if mlp else sample
        LOG.info("%s %s: cpu on %d sources", label, name, len(cpu_sources))
        all_s, cpu_answer = cpu_run(decoder, ids, h, cpu_sources, cores)
        one_s, _ = cpu_run(decoder, ids, h, cpu_sources[: max(1, len(cpu_sources) // 4)], 1)
        per_all = all_s / len(cpu_sources)
        per_one = one_s / max(1, len(cpu_sources) // 4)
        row["cpu"] = {
            "sampled_sources": len(cpu_sources),
            "all_threads_s": all_s,
            "one_thread_s": one_s,
            "projected_all_nodes_all_threads_s": per_all * n,
            "projected_all_nodes_one_task_per_core_s": per_one * n / cores,
        }
        cpu_best = min(per_all * n, per_one * n / cores)
        row["cpu"]["projected_all_nodes_best_s"] = cpu_best
        if device.startswith("cuda"):
            gpu_sources = cpu_sources if mlp else np.arange(n)
            LOG.info("%s %s: cuda on %d sources (%.0f s left)", label, name, len(gpu_sources), budget.left())
            seconds, first, answer = all_sources(decoder_of(name), ids, h, gpu_sources, device)
            per_gpu = seconds / len(gpu_sources)
            row["cuda"] = {
                "sources": len(gpu_sources),
                "seconds": seconds,
                "first_slice_s": first,
                "projected_all_nodes_s": per_gpu * n,
                "sources_per_s": len(gpu_sources) / seconds,
            }
            keep = np.isin(answer[0], ids[cpu_sources])
            row["cuda_vs_cpu"] = agreement(cpu_answer, tuple(c[keep] for c in answer))
            row["speedup_vs_cpu_best"] = cpu_best / (per_gpu * n)
        out["decoders"][name] = row
    if device.startswith("cuda") and budget.allows(10.0):
        seconds, top = naive_gpu(h, device)
        cuda_dot = out["decoders"].get("dot", {}).get("cuda", {}).get("seconds")
        naive = {"seconds": seconds, "what": "(h_s @ h_c.T).topk(k) per 1024 sources, no ties by id"}
        dot_cpu = out["decoders"].get("dot", {})
        if cuda_dot:
            naive["sparkgnn_cuda_over_naive"] = cuda_dot / seconds
        if "cuda" in dot_cpu:
            # the naive answer's candidate at each (sampled source, rank) against the CPU's exact one
            ref = {}
            _s, cpu_answer = cpu_run(decoder_of("dot"), ids, h, sample[:64], cores)
            for s, d, r in zip(cpu_answer[0], cpu_answer[1], cpu_answer[3], strict=True):
                ref[(int(s), int(r))] = int(d)
            same = sum(int(top[s, r - 1]) == d for (s, r), d in ref.items())
            naive["same_share_vs_cpu_exact_64_sources"] = same / max(1, len(ref))
        out["naive_torch_gpu"] = naive
    return out


def plot(result: dict, path: str) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = {k: v for k, v in result.get("sizes", {}).items() if isinstance(v, dict) and "decoders" in v}
    if not sizes:
        return None
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.5), squeeze=False)
    for ax, (label, size) in zip(axes[0], sizes.items(), strict=True):
        names = [d for d in DECODERS if "cpu" in size["decoders"].get(d, {})]
        cpu = [size["decoders"][d]["cpu"]["projected_all_nodes_best_s"] for d in names]
        gpu = [size["decoders"][d].get("cuda", {}).get("projected_all_nodes_s", np.nan) for d in names]
        x = np.arange(len(names))
        ax.bar(x - 0.2, cpu, 0.4, label=f"cpu, {result['cpu_count']} cores (projected)")
        ax.bar(x + 0.2, gpu, 0.4, label="cuda (dot, cosine: measured; mlp: projected)")
        naive = size.get("naive_torch_gpu", {}).get("seconds")
        if naive:
            ax.axhline(naive, color="k", ls="--", lw=1, label="naive torch topk on the GPU (dot)")
        ax.set_xticks(x, names)
        ax.set_yscale("log")
        ax.set_ylabel("seconds, all-node top-10")
        ax.set_title(f"{label} candidates x {label} sources, {DIM}-d")
        ax.legend(fontsize=8)
    return bg.save_figure(fig, path)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(bg.ROOT, "bench", "results"), help="folder of the JSON + PNG")
    p.add_argument("--quick", action="store_true", help="tiny sizes: gpu_topk_quick.json/.png")
    p.add_argument("--budget-s", type=float, default=240.0, help="skip work that would start after this")
    p.add_argument("--commit", default=None, help="the checkout's commit, when there is no .git to read")
    p.add_argument("--decoders", default=",".join(DECODERS), help=f"comma list of {', '.join(DECODERS)}")
    args = p.parse_args(argv)
    decoders = args.decoders.split(",")
    if set(decoders) - set(DECODERS):
        p.error(f"--decoders: unknown {sorted(set(decoders) - set(DECODERS))}; known: {', '.join(DECODERS)}")
    budget = bg.Budget(args.budget_s)
    loadavg = os.getloadavg()
    tree = bg.ensure_sparkgnn()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    name = "gpu_topk_quick" if args.quick else "gpu_topk"
    os.makedirs(args.out, exist_ok=True)
    json_path, png_path = os.path.join(args.out, f"{name}.json"), os.path.join(args.out, f"{name}.png")
    result: dict = {
        "what": __doc__.split("\n\n")[1].replace("\n", " "),
        "loadavg": list(loadavg),
        "quick": args.quick,
        "device": device,
        "cpu_count": cores,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "commit": bg.commit(args.commit),
        "package_tree": tree,
        "sizes": {},
    }

    def save() -> None:
        result["elapsed_s"] = args.budget_s - budget.left()
        with open(json_path, "w") as fh:
            json.dump(result, fh, indent=2, sort_keys=True, default=str)

    bg.guarded(result, "gpu", lambda: bg.gpu_info(device))
    bg.guarded(result, "cuda_init_s", lambda: bg.cuda_init_s(device))
    for label, n in QUICK_SIZES if args.quick else SIZES:
        section = lambda label=label, n=n: size_section(label, n, device, budget, cores, decoders)  # noqa: E731
        bg.guarded(result["sizes"], label, section)
        save()
    bg.guarded(result, "plot", lambda: plot(result, png_path))
    save()
    LOG.info("wrote %s (%.0f s)", json_path, args.budget_s - budget.left())
    return 0


if __name__ == "__main__":
    sys.exit(main())
