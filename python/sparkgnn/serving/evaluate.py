"""Score serving modes against FULL (the exact answer) and against the held-out labels.

WHY FULL as the reference and not only labels: accuracy mixes the model's own errors with the
mode's approximation; agreement with FULL's predictions and the relative error of h isolate what
the mode itself loses (the quantity OMEGA's Table 3 / Fig. 12 report as accuracy drop).

CLI: python -m sparkgnn.serving.evaluate --workload DIR --model PATH
     --modes full,ns,he,srpe@0.05/qer,srpe@0.2/random,exact  [--store DIR] [--partitions P]
     [--fanouts 25,10] [--seed S] [--ns-norm full|sampled] [--out FILE]
A mode spec is NAME[@GAMMA][/POLICY] (SRPE's budget and policy; defaults --gamma, --policy). The
reuse modes (he, srpe, exact) need --store, opened and verified against the workload's G and the
model (a stale store is refused). Prints one table row per mode (and batch size) and writes JSON
(default <workload>/evaluation.json).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import time

import numpy as np

from sparkgnn.cliargs import run_cli
from sparkgnn.errors import SparkGNNError
from sparkgnn.logs import install_cli_handler


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    scale = float(np.abs(b).max()) if b.size else 0.0
    return float(np.abs(a.astype(np.float64) - b).max() / (scale if scale > 0 else 1.0)) if b.size else 0.0


def _summary(rows: list[dict]) -> dict:
    lat = np.array([r["latency_s"] for r in rows])
    n_q = sum(r["batch_size"] for r in rows)
    correct = sum(r["correct"] for r in rows)
    agree = sum(r["agree"] for r in rows)
    out = {
        "requests": len(rows),
        "queries": int(n_q),
        "accuracy": correct / n_q if n_q else None,
        "agreement_with_reference": agree / n_q if n_q else None,
        "max_rel_err_vs_reference": max((r["rel_err"] for r in rows), default=0.0),
        "latency_p50_ms": float(np.percentile(lat, 50) * 1e3) if len(lat) else None,
        "latency_p99_ms": float(np.percentile(lat, 99) * 1e3) if len(lat) else None,
    }
    for key in ("bytes_fetched", "nodes_recomputed", "nodes_touched"):
        vals = np.array([r[key] for r in rows], dtype=np.float64)
        out[f"{key}_mean"] = float(vals.mean()) if len(vals) else 0.0
        out[f"{key}_total"] = int(vals.sum())
    for key in ("fetch_s", "compute_s", "merge_s"):
        out[f"{key}_mean"] = float(np.mean([r[key] for r in rows])) if rows else 0.0
    return out


def evaluate(engine_by_mode: dict, requests, labels: dict, reference_mode: str = "full") -> dict:
    """Per mode: {"overall": summary, "by_batch_size": {B: summary}} where a summary has accuracy,
    agreement_with_reference, max_rel_err_vs_reference, latency_p50_ms / p99_ms, and mean/total
    bytes_fetched, nodes_recomputed, nodes_touched, and mean fetch/compute/merge seconds."""
    if reference_mode not in engine_by_mode:
        raise SparkGNNError(f"reference mode {reference_mode!r} is not among the engines {sorted(engine_by_mode)}")
    requests = list(requests)
    reference, ref_latency = {}, {}
    for r in requests:
        t0 = time.perf_counter()
        reference[r.request_id] = engine_by_mode[reference_mode].answer(r)
        ref_latency[r.request_id] = time.perf_counter() - t0
    result = {}
    for mode, engine in engine_by_mode.items():
        rows = []
        for r in requests:
            t0 = time.perf_counter()
            a = reference[r.request_id] if mode == reference_mode else engine.answer(r)
            latency = time.perf_counter() - t0 if mode != reference_mode else ref_latency[r.request_id]
            ref = reference[r.request_id]
            y = np.array([labels.get(int(q), -1) for q in a.qid], dtype=np.int64)
            known = y >= 0
            pred, ref_pred = a.pred, ref.pred
            rows.append(
                {
                    "batch_size": int(known.sum()),
                    "latency_s": latency,
                    "correct": int((pred[known] == y[known]).sum()) if pred is not None else 0,
                    "agree": int((pred[known] == ref_pred[known]).sum()) if pred is not None else 0,
                    "rel_err": _rel_err(a.h, ref.h),
                    **{
                        k: a.breakdown.get(k, 0)
                        for k in (
                            "bytes_fetched",
                            "nodes_recomputed",
                            "nodes_touched",
                            "fetch_s",
                            "compute_s",
                            "merge_s",
                        )
                    },
                    "B": r.batch_size,
                }
            )
        by_b = {}
        for b in sorted({row["B"] for row in rows}):
            by_b[b] = _summary([row for row in rows if row["B"] == b])
        result[mode] = {"overall": _summary(rows), "by_batch_size": by_b}
    return result


def format_table(result: dict) -> str:
    head = (
        f"{'mode':<10}{'B':>6}{'n':>5}{'acc':>8}{'agree':>8}{'max_rel':>10}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'MB/req':>9}{'recomp':>9}"
    )
    lines = [head, "-" * len(head)]
    for mode, res in result.items():
        for b, s in [("all", res["overall"]), *res["by_batch_size"].items()]:
            acc = "-" if s["accuracy"] is None else f"{s['accuracy']:.4f}"
            agr = "-" if s["agreement_with_reference"] is None else f"{s['agreement_with_reference']:.4f}"
            lines.append(
                f"{mode:<10}{str(b):>6}{s['requests']:>5}{acc:>8}{agr:>8}"
                f"{s['max_rel_err_vs_reference']:>10.2e}{s['latency_p50_ms']:>9.2f}"
                f"{s['latency_p99_ms']:>9.2f}{s['bytes_fetched_mean'] / 1e6:>9.3f}"
                f"{s['nodes_recomputed_mean']:>9.1f}"
            )
    return "\n".join(lines)


REUSE_MODES = ("he", "srpe", "exact")
PROG = "python -m sparkgnn.serving.evaluate"


def parse_mode_spec(spec: str, args) -> tuple[str, dict]:
    """NAME[@GAMMA][/POLICY] -> (mode name, options); ModeError names the spec that is wrong."""
    from sparkgnn.serving import MODES
    from sparkgnn.serving.cliopts import check_gamma
    from sparkgnn.serving.modes import ModeError
    from sparkgnn.serving.policies import POLICIES

    name, _, policy = spec.partition("/")
    name, _, gamma = name.partition("@")
    if name not in MODES:
        raise ModeError(f"mode spec {spec!r}: unknown serving mode {name!r}; known: {', '.join(MODES.names())}")
    opts: dict = {}
    if name == "srpe":
        try:
            opts["gamma"] = check_gamma(gamma) if gamma else args.gamma
        except ValueError as exc:
            raise ModeError(f"mode spec {spec!r}: gamma {exc}") from None
        if policy and policy not in POLICIES:
            raise ModeError(f"mode spec {spec!r}: unknown SRPE policy {policy!r}; known: {', '.join(POLICIES.names())}")
        opts["policy"] = policy or args.policy
    elif gamma or policy:
        raise ModeError(f"mode spec {spec!r}: only srpe takes @gamma and /policy")
    if name in REUSE_MODES:
        if not args.store:
            raise ModeError(f"mode {name!r} reuses precomputed embeddings: pass --store")
        opts["partitions"] = args.partitions
    return name, opts


def build_parser() -> argparse.ArgumentParser:
    """Numbers and choices are checked by argparse (a usage error naming the flag, exit 2)."""
    from sparkgnn.cliargs import int_list, non_negative_int, positive_int
    from sparkgnn.serving.cliopts import gamma_type
    from sparkgnn.serving.modes import NS_NORMS
    from sparkgnn.serving.policies import POLICIES

    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("--workload", required=True, help="folder written by sparkgnn.serving.workload")
    ap.add_argument("--model", required=True, help="a saved sparkgnn Model (Model.save)")
    ap.add_argument("--modes", default="full,ns", help="comma separated NAME[@GAMMA][/POLICY]")
    ap.add_argument("--store", default=None, help="PE store root (for he, srpe, exact)")
    ap.add_argument("--gamma", type=gamma_type, default=0.1, help="SRPE budget in (0, 1] when a spec gives none")
    ap.add_argument("--policy", default="qer", choices=sorted(POLICIES), help="SRPE policy when a spec gives none")
    ap.add_argument("--partitions", type=positive_int, default=1, help="CGP partitions of the reuse modes (>= 1)")
    ap.add_argument("--fanouts", type=int_list(1), default=None, help="NS fanouts, e.g. 25,10 (default per depth)")
    ap.add_argument("--ns-norm", default="full", choices=NS_NORMS)
    ap.add_argument("--seed", type=non_negative_int, default=0)
    ap.add_argument("--out", default=None, help="result JSON (default <workload>/evaluation.json)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    install_cli_handler()  # library progress lines (sparkgnn loggers) on stdout
    return run_cli(PROG, lambda: run_evaluation(args))


def _workload_part(workload: str, name: str) -> str:
    """<workload>/<name>, or FileNotFoundError saying the folder is not a workload."""
    path = os.path.join(workload, name)
    if not os.path.exists(path):
        raise FileNotFoundError(
            errno.ENOENT, f"not a workload folder (written by sparkgnn.serving.workload): no {name}", path
        )
    return path


def run_evaluation(args) -> int:
    from sparkgnn.graph import read_graph_dir
    from sparkgnn.models import Model
    from sparkgnn.serving.engine import QueryEngine
    from sparkgnn.serving.request import read_requests
    from sparkgnn.serving.workload import WorkloadError, read_labels

    specs = [m for m in args.modes.split(",") if m]
    if "full" not in specs:
        specs.insert(0, "full")
    parsed = [(spec, *parse_mode_spec(spec, args)) for spec in specs]  # refusals before loading
    graph = read_graph_dir(_workload_part(args.workload, "graph"))
    model = Model.load(args.model)
    requests = read_requests(_workload_part(args.workload, "requests"))
    if not requests:
        raise WorkloadError(f"{os.path.join(args.workload, 'requests')} holds no request file (*.parquet)")
    labels = read_labels(_workload_part(args.workload, "labels.parquet"))
    fanouts = args.fanouts
    store = None
    if args.store:
        from sparkgnn.pe import PEStore

        store = PEStore.open(args.store, model=model, graph=graph)
    engines, context = {}, None
    for spec, name, opts in parsed:
        if name == "ns":
            opts.update(fanouts=fanouts, ns_norm=args.ns_norm)
        engine = QueryEngine(graph, model, mode=name, seed=args.seed, store=store, context=context, **opts)
        context = engine.context
        engines[spec] = engine
    result = evaluate(engines, requests, labels)
    print(format_table(result))
    out = args.out or os.path.join(args.workload, "evaluation.json")
    _write_json_atomically(
        out,
        {
            "modes": result,
            "fanouts": fanouts,
            "seed": args.seed,
            "ns_norm": args.ns_norm,
            "store": args.store,
            "partitions": args.partitions,
        },
    )
    print(f"wrote {out}")
    return 0


def _write_json_atomically(path: str, doc: dict) -> None:
    """A temp file renamed into place: a full disk leaves the previous file, not half a JSON."""
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=2, default=str)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


if __name__ == "__main__":
    raise SystemExit(main())
