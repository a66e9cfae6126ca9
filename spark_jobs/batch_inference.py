"""Exact batch inference: embeddings / predictions of a trained model for every vertex of a graph.

    spark-submit spark_jobs/batch_inference.py --graph DIR --model PATH --out DIR [options]
    python spark_jobs/batch_inference.py ...            (creates a local session)

Output Parquet under --out: id (long), h (float32 list: the model's final output), pred (argmax)
when the model ends in a classifier. `--model` may repeat: the models run batched in one job
(sharing the graph's data movement, engine.batching) and model NAME's result goes to --out/NAME,
NAME being the model directory's name. A non-empty --out is refused unless --overwrite; an --out
that is (or overlaps) an input always. The result is staged beside --out and swapped in at the
end, so a failed job leaves an earlier result intact. User errors: one line on stderr, exit 2.

A typed graph directory runs a typed model (HeteroModel.save of a to_hetero / HeteroConv model,
engine.typed): the result of node type T goes to --out/T, for every output type of the model or
only the ones `--types` names (the rounds then compute only what those types read), or only the
rows `--ids` names: `type:id,...` inline or a file of them (engine.typed_ids).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from sparkgnn.cliargs import positive_int, require_inputs, run_cli
from sparkgnn.engine.phases import PhaseClock, activate, phase, process_start_time
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
    parser.add_argument(
        "--ids",
        default=None,
        help="file with one vertex id per line: infer only these; on a typed graph type:id,... "
        "(e.g. paper:3,paper:8) or a file of such items",
    )
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
    parser.add_argument(
        "--types",
        default=None,
        help="typed graphs: comma-separated output node types to compute (default: all the model's), "
        "each written to --out/<type>",
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
    if args.types is not None:
        args.types = [t.strip() for t in args.types.split(",") if t.strip()]
        if not args.types:
            parser.error("--types names no node type (comma-separated node types of a typed graph)")
        if len(args.model) > 1:
            parser.error("--types runs one typed model; pass --model once")
    if args.ids and not os.path.isfile(args.ids) and ":" not in args.ids:
        parser.error(f"--ids {args.ids!r} is not a file (nor type:id,... for a typed graph)")
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


def _typed_ids(value: str) -> dict[str, list[int]]:
    """--ids on a typed graph: `type:id,...` inline, or a file of such items (several per line
    or one per line)."""
    from sparkgnn.engine.typed_ids import parse_typed_ids

    if os.path.isfile(value):
        with open(value) as fh:
            return parse_typed_ids(fh.read())
    return parse_typed_ids(value)


def main(argv=None, *, started_at: float | None = None) -> int:
    """Run the job; `started_at` (epoch seconds, the process's start when run as a script) is
    where its time table begins, so the interpreter's start and the imports are in it."""
    clock = PhaseClock(started_at=started_at)
    clock.claim("python start and imports")
    with clock.phase("argument checks"):
        args = parse_args(argv)
    install_cli_handler()  # the job's progress lines (sparkgnn loggers) on stdout
    argv = sys.argv[1:] if argv is None else list(argv)
    with activate(clock):
        return run_cli("batch_inference", lambda: _run_resumable(args, argv, clock))


def _run_resumable(args, argv: list[str], clock: PhaseClock) -> int:
    """_run, with a lost step's error ending in the exact command that resumes it."""
    from sparkgnn.engine.failures import resume_command
    from sparkgnn.errors import LayerFailed

    try:
        return _run(args, clock)
    except LayerFailed as exc:
        if exc.run_path is None:
            raise
        raise LayerFailed(
            f"{exc}: {resume_command(sys.argv[0], argv, exc.run_path)}", exc.label, exc.lost, exc.run_path
        ) from exc


def _run(args, clock: PhaseClock) -> int:
    with phase("imports (pyspark, torch, sparkgnn)"):
        from sparkgnn import infer
        from sparkgnn.engine.api import input_paths
        from sparkgnn.engine.batching import model_names
        from sparkgnn.engine.session import active_session, job_session
        from sparkgnn.engine.typed import is_typed_source

    with phase("argument checks"):
        batched = len(args.model) > 1
        model = args.model if batched else args.model[0]
        typed = is_typed_source(args.graph) or is_typed_source(args.model[0])
        ids_file = args.ids if args.ids and os.path.isfile(args.ids) else None
        if args.ids and not typed and ids_file is None:
            raise PlanError(f"--ids {args.ids!r}: type:id items name typed vertices; this graph has one vertex type")
        ids = _typed_ids(args.ids) if typed and args.ids else read_ids(args.ids) if args.ids else None
        # refuse before paying for a JVM; infer checks again with the resolved work dir
        inputs = {**input_paths(args.graph, None, args.work_dir), "--ids file": ids_file}
        inputs.update({f"--model {m}": m for m in args.model})
        targets = [os.path.join(args.out, name) for name in model_names(args.model)] if batched else [args.out]
        if batched or typed:  # --out holds the models' (types') results, and may hold others, never an input
            check_output(args.out, inputs, holds_others=True)
        for target in [] if typed else targets:
            check_output(target, inputs, args.overwrite)
    started = time.perf_counter()
    owned = active_session() is None  # a session this job starts, it also stops
    with phase("JVM and session start"):
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
        **({"types": args.types} if args.types else {}),
    )
    if typed:
        return _typed_done(spark, owned, job, args, started, session_s, clock)
    with phase("rows written"):
        counts = [_rows_written(job.reports[name], frame) for name, frame in job.frames.items()]
    _shutdown(spark, owned)
    total_s = time.perf_counter() - started
    if not batched:
        print(f"batch_inference: wrote {counts[0]} rows to {args.out} in {total_s:.1f} s")
        if args.report:
            write_report(args.report, counts[0], session_s, total_s, job.report, job.plan, clock.summary())
        clock.log_table("batch_inference")
        return 0
    for target, rows in zip(targets, counts, strict=True):
        print(f"batch_inference: wrote {rows} rows to {target}")
    print(f"batch_inference: {len(targets)} models in {len(job.runs)} job(s), {total_s:.1f} s")
    if args.report:
        reports, plans = [report for report, _ in job.runs], [plan for _, plan in job.runs]
        write_batched_report(
            args.report, model_names(args.model), counts, session_s, total_s, reports, plans, clock.summary()
        )
    clock.log_table("batch_inference")
    return 0


