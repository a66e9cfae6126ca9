"""Exact batch inference: embeddings / predictions of a trained model for every vertex of a graph.

    spark-submit spark_jobs/batch_inference.py --graph DIR --model PATH --out DIR [options]
    python spark_jobs/batch_inference.py ...            (creates a local session)

Output Parquet under --out: id (long), h (float32 list: the model's final output), pred (argmax)
when the model ends in a classifier. `--model` may repeat: the models run batched in one job
(sharing the graph's data movement, engine.batching) and model NAME's result goes to --out/NAME,
NAME being the model directory's name. A non-empty --out is refused unless --overwrite; an --out
that is (or overlaps) an input always. The result is staged beside --out and swapped in at the
end, so a failed job leaves an earlier result intact. User errors: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from sparkgnn.cliargs import positive_int, require_inputs, run_cli
from sparkgnn.errors import PlanError
from sparkgnn.logs import install_cli_handler
from sparkgnn.outputs import check_output
from sparkgnn.planner import STRATEGIES
from sparkgnn.planner.pruning import PRUNE_CHOICES


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="batch_inference.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", required=True, help="graph directory (vertices/, edges/, graph.json)")
    parser.add_argument(
        "--model",
        required=True,
        action="append",
        help="model saved with sparkgnn Model.save; repeat it to run several models batched "
        "(results under --out/<model directory name>)",
    )
    parser.add_argument("--out", required=True, help="output directory (Parquet)")
    parser.add_argument(
        "--strategy",
        default="auto",
        choices=["auto", *STRATEGIES],
        help="data movement per layer (default: chosen by the cost model)",
    )
    parser.add_argument(
        "--partitions",
        type=positive_int,
        default=None,
        help="number of partitions (default: total cores, more if memory needs it)",
    )
    parser.add_argument("--ids", default=None, help="file with one vertex id per line: infer only these")
    parser.add_argument(
        "--prune",
        choices=PRUNE_CHOICES,
        default="auto",
        help="with --ids: run only the ids' k-hop upstream frontier, on the driver (local) or through the "
        "engine (subgraph), or the whole graph filtered (whole); auto prices them and picks; off skips the "
        "frontier pass",
    )
    parser.add_argument(
        "--workers", default="inprocess", help="where layers run: inprocess (default) | local[N] | tcp://host:port"
    )
    parser.add_argument("--work-dir", default=None, help="where prepared graph layouts and models are cached")
    parser.add_argument(
        "--exchange",
        choices=("auto", "shuffle", "files"),
        default="auto",
        help="how routed rows travel between layer steps: Spark's shuffle, or Arrow files in the work dir "
        "written and read by the tasks (auto: files when every executor shares the work dir's local disk)",
    )
    parser.add_argument(
        "--materialise",
        choices=("auto", "local", "reliable"),
        default="auto",
        help="how a step's output is kept between steps on the shuffle exchange: local (localCheckpoint, lost "
        "with its executor), reliable (Parquet in the work dir: survives a lost executor, a rerun resumes); "
        "auto: local in local mode, reliable on a cluster",
    )
    parser.add_argument("--explain", action="store_true", help="print the plan before running")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier result in --out")
    parser.add_argument(
        "--report",
        default=None,
        help="write a JSON report of where the job's time went (session start, prepare, each step and "
        "layer, the planner's estimate vs the measured seconds per layer)",
    )
    args = parser.parse_args(argv)
    flags = ["--model"] if len(args.model) == 1 else [f"--model #{i + 1}" for i in range(len(args.model))]
    require_inputs(parser, {"--graph": args.graph, **dict(zip(flags, args.model, strict=True))})
    if args.ids and not os.path.isfile(args.ids):
        parser.error(f"--ids {args.ids!r} is not a file")
    if args.report and os.path.exists(args.report) and not args.overwrite:
        parser.error(f"--report {args.report!r} exists; pass --overwrite to replace it")
    return args


def read_ids(path: str) -> list[int]:
    """One id per line ('#' comments and blank lines skipped); an empty file is refused, since
    asking for no ids and getting an empty result would hide the mistake."""
    ids = []
    with open(path) as fh:
        for number, line in enumerate(fh, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                value = int(text)
            except ValueError:
                raise PlanError(f"--ids {path}: line {number} is not an integer id: {text!r}") from None
            if not -(1 << 63) <= value < (1 << 63):
                raise PlanError(f"--ids {path}: line {number}: {value} does not fit a 64-bit vertex id")
            ids.append(value)
    if not ids:
        raise PlanError(f"--ids {path} holds no ids (one vertex id per line); omit --ids to infer every vertex")
    return ids


def main(argv=None) -> int:
    args = parse_args(argv)
    install_cli_handler()  # the job's progress lines (sparkgnn loggers) on stdout
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_cli("batch_inference", lambda: _run_resumable(args, argv))


def _run_resumable(args, argv: list[str]) -> int:
    """_run, with a lost step's error ending in the exact command that resumes it."""
    from sparkgnn.engine.failures import resume_command
    from sparkgnn.errors import LayerFailed

    try:
        return _run(args)
    except LayerFailed as exc:
        if exc.run_path is None:
            raise
        raise LayerFailed(
            f"{exc}: {resume_command(sys.argv[0], argv, exc.run_path)}", exc.label, exc.lost, exc.run_path
        ) from exc


