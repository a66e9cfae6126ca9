"""Generic fallback vs the native layer of the same conv (make bench-generic; a section of make bench-batch).

The generic fallback (layers/generic.py) runs a conv sparkgnn has no native layer for as the user's
own PyG module over whole in-edge neighbourhoods. To price it against a native layer, one conv
class that has both is converted twice with the same weights: as usual (GraphConv -> sparkgnn's
`graphconv` layer, GATv2Conv -> `gatv2`) and with its native converter hidden, so the converter
falls back to the generic layer (PyG's own conv class, checked: every conv of that model is a
GenericConv, also after saving and loading it back).

For each graph size (synthetic Zipf, nodes = edges / 10, 128-d, seeded; cached under data/bench),
one run measures, each cold in its own process:
  - native and generic: `python spark_jobs/batch_inference.py --strategy replicate --partitions P
    --report ...` on a fresh work dir (JVM start, prepare, every step, the Parquet output), the
    report's phase table (engine/phases.py) and per-step task seconds saying where the time went;
  - PyG: this file's `--pyg-job` (read the same graph, forward of the same weights), once with
    `edge_index` and once with a sparse CSR `adj_t` built before the layers; the faster is quoted
    (adj_t only when its output agrees with edge_index's, PYG_AGREEMENT).
Per layer: the job's layer steps (report `seconds_by_layer`, the first step that loads x apart)
over the model's layers; for PyG the conv and its activation. Ratios generic / native and
native / PyG per layer, and the largest relative error of each sparkgnn output vs PyG's
(max |a - b| / max |b|, edge_index output as the reference).

Writes the "generic_vs_native" key of bench/results/batch.json (other keys kept) and
bench/results/batch_generic.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import DATA, RESULTS, ROOT, machine, synthetic_dir  # noqa: E402

log = logging.getLogger("bench.generic")

DEFAULT_SIZES = (2_000_000, 8_000_000)
DIM = 128
HIDDEN = 128
LAYERS = 2
#: Conv classes that have a native layer, by the name the options use.
CONVS = {"graphconv": "GraphConv", "gatv2": "GATv2Conv"}
ADJACENCIES = ("edge_index", "adj_t")
#: Targets of issue 34: generic at most 2x native per layer; native at most PyG's per layer at 8M.
GENERIC_OVER_NATIVE_TARGET = 2.0
NATIVE_OVER_PYG_TARGET = 1.0
RESULT_KEY = "generic_vs_native"
#: PyG over adj_t is quoted only when its output agrees with edge_index's to this relative error
#: (GATv2Conv over a coalesced adj_t sees parallel edges once: another model on a multigraph).
PYG_AGREEMENT = 1e-4


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The section's options (shared by bench_batch.py --section generic and this file's main)."""
    parser.add_argument(
        "--generic-sizes",
        default=",".join(str(s) for s in DEFAULT_SIZES),
        help="edge counts of the generic-vs-native section, comma-separated (nodes = edges / 10)",
    )
    parser.add_argument("--generic-conv", choices=sorted(CONVS), default="graphconv", help="conv class compared")
    parser.add_argument("--generic-partitions", type=int, default=2, help="P of every sparkgnn job (replicate)")
    parser.add_argument("--generic-timeout-s", type=float, default=1800.0, help="limit per cold job")
    parser.add_argument(
        "--generic-results",
        default=RESULTS,
        help="folder of batch.json and batch_generic.png (another folder for a smoke run)",
    )
    return parser


def check_arguments(args: argparse.Namespace) -> None:
    """ValueError (one line) for a section option that cannot run."""
    parse_sizes(args.generic_sizes)
    if args.generic_partitions < 1:
        raise ValueError(f"--generic-partitions must be at least 1, got {args.generic_partitions}")