def _typed_done(spark, owned: bool, job, args, started: float, session_s: float, clock: PhaseClock) -> int:
    """A typed run's summary: rows written per output type (--out/<type>), and its report (per
    relation run, keyed `<round>:<relation>`)."""
    with phase("rows written"):
        counts = {t: int(frame.count()) for t, frame in job.frames.items()}
    _shutdown(spark, owned)
    total_s = time.perf_counter() - started
    for t, rows in counts.items():
        print(f"batch_inference: wrote {rows} rows of node type {t} to {os.path.join(args.out, t)}")
    from sparkgnn.engine.typed_local import LOCAL_KEY

    on_driver = list(job.reports) == [LOCAL_KEY]
    ran = "the requested rows on the driver" if on_driver else f"{len(job.reports)} relation run(s)"
    print(f"batch_inference: typed graph, {ran}, {total_s:.1f} s")
    if args.report:
        keys = list(job.reports)
        doc = {
            "types": list(counts),
            "rows": counts,
            "session_start_s": round(session_s, 3),
            "total_s": round(total_s, 3),
            "relations": {key: _job_doc(job.reports[key], job.plans[key]) for key in keys},
        }
        _write_json(args.report, {**doc, **clock.summary()})
    clock.log_table("batch_inference")
    return 0


def _rows_written(report, frame) -> int:
    """The rows a model's result holds: what the output's tasks reported writing when they wrote
    it (RunReport.rows_written), else a count of the result read back."""
    rows = getattr(report, "rows_written", None)
    return int(rows) if rows is not None else int(frame.count())


def _shutdown(spark, owned: bool) -> None:
    """Stop the session this job started (timed, so the table covers the JVM's shutdown too); a
    session the caller started (a notebook, a test) is left running."""
    if owned:
        with phase("shutdown (stop the session)"):
            spark.stop()


def _job_doc(report, plan) -> dict:
    from sparkgnn.engine.executor import estimate_vs_actual

    return {
        "partitions": plan.partitions,
        "strategies": [layer.strategy for layer in plan.layers],
        "memory": plan.memory,
        "estimate_vs_actual": estimate_vs_actual(report, plan),
        **report.to_json(),
    }


def write_report(
    path: str, rows: int, session_s: float, total_s: float, report, plan, timing: dict | None = None
) -> None:
    """The job's cost as a user paid it (cold JVM included), written atomically. `timing`
    (engine.phases.PhaseClock.summary): the whole process's wall time by phase, with the
    unaccounted rest (wall_s, phases, accounted_s, unaccounted_s, unaccounted_fraction)."""
    doc = {"rows": rows, "session_start_s": round(session_s, 3), "total_s": round(total_s, 3), **_job_doc(report, plan)}
    _write_json(path, {**doc, **(timing or {})})


def write_batched_report(
    path: str, names, counts, session_s: float, total_s: float, reports, plans, timing: dict | None = None
) -> None:
    """Several models: rows per model, and each batch's job (one unless some models could not
    share an edge list) as write_report describes a job; `timing` as write_report's."""
    doc = {
        "models": list(names),
        "rows": dict(zip(names, counts, strict=True)),
        "session_start_s": round(session_s, 3),
        "total_s": round(total_s, 3),
        "jobs": [_job_doc(report, plan) for report, plan in zip(reports, plans, strict=True)],
    }
    _write_json(path, {**doc, **(timing or {})})


def _write_json(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=2)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(started_at=process_start_time()))