def _run(args) -> int:
    from sparkgnn import infer
    from sparkgnn.engine.api import input_paths
    from sparkgnn.engine.batching import model_names
    from sparkgnn.engine.session import job_session

    ids = read_ids(args.ids) if args.ids else None
    batched = len(args.model) > 1
    model = args.model if batched else args.model[0]
    # refuse before paying for a JVM; infer checks again with the resolved work dir
    inputs = {**input_paths(args.graph, None, args.work_dir), "--ids file": args.ids}
    inputs.update({f"--model {m}": m for m in args.model})
    targets = [os.path.join(args.out, name) for name in model_names(args.model)] if batched else [args.out]
    if batched:  # --out holds the models' results: it may hold others too, but never an input
        check_output(args.out, inputs, holds_others=True)
    for target in targets:
        check_output(target, inputs, args.overwrite)
    started = time.perf_counter()
    spark = job_session("sparkgnn-batch-inference")
    session_s = time.perf_counter() - started
    job = infer(
        spark,
        args.graph,
        model,
        out=args.out,
        strategy=args.strategy,
        partitions=args.partitions,
        ids=ids,
        prune=args.prune,
        workers=args.workers,
        explain=args.explain,
        work_dir=args.work_dir,
        overwrite=args.overwrite,
        exchange=args.exchange,
        materialise=args.materialise,
    )
    if not batched:
        report, plan = job.report, job.plan
        rows = job.frame.count()
        total_s = time.perf_counter() - started
        print(f"batch_inference: wrote {rows} rows to {args.out} in {total_s:.1f} s")
        if args.report:
            write_report(args.report, rows, session_s, total_s, report, plan)
        return 0
    counts = [frame.count() for frame in job.frames.values()]
    total_s = time.perf_counter() - started
    for target, rows in zip(targets, counts, strict=True):
        print(f"batch_inference: wrote {rows} rows to {target}")
    print(f"batch_inference: {len(targets)} models in {len(job.runs)} job(s), {total_s:.1f} s")
    if args.report:
        reports, plans = [report for report, _ in job.runs], [plan for _, plan in job.runs]
        write_batched_report(args.report, model_names(args.model), counts, session_s, total_s, reports, plans)
    return 0


def _job_doc(report, plan) -> dict:
    from sparkgnn.engine.executor import estimate_vs_actual

    return {
        "partitions": plan.partitions,
        "strategies": [layer.strategy for layer in plan.layers],
        "memory": plan.memory,
        "estimate_vs_actual": estimate_vs_actual(report, plan),
        **report.to_json(),
    }


def write_report(path: str, rows: int, session_s: float, total_s: float, report, plan) -> None:
    """The job's cost as a user paid it (cold JVM included), written atomically."""
    doc = {"rows": rows, "session_start_s": round(session_s, 3), "total_s": round(total_s, 3), **_job_doc(report, plan)}
    _write_json(path, doc)


def write_batched_report(path: str, names, counts, session_s: float, total_s: float, reports, plans) -> None:
    """Several models: rows per model, and each batch's job (one unless some models could not
    share an edge list) as write_report describes a job."""
    doc = {
        "models": list(names),
        "rows": dict(zip(names, counts, strict=True)),
        "session_start_s": round(session_s, 3),
        "total_s": round(total_s, 3),
        "jobs": [_job_doc(report, plan) for report, plan in zip(reports, plans, strict=True)],
    }
    _write_json(path, doc)


def _write_json(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=2)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