def parse_sizes(text: str) -> list[int]:
    """Edge counts from "2000000,8000000"; ValueError (one line) for anything else."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--generic-sizes needs comma-separated edge counts, got {text!r}") from None
    if not sizes or min(sizes) < 100:
        raise ValueError(f"--generic-sizes needs edge counts of at least 100, got {text!r}")
    return sizes


def size_label(edges: int) -> str:
    return f"{edges / 1e6:g}M"


# ------------------------------------------------------------------ the models


def conv_class(conv: str) -> type:
    """The PyG conv class named by `conv` (a key of CONVS)."""
    import torch_geometric.nn as gnn

    return getattr(gnn, CONVS[conv])


def pyg_model(conv: str, dim: int = DIM, hidden: int = HIDDEN, layers: int = LAYERS) -> torch.nn.ModuleList:
    """conv, ReLU, conv, ... as a ModuleList (Model.from_pyg converts it as a stack; the PyG job
    runs it module by module to time each layer)."""
    cls = conv_class(conv)
    modules: list[torch.nn.Module] = []
    width = dim
    for index in range(layers):
        if index:
            modules.append(torch.nn.ReLU())
        modules.append(cls(width, hidden))
        width = hidden
    return torch.nn.ModuleList(modules).eval()


@contextlib.contextmanager
def native_converter_hidden(cls: type) -> Iterator[None]:
    """Within the block, Model.from_pyg finds no native converter for `cls`, so it converts that
    conv by the generic fallback (pyg_convs.generic_layer); restored on exit. Bench-only: the
    comparison needs both paths for one conv class, which no user-facing option offers."""
    from sparkgnn.models.pyg_common import class_name
    from sparkgnn.models.pyg_convs import CONV_CONVERTERS, ensure_registered

    ensure_registered()
    name = class_name(cls)
    converter = CONV_CONVERTERS.pop(name)
    try:
        yield
    finally:
        CONV_CONVERTERS[name] = converter


def conv_kinds(model) -> list[str]:
    return [conv.kind for conv in model.conv_list()]


def save_models(conv: str, folder: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The seeded PyG model saved for the PyG job (`pyg`) and its two sparkgnn conversions saved
    as sparkgnn models (`native`, `generic`): their paths, and the layer kinds of each sparkgnn model
    as loaded back; RuntimeError when a conversion took the other path."""
    from sparkgnn.layers.generic import GenericConv
    from sparkgnn.models import Model

    torch.manual_seed(0)
    module = pyg_model(conv)
    paths = {name: os.path.join(folder, name) for name in ("native", "generic")}
    paths["pyg"] = os.path.join(folder, "pyg.pt")
    torch.save(
        {"conv": conv, "dim": DIM, "hidden": HIDDEN, "layers": LAYERS, "weights": module.state_dict()}, paths["pyg"]
    )
    native = Model.from_pyg(module, output="embedding")
    with native_converter_hidden(conv_class(conv)):
        generic = Model.from_pyg(module, output="embedding")
    native.save(paths["native"])
    generic.save(paths["generic"])
    kinds = {}
    for name in ("native", "generic"):
        loaded = Model.load(paths[name])
        kinds[name] = conv_kinds(loaded)
        is_generic = [isinstance(c, GenericConv) for c in loaded.conv_list()]
        if is_generic != [name == "generic"] * LAYERS:
            raise RuntimeError(f"the {name} {CONVS[conv]} model converted to layers {kinds[name]}")
    return paths, kinds


# ------------------------------------------------------------------ cold jobs


def pyg_job(graph: str, model: str, adjacency: str, out: str, timeout_s: float) -> dict:
    """This file's --pyg-job in its own process: its JSON line (layer_s, ...), wall_s, peak RSS."""
    from bench_scale import run_cold

    cmd = [sys.executable, os.path.abspath(__file__), "--pyg-job", "--graph", graph, "--model", model]
    run = run_cold([*cmd, "--adjacency", adjacency, "--out", out], timeout_s)
    lines = [line for line in run["output"].splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"ok": False, "error": run["output"][-500:]}
    if run["rc"] != 0 and result.get("ok"):
        result = {"ok": False, "error": f"exit code {run['rc']}"}
    return {**result, "wall_s": round(run["wall_s"], 2), "peak_rss_gib": round(run["peak_rss_gib"], 2)}


