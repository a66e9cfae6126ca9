"""Every conv the converter accepts, through the batch job's DL step on CUDA: `make bench-gpu-coverage`
-> bench/results/gpu_coverage.json + gpu_coverage.png.

bench_gpu.py measures the step for the four original convs; since then the conversion registries
(models/pyg_convs.py, the README's coverage table) grew to every native and generic conv of
torch_geometric.nn.conv, with edge features for the convs that read them. Whether their kernels
run on a CUDA device, and stay exact there, only a GPU can show. For each conv the table marks
"native" or "generic" (plus its edge_dim variant when the constructor takes one):

  1. the PyG module: a torch_geometric.nn.Sequential of Linear(D, D) then the conv (the Linear gives
     the convs without in_channels their width), built from models.coverage's probe arguments;
  2. Model.from_pyg of it, and the layer-0 step tables of one partition (bench_gpu.make_graph: own
     rows, mirror rows as blocks, distinct edges, [edge attributes]) with h = model.pre(x);
  3. run_step on the CPU and on CUDA (cold, warm median), and PyG's forward of the whole subgraph
     on the same device (the reference: own rows of its output); errors cuda-vs-PyG, cpu-vs-PyG,
     cuda-vs-cpu by the tests' criterion (max|got - ref| / max|ref| <= 1e-5), and elementwise
     (|got - ref| <= 1e-5 + 1e-5 |ref|) beside PyG's own CPU-vs-CUDA distance, the yardstick for
     convs that sum many terms in float32.

A conv the converter refuses in one variant (its reason recorded) is a result, not a failure. Runs
where the package is not installed and pyspark is absent, like bench_gpu.py. Without CUDA the CPU
step and PyG-CPU run and `gpu` is null (`--quick`: a tiny graph, well under a minute on a laptop).
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpu as bg  # noqa: E402

LOG = logging.getLogger("gpu_coverage")
EDGE_DIM = 16
# (label, own rows, mirror rows, edges): one partition's tables, an eighth of bench_gpu's 2M size
SIZE = ("500K", 62_500, 62_500, 500_000)
QUICK_SIZE = ("20K", 2_500, 2_500, 20_000)
# the convs whose nn maps the concatenation [x_i, x_j - x_i] (2D wide) rather than x (D wide)
PAIR_NN = ("EdgeConv",)


def conv_arguments(cls, width: int, degree_histogram, edge: bool) -> dict:
    """Constructor arguments: the probe's (models.coverage.PROBE_ARGUMENTS) at `width`, an MLP for
    `nn`, PNA's aggregators / scalers / degree histogram, and edge_dim when `edge`."""
    import torch

    from sparkgnn.models import coverage

    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    required = [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    args: dict = {}
    for name in required:
        if name in ("in_channels", "out_channels", "channels"):
            args[name] = width
        elif name == "nn":
            wide = 2 * width if cls.__name__ in PAIR_NN else width
            args[name] = torch.nn.Sequential(
                torch.nn.Linear(wide, width), torch.nn.ReLU(), torch.nn.Linear(width, width)
            )
        elif name == "aggregators":
            args[name] = ["mean", "max", "std"]
        elif name == "scalers":
            args[name] = ["identity", "amplification", "attenuation"]
        elif name == "deg":
            args[name] = degree_histogram
        else:
            args[name] = coverage.PROBE_ARGUMENTS[name]
    if edge:
        args["edge_dim"] = EDGE_DIM
    return args


def variants() -> list[tuple[str, str, bool]]:
    """(PyG class name, "native" | "generic", reads edge attributes) for every convertible conv."""
    import torch_geometric.nn.conv as convs

    from sparkgnn.models import coverage

    out = []
    for name, status, _ in coverage.coverage_rows():
        if status not in ("native", "generic"):
            continue
        out.append((name, status, False))
        if "edge_dim" in inspect.signature(getattr(convs, name).__init__).parameters:
            out.append((name, status, True))
    return out


def step_tables(model, graph: dict, h0: np.ndarray, attr: np.ndarray | None) -> tuple[dict, dict]:
    """bench_gpu.step_tables with h = model.pre(x) and the edges' attr column when given."""
    from sparkgnn.arrowvec import to_fixed_list

    header, tables = bg.step_tables(model, {**graph, "x": h0})
    if attr is not None:
        tables["edges"] = tables["edges"].append_column("attr", to_fixed_list(attr))
    return header, tables


def one_conv(name: str, edge: bool, graph: dict, device: str, degree_histogram) -> dict:
    """Build, convert, step on CPU and device, PyG on the device; the record of one variant."""
    import torch
    import torch_geometric.nn as gnn
    import torch_geometric.nn.conv as convs

    from sparkgnn.errors import UnsupportedModelError
    from sparkgnn.models import Model

    torch.manual_seed(0)
    conv = getattr(convs, name)(**conv_arguments(getattr(convs, name), bg.DIM, degree_histogram, edge))
    signature = "x, edge_index, edge_attr -> x" if edge else "x, edge_index -> x"
    module = gnn.Sequential(
        "x, edge_index, edge_attr", [(torch.nn.Linear(bg.DIM, bg.DIM), "x -> x"), (conv, signature)]
    ).eval()
    try:
        model_cpu = Model.from_pyg(module, output="embedding")
    except UnsupportedModelError as exc:
        return {"refused": str(exc)}
    kinds = [c.kind for c in model_cpu.conv_list()]
    if len(kinds) > 1:  # a K-round conv (APPNP, TAGConv): round l reads round l-1 of the mirror rows too
        return {"skipped": f"{len(kinds)} rounds ({', '.join(kinds)}); this harness runs one partition's one step"}
    record: dict = {"layer": kinds[0]}
    rng = np.random.default_rng(1)
    attr = rng.standard_normal((graph["src"].size, EDGE_DIM), dtype=np.float32) if edge else None
    with torch.inference_mode():
        h0 = model_cpu.pre(torch.from_numpy(graph["x"])).numpy()
    header, tables = step_tables(model_cpu, graph, h0, attr)
    record["pre_transform"] = header["pre_transform"]
    model_dev = Model.from_pyg(module, output="embedding").to(device) if device != "cpu" else model_cpu
    step, outputs = bg.step_section(model_cpu, model_dev, header, tables, device)
    record["step"] = step
    record["errors"] = {}
    if "cuda" in outputs:
        record["errors"]["cuda_vs_cpu"] = bg.errors(outputs["cuda"], outputs["cpu"])
    x = torch.from_numpy(graph["x"]).to(device)
    edge_index = torch.stack([torch.from_numpy(graph["src"]), torch.from_numpy(graph["dst"])]).to(device)
    edge_attr = torch.from_numpy(attr).to(device) if attr is not None else None
    pyg_cpu_out = None
    if device != "cpu":  # PyG's own CPU forward: how far PyG's two devices are apart on this graph
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            args = [
                torch.from_numpy(graph["x"]),
                torch.stack([torch.from_numpy(graph["src"]), torch.from_numpy(graph["dst"])]),
            ]
            pyg_cpu_out = module(*args, torch.from_numpy(attr) if attr is not None else None)[: graph["n_own"]].numpy()
    pyg_module = module.to(device)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        cold, out = bg.timed(lambda: pyg_module(x, edge_index, edge_attr), device)
        warm, _ = bg.median_time(lambda: pyg_module(x, edge_index, edge_attr), device, bg.WARM_REPEATS)
    reference = out[: graph["n_own"]].float().cpu().numpy()
    record["pyg"] = {"device": device, "cold_s": cold, "warm_s": warm}
    record["errors"]["cpu_vs_pyg"] = bg.errors(outputs["cpu"], reference)
    if pyg_cpu_out is not None:
        record["errors"]["pyg_cpu_vs_pyg"] = bg.errors(pyg_cpu_out, reference)
    if "cuda" in outputs:
        record["errors"]["cuda_vs_pyg"] = bg.errors(outputs["cuda"], reference)
        if "cuda_warm_s" in step:
            record["ratio_step_vs_pyg"] = step["cuda_warm_s"] / warm
    # the project's criterion (tests: max|got - ref| / max|ref| <= 1e-5); the elementwise bar is
    # recorded beside it, with PyG's own CPU-vs-device distance as the yardstick for sums of many terms
    record["flag_over_1e-5"] = sorted(k for k, v in record["errors"].items() if v["max_rel"] > bg.EXACT_RTOL)
    record["elementwise_over_1e-5"] = sorted(k for k, v in record["errors"].items() if not v["within_1e-5"])
    return record


def coverage_section(size, device: str, budget: bg.Budget) -> dict:
    import torch
    from torch_geometric.utils import degree

    label, n_own, n_mirror, edges = size
    started = time.perf_counter()
    graph = bg.make_graph(n_own, n_mirror, edges)
    n_all = n_own + n_mirror
    in_degree = degree(torch.from_numpy(graph["dst"]), n_all, dtype=torch.long)
    out: dict = {
        "size": label,
        "own_rows": n_own,
        "mirror_rows": n_mirror,
        "edges": int(graph["src"].size),
        "dim": bg.DIM,
        "edge_dim": EDGE_DIM,
        "graph_build_s": time.perf_counter() - started,
        "convs": {},
    }
    for name, status, edge in variants():
        key = f"{name}+edge_attr" if edge else name
        if not budget.allows():
            out["convs"][key] = {"skipped": "budget spent"}
            continue
        LOG.info("%s (%s) on %s, %.0f s left", key, status, device, budget.left())
        entry: dict = {"status": status}
        bg.guarded(
            entry, "result", lambda name=name, edge=edge: one_conv(name, edge, graph, device, torch.bincount(in_degree))
        )
        entry.update(entry.pop("result") or {})
        if device.startswith("cuda"):
            torch.cuda.empty_cache()  # the variant's module and inputs are gone: its cached blocks too
        out["convs"][key] = entry
    ran = {k: v for k, v in out["convs"].items() if "errors" in v}
    out["summary"] = {
        "variants": len(out["convs"]),
        "ran": len(ran),
        "refused": sorted(k for k, v in out["convs"].items() if "refused" in v),
        "skipped": sorted(k for k, v in out["convs"].items() if "skipped" in v),
        "errors": sorted(k for k, v in out["convs"].items() if "error" in v or "cuda_error" in v.get("step", {})),
        "over_1e-5": sorted(k for k, v in ran.items() if v["flag_over_1e-5"]),
        "elementwise_over_1e-5": {k: v["elementwise_over_1e-5"] for k, v in ran.items() if v["elementwise_over_1e-5"]},
        **{
            f"max_rel_{pair}": max(
                (v["errors"][pair]["max_rel"] for v in ran.values() if pair in v["errors"]), default=None
            )
            for pair in ("cuda_vs_pyg", "cpu_vs_pyg", "cuda_vs_cpu", "pyg_cpu_vs_pyg")
        },
    }
    return out


def plot(result: dict, path: str) -> str | None:
    """Warm step time per conv variant: CPU step, CUDA step, PyG on the device (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    convs = {k: v for k, v in result.get("coverage", {}).get("convs", {}).items() if "step" in v}
    if not convs:
        return None
    names = list(convs)
    series = [
        ("cpu step", [convs[k]["step"].get("cpu_s", np.nan) for k in names]),
        ("cuda step (warm)", [convs[k]["step"].get("cuda_warm_s", np.nan) for k in names]),
        (f"PyG on {result['device']} (warm)", [convs[k].get("pyg", {}).get("warm_s", np.nan) for k in names]),
    ]
    series = [(label, values) for label, values in series if not all(np.isnan(values))]
    fig, ax = plt.subplots(figsize=(max(10, 0.45 * len(names)), 5))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series):
        ax.bar(np.arange(len(names)) + i * width, values, width, label=label)
    ax.set_yscale("log")
    ax.set_ylabel("seconds (warm median)")
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, rotation=70, ha="right", fontsize=8)
    cov = result["coverage"]
    ax.set_title(
        f"the DL step per conv, one partition: {cov['own_rows']:,} own rows, {cov['edges']:,} edges, D={cov['dim']}"
    )
    ax.legend()
    return bg.save_figure(fig, path)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(bg.ROOT, "bench", "results"), help="folder of gpu_coverage.json/.png")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: cuda when available")
    p.add_argument("--quick", action="store_true", help="a tiny graph (smoke run): writes gpu_coverage_quick.*")
    p.add_argument("--budget-s", type=float, default=240.0, help="skip convs that would start after this")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch CPU threads")
    p.add_argument("--commit", default=None, help="the checkout's commit, when there is no .git to read")
    args = p.parse_args(argv)
    if args.budget_s <= 0 or args.threads < 1:
        p.error("--budget-s and --threads must be positive")
    budget = bg.Budget(args.budget_s)
    loadavg = os.getloadavg()
    tree = bg.ensure_sparkgnn()
    import torch
    import torch_geometric

    if args.device == "cuda" and not torch.cuda.is_available():
        LOG.error("--device cuda: torch %s sees no CUDA device", torch.__version__)
        return 2
    device = "cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu"
    torch.set_num_threads(args.threads)
    name = "gpu_coverage_quick" if args.quick else "gpu_coverage"
    os.makedirs(args.out, exist_ok=True)
    result: dict = {
        "loadavg": list(loadavg),
        "quick": args.quick,
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
        "commit": bg.commit(args.commit),
        "package_tree": tree,
        "error_definition": "max_rel = max|got - ref| / max|ref| (float64), the tests' criterion, flagged over 1e-5; "
        "within_1e-5: every element "
        "|got - ref| <= 1e-5 + 1e-5 |ref| (the tests' bar); ref = PyG's forward on the same device",
    }
    bg.guarded(result, "gpu", lambda: bg.gpu_info(device))
    bg.guarded(result, "cuda_init_s", lambda: bg.cuda_init_s(device))
    bg.guarded(result, "coverage", lambda: coverage_section(QUICK_SIZE if args.quick else SIZE, device, budget))
    bg.guarded(result, "plot", lambda: plot(result, os.path.join(args.out, f"{name}.png")))
    result["elapsed_s"] = budget.seconds - budget.left()
    json_path = os.path.join(args.out, f"{name}.json")
    with open(json_path, "w") as fh:
        json.dump(result, fh, indent=2, sort_keys=True, default=str)
    LOG.info("wrote %s: %s", json_path, json.dumps(result.get("coverage", {}).get("summary")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
