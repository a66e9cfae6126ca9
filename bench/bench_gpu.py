"""What only a GPU can show: `make bench-gpu` -> bench/results/gpu.json + gpu.png.

Runs where the sparkgnn package is not installed and pyspark is absent (a lent GPU machine): when
`import sparkgnn` finds nothing it links the package's shape (python/sparkgnn + planner/ +
messenger/, as setup.py maps them) under a temporary folder and puts it on sys.path and on the
PYTHONPATH of the worker processes it starts. Nothing here imports pyspark.

Sections, in priority order (each guarded: a failing one records its error and the rest still run;
`--budget-s` skips what would start after the budget, keeping time for the later sections):
  1. dl_step: the batch job's DL step (sparkgnn.dl.step.run_step, staged as the worker runs it) on
     one partition's tables (own rows, mirror blocks, edges; 128 -> 128) for SAGE-mean, GCN, GAT
     and GIN at ~250K own rows / 2M edges and ~1M / 8M, on the CPU and on CUDA: cold (first call:
     CSR build, staging, kernels) and warm (median, host->device and back included: what a worker
     pays per batch), and the outputs' error against the CPU step and PyG's forward.
  2. pyg: the same conv's full-graph forward in memory on the same device (edge_index and a torch
     sparse CSR adj_t), warm median; ratio of the step to the faster PyG path.
  3. messenger: a LocalCluster worker (`sparkgnn-worker --device cuda|cpu`) answering the same
     layer_step batches at the 2M size: batches/s and seconds per batch.
  4. hotcache: a serving batch's row gather from a 1M x 128 PE array with 20% of the rows hot
     (serving/online/hotcache.HotRows) on CUDA, with the copy back the CPU kernels need, against
     the numpy gather they use today (the reason config.py leaves the cache off).
  5. gpu: device, capability, torch / CUDA / driver versions, CPUs, load, commit.
Without CUDA (or with `--device cpu`) the CPU and PyG-CPU parts run and `gpu` is null;
`--quick` shrinks every size so the whole flow runs in well under a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import importlib.util
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from typing import TypeVar

import numpy as np

LOG = logging.getLogger("bench_gpu")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONVS = ("sage", "gcn", "gat", "gin")
DIM = 128
# (label, own rows, mirror rows in MIRROR_BLOCKS blocks, edges): one partition of a P=4 layout
SIZES = [("2M", 250_000, 250_000, 2_000_000), ("8M", 1_000_000, 1_000_000, 8_000_000)]
QUICK_SIZES = [("20K", 2_500, 2_500, 20_000), ("80K", 10_000, 10_000, 80_000)]
MIRROR_BLOCKS = 3
EXACT_RTOL = 1e-5  # the project's float32 exactness bar (tests: rtol = atol = 1e-5)
WARM_REPEATS = 5
CPU_SLOW_S = 4.0  # a CPU step slower than this cold is timed warm once, not three times
# seconds kept for sections 3 and 4 while sections 1-2 run (they are skipped beyond it)
RESERVE_S = {"messenger": 60.0, "hotcache": 25.0}


# ---- running without an installed package ---------------------------------------------------


def ensure_sparkgnn() -> str | None:
    """Make `import sparkgnn` work from this checkout when the package is not installed: a
    symlink tree shaped like the installed package (the Makefile's lint target builds the same),
    put first on sys.path and on PYTHONPATH (worker processes started later import it too).
    Returns the tree's folder, None when sparkgnn was importable already."""
    if importlib.util.find_spec("sparkgnn") is not None:
        return None
    tree = os.path.join(tempfile.gettempdir(), f"sparkgnn-bench-tree-{os.getuid()}")
    shutil.rmtree(tree, ignore_errors=True)
    package = os.path.join(tree, "sparkgnn")
    os.makedirs(package)
    source = os.path.join(ROOT, "python", "sparkgnn")
    for name in os.listdir(source):
        os.symlink(os.path.join(source, name), os.path.join(package, name))
    for name in ("planner", "messenger"):
        os.symlink(os.path.join(ROOT, name), os.path.join(package, name))
    sys.path.insert(0, tree)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH", "")) if p)
    importlib.invalidate_caches()
    return tree


# ---- plumbing -------------------------------------------------------------------------------


class Budget:
    """A wall-clock budget for the whole run: sections ask before starting work."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.started = time.monotonic()

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.started)

    def allows(self, reserve: float = 0.0) -> bool:
        return self.left() > reserve


def guarded(result: dict, key: str, fn: Callable[[], object]) -> None:
    """result[key] = fn(), or {"error": ...} with the traceback's last lines when it raises."""
    started = time.perf_counter()
    try:
        result[key] = fn()
    except Exception as exc:  # a bench section must not take the others down
        LOG.exception("section %s failed", key)
        result[key] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    LOG.info("section %s: %.1f s", key, time.perf_counter() - started)


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


T = TypeVar("T")


def timed(fn: Callable[[], T], device: str) -> tuple[float, T]:
    """(seconds, value) of fn(), the device synchronized before and after."""
    synchronize(device)
    started = time.perf_counter()
    value = fn()
    synchronize(device)
    return time.perf_counter() - started, value


def median_time(fn: Callable[[], object], device: str, repeats: int) -> tuple[float, list[float]]:
    times = [timed(fn, device)[0] for _ in range(repeats)]
    return statistics.median(times), times


def errors(got: np.ndarray, ref: np.ndarray) -> dict:
    """max |got - ref| over max |ref| (normwise relative), and whether every element is within
    the tests' bar (|got - ref| <= 1e-5 + 1e-5 |ref|)."""
    got64, ref64 = got.astype(np.float64), ref.astype(np.float64)
    diff = np.abs(got64 - ref64)
    scale = float(np.abs(ref64).max()) if ref64.size else 0.0
    rel = float(diff.max()) / scale if diff.size and scale > 0 else float(diff.max() if diff.size else 0.0)
    within = bool((diff <= EXACT_RTOL + EXACT_RTOL * np.abs(ref64)).all())
    return {"max_rel": rel, "max_abs": float(diff.max()) if diff.size else 0.0, "within_1e-5": within}


# ---- a partition's tables -------------------------------------------------------------------


def pyg_module(kind: str):
    import torch
    from torch_geometric.nn import GAT, GCN, GIN, GraphSAGE

    torch.manual_seed(0)
    cls = {"sage": GraphSAGE, "gcn": GCN, "gat": GAT, "gin": GIN}[kind]
    return cls(DIM, DIM, 1).eval()


def make_graph(n_own: int, n_mirror: int, edges: int, seed: int = 0) -> dict:
    """One partition's raw inputs: x of own + mirror rows, and distinct edges src -> dst with src
    anywhere in [own | mirror] and dst an own row, no self loops, in-degrees skewed (dst = n_own *
    u^2, shuffled)."""
    rng = np.random.default_rng(seed)
    n_all = n_own + n_mirror
    x = rng.standard_normal((n_all, DIM), dtype=np.float32)
    perm = rng.permutation(n_own)
    src = rng.integers(0, n_all, int(edges * 1.02), dtype=np.int64)
    dst = perm[(n_own * rng.random(src.size) ** 2).astype(np.int64)]
    key = dst * n_all + src
    key[src == dst] = -1  # no self loops: PyG's add_remaining_self_loops treats them differently on a sparse adj_t
    _, first = np.unique(key, return_index=True)
    first = first[key[first] >= 0]
    # distinct pairs (a duplicate would merge into one entry of a sparse adj_t), in edge-list order
    keep = np.sort(first)[:edges]
    return {"x": x, "src": src[keep], "dst": dst[keep], "n_own": n_own, "n_mirror": n_mirror}


def step_tables(model, graph: dict) -> tuple[dict, dict]:
    """(header, tables) of the layer-0 step the batch job sends a partition (aggregate=edges,
    emit=none): own h plus the statistics the conv reads, the mirror payloads as MIRROR_BLOCKS
    blocks (what the source partitions' previous step computed and shipped), the edges."""
    import pyarrow as pa
    import torch

    from sparkgnn.arrowvec import to_fixed_list
    from sparkgnn.layers.base import compute_stats
    from sparkgnn.stat_keys import stat_key

    conv = model.conv(0)
    pre = model.choose_pre_transform(conv)
    n_own, n_all = graph["n_own"], graph["n_own"] + graph["n_mirror"]
    src_t, dst_t = torch.from_numpy(graph["src"]), torch.from_numpy(graph["dst"])
    with torch.inference_mode():
        stats = compute_stats(conv, src_t, dst_t, None, n_all)
        x_mirror = torch.from_numpy(graph["x"][n_own:])
        mirror = conv.prepare_src(x_mirror, {k: v[n_own:] for k, v in stats.items()}, pre).float().numpy()
    own = {"h": to_fixed_list(graph["x"][:n_own])}
    for name, values in stats.items():
        own[stat_key(conv, name)] = pa.array(values[:n_own].numpy().astype(np.float32))
    bounds = np.linspace(0, mirror.shape[0], MIRROR_BLOCKS + 1).astype(int)
    blocks = [to_fixed_list(np.ascontiguousarray(mirror[a:b])) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    tables = {
        "own": pa.table(own),
        "mirror": pa.table({"p": pa.chunked_array(blocks)}),
        "edges": pa.table({"src": pa.array(graph["src"]), "dst": pa.array(graph["dst"])}),
    }
    header = {"layer": 0, "aggregate": "edges", "emit": "none", "pre_transform": pre}
    return header, tables


def own_h(result: dict) -> np.ndarray:
    from sparkgnn.arrowvec import to_numpy_matrix

    return np.array(to_numpy_matrix(result["own"].column("h")), copy=True)


# ---- sections 1 and 2: the DL step and PyG in memory -----------------------------------------


def step_section(model_cpu, model_dev, header, tables, device: str) -> tuple[dict, dict]:
    """Timings of run_step on the CPU and (when `device` is CUDA) on it; returns (record, outputs)."""
    from sparkgnn.dl import csr, staging
    from sparkgnn.dl.step import run_step

    record: dict = {"input_bytes": sum(a.nbytes for a in staging.input_arrays(tables))}
    outputs: dict = {}
    csr.clear()
    cold, result = timed(lambda: run_step(model_cpu, header, tables, "cpu"), "cpu")
    outputs["cpu"] = own_h(result)
    repeats = 3 if cold < CPU_SLOW_S else 1
    warm, times = median_time(lambda: run_step(model_cpu, header, tables, "cpu"), "cpu", repeats)
    record.update(cpu_cold_s=cold, cpu_s=warm, cpu_times_s=times)
    csr.clear()
    if not device.startswith("cuda"):
        return record, outputs
    import torch

    try:  # a failure on the device keeps the CPU figures above
        torch.cuda.reset_peak_memory_stats()
        cold, result = timed(lambda: run_step(model_dev, header, tables, device), device)
        outputs["cuda"] = own_h(result)
        warm, times = median_time(lambda: run_step(model_dev, header, tables, device), device, WARM_REPEATS)
        record.update(
            cuda_cold_s=cold,
            cuda_warm_s=warm,
            cuda_times_s=times,
            cuda_peak_bytes=int(torch.cuda.max_memory_allocated()),
            pinned_host_bytes=int(staging.host_buffer(0, device, True).numel()),
            speedup_warm=record["cpu_s"] / warm,
            speedup_cold=record["cpu_cold_s"] / cold,
        )
    except Exception as exc:
        LOG.exception("the step on %s failed", device)
        record["cuda_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        csr.clear()
        torch.cuda.empty_cache()
    return record, outputs


def pyg_section(module, graph: dict, device: str, repeats: int) -> tuple[dict, np.ndarray]:
    """PyG's forward of `module` over the whole subgraph, data resident on `device`: warm median of
    edge_index and of a torch sparse CSR adj_t (when the conv takes one); returns (record, own rows
    of the edge_index output)."""
    import torch
    from torch_geometric.utils import to_torch_csr_tensor

    n_all = graph["n_own"] + graph["n_mirror"]
    x = torch.from_numpy(graph["x"]).to(device)
    edge_index = torch.stack([torch.from_numpy(graph["src"]), torch.from_numpy(graph["dst"])]).to(device)
    record: dict = {"device": device}
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's beta-state notices on sparse CSR
        cold, out = timed(lambda: module(x, edge_index), device)
        reference = out[: graph["n_own"]].float().cpu().numpy()
        warm, times = median_time(lambda: module(x, edge_index), device, repeats)
        record["edge_index"] = {"cold_s": cold, "warm_s": warm, "times_s": times}
        try:
            # row = dst: adj_t @ x sums each row's in-edges (PyG's adj_t convention)
            adj_t = to_torch_csr_tensor(edge_index.flip(0), size=(n_all, n_all))
            cold, out_adj = timed(lambda: module(x, adj_t), device)
            warm, times = median_time(lambda: module(x, adj_t), device, repeats)
            record["adj_t"] = {
                "cold_s": cold,
                "warm_s": warm,
                "times_s": times,
                "vs_edge_index": errors(out_adj[: graph["n_own"]].float().cpu().numpy(), reference),
            }
        except Exception as exc:  # a conv that takes no torch sparse adj_t (recorded, not fatal)
            record["adj_t"] = {"error": f"{type(exc).__name__}: {exc}"}
    fastest = [record[k]["warm_s"] for k in ("edge_index", "adj_t") if "warm_s" in record[k]]
    record["fastest_s"] = min(fastest)
    return record, reference


def dl_and_pyg(sizes, device: str, budget: Budget, reserve: float) -> dict:
    """Sections 1 and 2 per size and conv (the graph and tables are built once per size/conv)."""
    import torch

    from sparkgnn.models import Model

    out: dict = {"sizes": {}, "convs": list(CONVS), "dim": DIM, "mirror_blocks": MIRROR_BLOCKS}
    for label, n_own, n_mirror, edges in sizes:
        if not budget.allows(reserve):
            out["sizes"][label] = {"skipped": f"budget: {budget.left():.0f} s left, {reserve:.0f} s kept for later"}
            continue
        started = time.perf_counter()
        graph = make_graph(n_own, n_mirror, edges)
        per_size: dict = {
            "own_rows": n_own,
            "mirror_rows": n_mirror,
            "edges": int(graph["src"].size),
            "graph_build_s": time.perf_counter() - started,
            "convs": {},
        }
        out["sizes"][label] = per_size
        for kind in CONVS:
            if not budget.allows(reserve):
                per_size["convs"][kind] = {"skipped": f"budget: {budget.left():.0f} s left"}
                continue
            LOG.info("dl step %s %s on %s (%.0f s left)", label, kind, device, budget.left())
            entry: dict = {}
            per_size["convs"][kind] = entry

            def one(kind=kind, entry=entry, graph=graph) -> None:
                module = pyg_module(kind)
                model_cpu = Model.from_pyg(module, output="embedding")
                model_dev = Model.from_pyg(module, output="embedding").to(device) if device != "cpu" else model_cpu
                header, tables = step_tables(model_cpu, graph)
                entry["pre_transform"] = header["pre_transform"]
                step, outputs = step_section(model_cpu, model_dev, header, tables, device)
                entry["step"] = step
                entry["errors"] = {}
                if "cuda" in outputs:
                    entry["errors"]["cuda_vs_cpu"] = errors(outputs["cuda"], outputs["cpu"])
                try:
                    pyg, reference = pyg_section(copy.deepcopy(module).to(device), graph, device, WARM_REPEATS)
                except Exception as exc:  # PyG out of memory, say: the step's figures stand
                    LOG.exception("PyG's forward on %s failed", device)
                    pyg, reference = {"error": f"{type(exc).__name__}: {exc}"}, None
                finally:
                    if device.startswith("cuda"):
                        torch.cuda.empty_cache()
                entry["pyg"] = pyg
                if reference is not None:
                    entry["errors"]["cpu_vs_pyg"] = errors(outputs["cpu"], reference)
                    if "cuda" in outputs:
                        entry["errors"]["cuda_vs_pyg"] = errors(outputs["cuda"], reference)
                    step_s = step.get("cuda_warm_s") if device.startswith("cuda") else step["cpu_s"]
                    if step_s is not None:  # the step and PyG on the same device
                        entry["ratio_step_vs_pyg"] = step_s / pyg["fastest_s"]
                entry["flag_over_1e-5"] = sorted(k for k, v in entry["errors"].items() if v["max_rel"] > EXACT_RTOL)

            guarded(entry, "result", one)
            if entry.get("result") is None:
                entry.pop("result")
        del graph
    return out


# ---- section 3: sparkgnn-worker over the messenger -------------------------------------------


def messenger_section(size, devices: list[str], batches: int, threads: int) -> dict:
    """One LocalCluster per device (a broker and one `sparkgnn-worker --device D`), the SAGE step
    of `size` sent `batches` times after one warm-up batch (CSR built, model loaded); window 2."""
    from sparkgnn.dl.model_store import register
    from sparkgnn.messenger.local import LocalCluster
    from sparkgnn.models import Model

    label, n_own, n_mirror, edges = size
    graph = make_graph(n_own, n_mirror, edges)
    model = Model.from_pyg(pyg_module("sage"), output="embedding")
    header, tables = step_tables(model, graph)
    out: dict = {"size": label, "conv": "sage", "batches": batches, "window": 2, "devices": {}}
    store = tempfile.mkdtemp(prefix="sparkgnn-bench-models-")
    try:
        header = dict(header, op="layer_step", model=register(model, store))
        for device in devices:
            record: dict = {}
            out["devices"][device] = record

            def run(device=device, record=record) -> None:
                started = time.perf_counter()
                cluster = LocalCluster(1, model_store=store, device=device, threads=threads, start_timeout_s=120.0)
                with cluster:
                    record["start_s"] = time.perf_counter() - started
                    with cluster.client(timeout_s=300.0) as client:
                        first, _ = timed(lambda: client.call(header, tables), "cpu")
                        record["first_batch_s"] = first
                        requests = [(dict(header, batch=f"b{i}"), tables) for i in range(batches)]
                        seconds, results = timed(lambda: list(client.map(requests, window=2)), "cpu")
                    record.update(
                        seconds=seconds,
                        batches_per_s=batches / seconds,
                        s_per_batch=seconds / batches,
                        worker_compute_s=[r[0].get("compute_s") for r in results],
                    )

            guarded(record, "result", run)
            if record.get("result") is None:
                record.pop("result")
    finally:
        shutil.rmtree(store, ignore_errors=True)
    cpu, cuda = out["devices"].get("cpu", {}), out["devices"].get("cuda", {})
    if "s_per_batch" in cpu and "s_per_batch" in cuda:
        out["speedup_cuda"] = cpu["s_per_batch"] / cuda["s_per_batch"]
    return out


# ---- section 4: the serving hot cache --------------------------------------------------------


def hotcache_section(rows_total: int, device: str, batches: int, seed: int = 0) -> dict:
    """Gather of serving batches' rows from a rows_total x 128 float32 array, 20% of the rows hot
    (the most requested; requests draw rank N * u^3, ~58% of fetches hot): numpy fancy indexing
    (the CPU kernels today), HotRows on the CPU, and on CUDA with and without the copy back."""
    import torch

    from sparkgnn.serving.online.hotcache import HotRows

    rng = np.random.default_rng(seed)
    array = rng.standard_normal((rows_total, DIM), dtype=np.float32)
    by_rank = rng.permutation(rows_total)
    hot = by_rank[: rows_total // 5]
    out: dict = {"rows": rows_total, "dim": DIM, "hot_fraction": 0.2, "batches": batches, "shapes": {}}
    caches = {"cpu": HotRows(array, hot, "cpu")}
    if device.startswith("cuda"):
        caches["cuda"] = HotRows(array, hot, device)
    for shape, per_batch in (("64x30", 64 * 30), ("64x30x10", 64 * 30 * 10)):
        draws = [by_rank[(rows_total * rng.random(per_batch) ** 3).astype(np.int64)] for _ in range(batches)]
        variants: dict[str, Callable[[np.ndarray], object]] = {
            "numpy_gather": lambda r: torch.from_numpy(array[r]),
            "hotrows_cpu": lambda r: caches["cpu"].gather(r),
        }
        if "cuda" in caches:
            variants["hotrows_cuda_to_cpu"] = lambda r: caches["cuda"].gather(r).cpu()
            variants["hotrows_cuda_on_device"] = lambda r: caches["cuda"].gather(r)
            variants["numpy_gather_to_cuda"] = lambda r: torch.from_numpy(array[r]).to(device)
        record: dict = {"rows_per_batch": per_batch}
        for name, fn in variants.items():
            dev = device if name != "numpy_gather" and name != "hotrows_cpu" else "cpu"
            for r in draws[:3]:  # warm-up
                fn(r)
            times = [timed(functools.partial(fn, r), dev)[0] for r in draws]
            record[name] = {"median_s": statistics.median(times), "p90_s": float(np.percentile(times, 90))}
        cache = caches.get("cuda", caches["cpu"])
        cache.reset_stats()
        for r in draws:
            cache.gather(r)
        record["hit_rate"] = cache.stats()["hit_rate"]
        if "hotrows_cuda_to_cpu" in record:
            record["cuda_to_cpu_vs_numpy"] = (
                record["hotrows_cuda_to_cpu"]["median_s"] / record["numpy_gather"]["median_s"]
            )
            record["cuda_on_device_vs_numpy_to_cuda"] = (
                record["hotrows_cuda_on_device"]["median_s"] / record["numpy_gather_to_cuda"]["median_s"]
            )
        out["shapes"][shape] = record
    return out


# ---- section 5: the machine -------------------------------------------------------------------


def commit(given: str | None) -> str | None:
    """The checkout's commit: `given`, else git, else .git/HEAD read by hand (no git installed)."""
    if given:
        return given
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    with contextlib.suppress(OSError):
        with open(os.path.join(ROOT, ".git", "HEAD")) as fh:
            head = fh.read().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        with contextlib.suppress(OSError):
            with open(os.path.join(ROOT, ".git", ref)) as fh:
                return fh.read().strip()
        with open(os.path.join(ROOT, ".git", "packed-refs")) as fh:
            for line in fh:
                if line.rstrip().endswith(" " + ref):
                    return line.split()[0]
    return None


def gpu_info(device: str) -> dict | None:
    import torch

    if not device.startswith("cuda"):
        return None
    info: dict = {
        "name": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "memory_bytes": int(torch.cuda.get_device_properties(0).total_memory),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        query = "--query-gpu=name,driver_version,memory.total,clocks.max.sm"
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True, check=True, timeout=20
        ).stdout.strip()
    return info


def cuda_init_s(device: str) -> float | None:
    """Seconds to create the CUDA context and the cuBLAS / cuSPARSE handles, so no step's cold
    time includes them."""
    import torch

    if not device.startswith("cuda"):
        return None

    def init() -> None:
        a = torch.ones(4, 4, device=device)
        (a @ a).sum().item()
        crow = torch.tensor([0, 1, 2, 3, 4], device=device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch's beta-state notice on sparse CSR
            sparse = torch.sparse_csr_tensor(crow, torch.arange(4, device=device), torch.ones(4, device=device), (4, 4))
        torch.zeros(4, 4, device=device).addmm_(sparse, a)

    return timed(init, "cpu")[0]


# ---- plot, main -------------------------------------------------------------------------------


def plot(result: dict, path: str) -> str | None:
    """The DL step's bars per size and conv into `path` (None when no size ran)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = result.get("dl_step", {}).get("sizes", {})
    labels = [s for s in sizes if "convs" in sizes[s]]
    if not labels:
        return None
    series = [("cpu step", "cpu_s"), ("cuda step (warm)", "cuda_warm_s"), ("cuda step (cold)", "cuda_cold_s")]
    fig, axes = plt.subplots(1, len(labels), figsize=(6 * len(labels), 4.5), squeeze=False)
    for ax, label in zip(axes[0], labels, strict=True):
        convs = [c for c in CONVS if "step" in sizes[label]["convs"].get(c, {})]
        bars: dict[str, list[float]] = {}
        for name, key in series:
            values = [sizes[label]["convs"][c]["step"].get(key, np.nan) for c in convs]
            if not all(np.isnan(values)):
                bars[name] = values
        pyg = [sizes[label]["convs"][c].get("pyg", {}) for c in convs]
        pyg_device = next((p.get("device") for p in pyg if p.get("device")), "cpu")
        bars[f"PyG in memory ({pyg_device}, faster path)"] = [p.get("fastest_s", np.nan) for p in pyg]
        width = 0.8 / max(1, len(bars))
        for i, (name, values) in enumerate(bars.items()):
            ax.bar(np.arange(len(convs)) + i * width, values, width, label=name)
        ax.set_xticks(np.arange(len(convs)) + width * (len(bars) - 1) / 2, convs)
        ax.set_yscale("log")
        ax.set_ylabel("seconds per partition step")
        ax.set_title(f"{label} edges ({sizes[label]['own_rows']} own rows, {DIM} -> {DIM})")
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def save_figure(fig, path: str) -> str:
    """Lay out `fig`, write it to `path` as PNG and close it (the GPU benches' plots)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"), help="folder of gpu.json + gpu.png")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: cuda when available")
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke run): writes gpu_quick.json/.png")
    p.add_argument("--budget-s", type=float, default=300.0, help="skip work that would start after this")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch CPU threads")
    p.add_argument(
        "--sections", default="dl,messenger,hotcache", help="comma list of dl (1 and 2), messenger, hotcache"
    )
    p.add_argument("--commit", default=None, help="the checkout's commit, when there is no .git to read")
    args = p.parse_args(argv)
    unknown = set(args.sections.split(",")) - {"dl", "messenger", "hotcache"}
    if unknown:
        p.error(f"--sections: unknown {sorted(unknown)}; known: dl, messenger, hotcache")
    if args.budget_s <= 0 or args.threads < 1:
        p.error("--budget-s and --threads must be positive")
    return args


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    budget = Budget(args.budget_s)
    loadavg = os.getloadavg()
    tree = ensure_sparkgnn()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        LOG.error("--device cuda: torch %s sees no CUDA device", torch.__version__)
        return 2
    device = "cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu"
    torch.set_num_threads(args.threads)
    sections = args.sections.split(",")
    os.makedirs(args.out, exist_ok=True)
    name = "gpu_quick" if args.quick else "gpu"
    json_path, png_path = os.path.join(args.out, f"{name}.json"), os.path.join(args.out, f"{name}.png")
    result: dict = {
        "loadavg": list(loadavg),
        "quick": args.quick,
        "device": device,
        "budget_s": args.budget_s,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "commit": commit(args.commit),
        "package_tree": tree,
        "error_definition": "max_rel = max|got - ref| / max|ref| (float64); within_1e-5: every element "
        "|got - ref| <= 1e-5 + 1e-5 |ref| (the tests' bar)",
    }

    def save() -> None:
        result["elapsed_s"] = budget.seconds - budget.left()
        with open(json_path, "w") as fh:
            json.dump(result, fh, indent=2, sort_keys=True, default=str)

    guarded(result, "gpu", lambda: gpu_info(device))
    guarded(result, "cuda_init_s", lambda: cuda_init_s(device))
    import torch_geometric

    result["torch_geometric"] = torch_geometric.__version__
    save()
    sizes = QUICK_SIZES if args.quick else SIZES
    reserve = sum(RESERVE_S[s] for s in ("messenger", "hotcache") if s in sections) * (0.2 if args.quick else 1.0)
    if "dl" in sections:
        guarded(result, "dl_step", lambda: dl_and_pyg(sizes, device, budget, reserve))
        save()
        guarded(result, "plot", lambda: plot(result, png_path))
    if "messenger" in sections:
        if budget.allows(RESERVE_S["hotcache"] if "hotcache" in sections else 0.0):
            devices = ["cpu", device] if device != "cpu" else ["cpu"]
            guarded(
                result,
                "messenger",
                lambda: messenger_section(sizes[0], devices, 3 if args.quick else 5, args.threads),
            )
        else:
            result["messenger"] = {"skipped": f"budget: {budget.left():.0f} s left"}
        save()
    if "hotcache" in sections:
        if budget.allows():
            guarded(
                result,
                "hotcache",
                lambda: hotcache_section(20_000 if args.quick else 1_000_000, device, 20 if args.quick else 200),
            )
        else:
            result["hotcache"] = {"skipped": "budget spent"}
        save()
    LOG.info("wrote %s (%.0f s)", json_path, budget.seconds - budget.left())
    return 0


if __name__ == "__main__":
    sys.exit(main())