def sparkgnn_job(graph: str, model: str, scratch: str, partitions: int, timeout_s: float) -> dict:
    """One cold replicate job at P partitions on a fresh work dir (prepare paid): its seconds per
    layer step, the phase table and the summed task seconds per phase of its steps."""
    from bench_scale import run_cold

    report_path = os.path.join(scratch, "report.json")
    cmd = [
        sys.executable,
        os.path.join(ROOT, "spark_jobs", "batch_inference.py"),
        *("--graph", graph, "--model", model, "--out", os.path.join(scratch, "out")),
        *("--work-dir", os.path.join(scratch, "work"), "--report", report_path),
        *("--strategy", "replicate", "--partitions", str(partitions)),
    ]
    run = run_cold(cmd, timeout_s)
    if run["rc"] != 0 or not os.path.exists(report_path):
        return {"ok": False, "wall_s": round(run["wall_s"], 2), "tail": run["output"][-2000:]}
    with open(report_path) as fh:
        report = json.load(fh)
    by_layer = {int(k): v for k, v in report["seconds_by_layer"].items()}
    task_seconds: dict[str, float] = {}
    for step in report["steps"]:
        for name, seconds in (step.get("task_seconds") or {}).items():
            task_seconds[name] = round(task_seconds.get(name, 0.0) + float(seconds), 3)
    layer_s = [by_layer[k] for k in sorted(by_layer) if k >= 0]
    return {
        "ok": True,
        "wall_s": round(run["wall_s"], 2),
        "peak_rss_gib": round(run["peak_rss_gib"], 2),
        "session_start_s": report["session_start_s"],
        "prepare_s": report["prepare_s"],
        "load_s": by_layer.get(-1, 0.0),
        "layer_s": layer_s,
        "seconds_per_layer": sum(layer_s) / LAYERS,
        "partitions": report["partitions"],
        "strategies": report["strategies"],
        "exchange": report["exchange"],
        "phases": report.get("phases", []),
        "unaccounted_s": report.get("unaccounted_s"),
        "task_seconds": task_seconds,
        "steps": [{k: s.get(k) for k in ("label", "layer", "seconds", "task_seconds")} for s in report["steps"]],
    }


# ------------------------------------------------------------------ outputs


def read_pyg_output(path: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as saved:
        return saved["ids"], saved["h"]


def read_sparkgnn_output(folder: str) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow.parquet as pq

    table = pq.read_table(folder, columns=["id", "h"])
    column = table.column("h").combine_chunks()
    h = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    return table.column("id").to_numpy(), h.reshape(len(column), -1)


def max_rel_error(ids: np.ndarray, h: np.ndarray, ref_ids: np.ndarray, ref: np.ndarray) -> float:
    """max |h - ref| / max |ref| with rows matched by id; inf when the ids differ."""
    order = np.argsort(ids)
    pos = np.searchsorted(ids[order], ref_ids).clip(0, len(ids) - 1)
    rows = order[pos]
    if len(ids) != len(ref_ids) or not np.array_equal(ids[rows], ref_ids) or h.shape[1] != ref.shape[1]:
        return float("inf")
    return float(np.abs(h[rows] - ref).max() / max(float(np.abs(ref).max()), 1e-30))


# ------------------------------------------------------------------ the section


def measure(edges: int, conv: str, partitions: int, timeout_s: float) -> dict:
    """One graph size: both PyG jobs, then the native and the generic job, each cold."""
    nodes = edges // 10
    started = time.perf_counter()
    graph = synthetic_dir(nodes, edges, DIM)
    point: dict = {"edges": edges, "nodes": nodes, "graph_generation_s": round(time.perf_counter() - started, 1)}
    scratch = tempfile.mkdtemp(prefix="sparkgnn-generic-", dir=DATA)
    try:
        models, point["layer_kinds"] = save_models(conv, scratch)
        pyg: dict = {}
        for adjacency in ADJACENCIES:
            log.info("%s %s: PyG cold job (%s) ...", size_label(edges), CONVS[conv], adjacency)
            out = os.path.join(scratch, f"pyg_{adjacency}.npz")
            pyg[adjacency] = pyg_job(graph, models["pyg"], adjacency, out, timeout_s)
            log.info("  %s", json.dumps(pyg[adjacency]))
        ok = [a for a in ADJACENCIES if pyg[a].get("ok")]
        if "edge_index" not in ok:
            raise RuntimeError(f"PyG with edge_index failed at {edges} edges: {pyg['edge_index'].get('error')}")
        ref_ids, ref = read_pyg_output(os.path.join(scratch, "pyg_edge_index.npz"))
        if "adj_t" in ok:
            pyg["adj_t"]["max_rel_error_vs_edge_index"] = max_rel_error(
                *read_pyg_output(os.path.join(scratch, "pyg_adj_t.npz")), ref_ids, ref
            )
            if pyg["adj_t"]["max_rel_error_vs_edge_index"] > PYG_AGREEMENT:  # not the same model on a multigraph
                ok.remove("adj_t")
        best = min(ok, key=lambda a: sum(pyg[a]["layer_s"]))
        pyg["best"] = best
        pyg["seconds_per_layer"] = sum(pyg[best]["layer_s"]) / LAYERS
        point["pyg"] = pyg
        for name in ("native", "generic"):
            log.info(
                "%s %s: sparkgnn %s cold job (replicate, P=%d) ...", size_label(edges), CONVS[conv], name, partitions
            )
            job_dir = os.path.join(scratch, name + "_job")
            os.makedirs(job_dir)
            job = sparkgnn_job(graph, models[name], job_dir, partitions, timeout_s)
            if job["ok"]:
                job["max_rel_error_vs_pyg"] = max_rel_error(
                    *read_sparkgnn_output(os.path.join(job_dir, "out")), ref_ids, ref
                )
            point[name] = job
            log.info("  %s", json.dumps({k: v for k, v in job.items() if k not in ("steps", "phases", "tail")}))
            if not job["ok"]:
                log.info("  job failed:\n%s", job["tail"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    native, generic = point["native"], point["generic"]
    if native["ok"] and generic["ok"]:
        point["generic_over_native"] = round(generic["seconds_per_layer"] / native["seconds_per_layer"], 3)
    for name in ("native", "generic"):
        if point[name]["ok"]:
            point[f"{name}_over_pyg"] = round(point[name]["seconds_per_layer"] / point["pyg"]["seconds_per_layer"], 3)
    return point


def summary(points: dict[str, dict]) -> dict:
    """Ratios by size and whether the targets hold (None where a job failed)."""
    generic = {size: p.get("generic_over_native") for size, p in points.items()}
    native = {size: p.get("native_over_pyg") for size, p in points.items()}
    largest = max(points, key=lambda size: points[size]["edges"])
    return {
        "generic_over_native": generic,
        "native_over_pyg": native,
        "generic_over_pyg": {size: p.get("generic_over_pyg") for size, p in points.items()},
        "generic_within_target": None
        if None in generic.values()
        else all(r <= GENERIC_OVER_NATIVE_TARGET for r in generic.values()),
        "largest_size": largest,
        "native_within_target_at_largest": None
        if native[largest] is None
        else native[largest] <= NATIVE_OVER_PYG_TARGET,
    }


def plot(section: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(section["points"])
    points = [section["points"][s] for s in sizes]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    bars = [
        ("PyG (faster of edge_index / adj_t)", "tab:gray", lambda p: p["pyg"]["seconds_per_layer"]),
        ("sparkgnn native", "tab:blue", lambda p: p["native"].get("seconds_per_layer", np.nan)),
        ("sparkgnn generic", "tab:orange", lambda p: p["generic"].get("seconds_per_layer", np.nan)),
    ]
    for offset, (label, color, get) in enumerate(bars):
        ax1.bar(
            [i + (offset - 1) * 0.27 for i in range(len(points))],
            [get(p) for p in points],
            0.27,
            label=label,
            color=color,
        )
    ax1.set_xticks(range(len(points)), [f"{s} edges" for s in sizes])
    ax1.set_ylabel("seconds per layer (cold job)")
    ratios = ", ".join(
        f"{s}: generic/native {p.get('generic_over_native')}, native/PyG {p.get('native_over_pyg')}"
        for s, p in zip(sizes, points, strict=True)
    )
    ax1.set_title(f"{section['conv']}, replicate, P={section['partitions']}\n{ratios}", fontsize=8)
    ax1.legend(fontsize=8)
    jobs = [(f"{s}\n{name}", p[name]) for s, p in zip(sizes, points, strict=True) for name in ("native", "generic")]
    jobs = [(label, job) for label, job in jobs if job["ok"]]
    totals: dict[str, float] = {}
    for _, job in jobs:
        for row in job["phases"]:
            totals[row["name"]] = totals.get(row["name"], 0.0) + row["seconds"]
    top = sorted(totals, key=totals.get, reverse=True)[:7]
    bottom = np.zeros(len(jobs))
    for name in [*top, "other", "unaccounted"]:
        values = np.array([_phase_seconds(job, name, top) for _, job in jobs])
        ax2.bar(range(len(jobs)), values, bottom=bottom, label=name)
        bottom += values
    ax2.set_xticks(range(len(jobs)), [label for label, _ in jobs], fontsize=8)
    ax2.set_ylabel("seconds, whole cold job")
    ax2.set_title("where each job's time goes (phase table)", fontsize=9)
    ax2.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _phase_seconds(job: dict, name: str, top: list[str]) -> float:
    if name == "unaccounted":
        return float(job.get("unaccounted_s") or 0.0)
    if name == "other":
        return float(sum(row["seconds"] for row in job["phases"] if row["name"] not in top))
    return float(sum(row["seconds"] for row in job["phases"] if row["name"] == name))


def run_section(args: argparse.Namespace) -> dict:
    """Measure every size of `args.generic_sizes`, merge the section into batch.json under
    RESULT_KEY (other keys kept) and draw batch_generic.png, both in `args.generic_results`."""
    check_arguments(args)
    sizes = parse_sizes(args.generic_sizes)
    os.makedirs(DATA, exist_ok=True)
    torch.set_num_threads(2)
    points = {
        size_label(edges): measure(edges, args.generic_conv, args.generic_partitions, args.generic_timeout_s)
        for edges in sizes
    }
    section = {
        "what": "cold jobs: the generic fallback vs the native layer of the same conv and weights, and PyG",
        "conv": CONVS[args.generic_conv],
        "model": f"{LAYERS}-layer {CONVS[args.generic_conv]} (defaults), hidden {HIDDEN}, ReLU between",
        "graph": f"synthetic Zipf, nodes = edges/10, {DIM}-d, seed 0",
        "strategy": "replicate",
        "partitions": args.generic_partitions,
        "how": (
            "one process per measurement: spark_jobs/batch_inference.py --strategy replicate on a fresh work dir "
            "(seconds per layer from the report's layer steps, the step loading x apart); PyG: bench_generic.py "
            "--pyg-job with edge_index and with a CSR adj_t (built before the layers), the faster quoted (adj_t only "
            "when its output agrees with edge_index's)"
        ),
        "targets": {
            "generic_over_native": GENERIC_OVER_NATIVE_TARGET,
            "native_over_pyg_at_largest": NATIVE_OVER_PYG_TARGET,
        },
        "machine": machine(),
        "points": points,
        **summary(points),
    }
    os.makedirs(args.generic_results, exist_ok=True)
    path = os.path.join(args.generic_results, "batch.json")
    result = {}
    if os.path.exists(path):
        with open(path) as fh:
            result = json.load(fh)
    result[RESULT_KEY] = section
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)
    plot(section, os.path.join(args.generic_results, "batch_generic.png"))
    log.info("%s", json.dumps({k: v for k, v in section.items() if k not in ("points", "machine")}, indent=1))
    log.info("wrote %s (%s) and batch_generic.png", path, RESULT_KEY)
    return section


# ------------------------------------------------------------------ the PyG job (a child process)


def csr_adj_t(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """The transposed adjacency as a torch CSR tensor (row: destination, column: source), parallel
    edges summed into one entry's value. torch_geometric.utils.to_torch_csr_tensor without values
    drops parallel edges instead, which changes a sum aggregation on a multigraph."""
    values = torch.ones(edge_index.shape[1], dtype=torch.float32)
    adj_t = torch.sparse_coo_tensor(edge_index.flip(0), values, (num_nodes, num_nodes)).coalesce()
    return adj_t.to_sparse_csr()


def pyg_cold(graph: str, model: str, adjacency: str, out: str, threads: int) -> dict:
    """Read the graph, rebuild the saved PyG model, run it layer by layer over `adjacency`
    (edge_index, or `csr_adj_t`) and save (ids, h) to `out` (.npz). An out-of-memory failure is the
    outcome, not an exception."""
    started = time.perf_counter()
    from sparkgnn.graph import read_graph_dir

    torch.set_num_threads(threads)
    result: dict = {"adjacency": adjacency, "import_s": round(time.perf_counter() - started, 3)}
    try:
        t = time.perf_counter()
        data = read_graph_dir(graph)
        x = torch.from_numpy(data.x)
        edges = data.edge_index_torch()
        result["read_s"] = round(time.perf_counter() - t, 3)
        state = torch.load(model, weights_only=True)
        module = pyg_model(state["conv"], state["dim"], state["hidden"], state["layers"])
        module.load_state_dict(state["weights"])
        t = time.perf_counter()
        graph_input = edges if adjacency == "edge_index" else csr_adj_t(edges, len(x))
        result["adjacency_s"] = round(time.perf_counter() - t, 3)
        layers: list[float] = []
        h = x
        with torch.no_grad():
            for child in module:
                t = time.perf_counter()
                if isinstance(child, conv_class(state["conv"])):
                    h = child(h, graph_input)
                    layers.append(time.perf_counter() - t)
                else:  # the activation counts with the layer before it
                    h = child(h)
                    layers[-1] += time.perf_counter() - t
        result["layer_s"] = [round(s, 4) for s in layers]
        np.savez(out, ids=data.ids, h=h.numpy())
        result["ok"] = True
    except (MemoryError, RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
        result.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")
    result["total_s"] = round(time.perf_counter() - started, 3)
    return result


def main() -> int:
    parser = add_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--pyg-job", action="store_true", help="internal: run one cold PyG job, print one JSON line")
    parser.add_argument("--graph", help="--pyg-job: graph directory")
    parser.add_argument("--model", help="--pyg-job: the saved PyG model (torch.save of conv, dims, weights)")
    parser.add_argument("--adjacency", choices=ADJACENCIES, default="edge_index", help="--pyg-job: graph input")
    parser.add_argument("--out", help="--pyg-job: .npz for (ids, h)")
    parser.add_argument("--threads", type=int, default=2, help="--pyg-job: torch threads")
    args = parser.parse_args()
    if args.pyg_job:
        if not (args.graph and args.model and args.out):
            parser.error("--pyg-job needs --graph, --model and --out")
        sys.stdout.write(json.dumps(pyg_cold(args.graph, args.model, args.adjacency, args.out, args.threads)) + "\n")
        return 0
    try:
        check_arguments(args)
    except ValueError as e:
        parser.error(str(e))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run_section(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
