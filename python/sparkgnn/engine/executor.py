"""Runs a compiled Plan on Spark DataFrames.

Each step (schedule.py) is one mapInArrow over the rows routed to each partition; between steps
rows travel through an exchange (engine.exchange: Spark's shuffle, or Arrow files in the work dir).
Every step's output is materialised (engine.materialise) so lineage stays one step long and each
layer is timed on its own; the last step's output is the result. On a cluster the materialised
steps are kept in the run directory (engine.run_dir), so a lost executor costs only its tasks and
a rerun of a failed job resumes after the last committed step; a failed step's Spark error becomes
one line naming the step and what was lost (engine.failures). One console line per step, and the Spark UI names
each job "sparkgnn layer l/k: strategy".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from dataclasses import dataclass, field

from sparkgnn import files as fsys
from sparkgnn.engine import phases
from sparkgnn.engine.degrees import STAT_KEYS, is_out_stat
from sparkgnn.engine.exchange import ShuffleExchange, check_reports
from sparkgnn.engine.failures import step_failures
from sparkgnn.engine.metrics import ShuffleMeter
from sparkgnn.engine.prepare import out_stat_marker
from sparkgnn.engine.pushdown import aggregate_op, wire_states
from sparkgnn.engine.routing import (
    FILES_SCHEMA_DDL,
    OUTPUT_PRED_SCHEMA_DDL,
    OUTPUT_SCHEMA_DDL,
    PE_STATE,
    ROW_SCHEMA_DDL,
    key_expr,
    partition_expr,
    partition_keys,
    route,
)
from sparkgnn.engine.run_dir import run_key
from sparkgnn.engine.schedule import schedule
from sparkgnn.engine.spark_compat import set_job_description, task_counters
from sparkgnn.engine.static import EDGE_ATTR_COLUMN
from sparkgnn.engine.steps import INPUT_STAGE, PEAK_RSS, TIMERS, StepConfig, run_step
from sparkgnn.errors import SparkGNNError
from sparkgnn.outputs import discard, staging_path, swap_into_place
from sparkgnn.parquet_read import read_parquet

log = logging.getLogger(__name__)

# DL stages that finish a conv (the others only load or prepare): the steps a PE store commits.
AGGREGATING_STAGES = ("edges", "states")


@dataclass
class StepReport:
    label: str
    seconds: float
    shuffle: dict | None
    task_seconds: dict = field(default_factory=dict)  # summed over tasks: rows_in, collect, dl, scatter
    layer: int = -1  # conv whose aggregation the step finishes (-1: the first step, loading x)
    peak_task_rss_bytes: int | None = None  # largest Python worker RSS after a task of this step
    exchanged_bytes: int | None = None  # routed rows written to files (files exchange), else None
    # whether the plan's estimates cover the step: the feature scan's Parquet decode is not costed
    # (the plan's Scan operator is informative only, planner.cost.measure)
    estimated: bool = True


@dataclass
class RunReport:
    """What a run cost, step by step. A step finishes layer l's aggregation and prepares what layer
    l+1 needs (fused), so `seconds_by_layer` charges each step to the layer it finishes; layer -1 is
    the first step (features in, layer 0's payloads out); the last layer's time includes writing
    the output. `prepare_s` is the graph layout preparation (0-ish when reused)."""

    steps: list = field(default_factory=list)
    final_layer: int = -1
    prepare_s: float = 0.0
    prepare_reused: bool = False
    exchange: str = "shuffle"  # how routed rows travelled between steps (engine.exchange)
    labels: list = field(default_factory=list)  # every step of the run's schedule, by index
    resumed_after: int | None = None  # the step an earlier run committed and this one started after
    rows_written: int | None = None  # rows the last step's tasks reported writing to the output, else None

    def seconds_by_layer(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for step in self.steps:
            out[step.layer] = out.get(step.layer, 0.0) + step.seconds
        return out

    def seconds_by_plan_layer(self) -> dict[int, float]:
        """Seconds per layer charged the way the plan estimates them: a plan's first layer holds
        the first step (x in, layer 0's payloads out: its first Pipe, 2 passes in all), so the
        steps of layer -1 belong to layer 0 here; steps the plan does not cost (the feature scan)
        count nowhere. Comparing layer 0's estimate with its aggregation step alone made every
        refit learn that the first step's bytes and pass cost nothing, though that step can take
        a large share of the layer."""
        out: dict[int, float] = {}
        for step in self.steps:
            if step.estimated:
                layer = max(step.layer, 0)
                out[layer] = out.get(layer, 0.0) + step.seconds
        return out

    def to_json(self) -> dict:
        return {
            "prepare_s": round(self.prepare_s, 3),
            "prepare_reused": self.prepare_reused,
            "exchange": self.exchange,
            "resumed_after": None if self.resumed_after is None else self.labels[self.resumed_after],
            "seconds_by_layer": {str(k): round(v, 3) for k, v in sorted(self.seconds_by_layer().items())},
            "steps": [
                {
                    "label": s.label,
                    "layer": s.layer,
                    "seconds": round(s.seconds, 3),
                    "task_seconds": s.task_seconds,
                    "peak_task_rss_bytes": s.peak_task_rss_bytes,
                    "exchanged_bytes": s.exchanged_bytes,
                    **(s.shuffle or {}),
                }
                for s in self.steps
            ],
        }


def estimate_vs_actual(report: RunReport, plan) -> list[dict]:
    """Per layer: the planner's estimated seconds next to the measured ones (the steps charged to
    the layer), so every run shows how far the cost model is off."""
    measured = report.seconds_by_plan_layer()
    rows = []
    for index, layer in enumerate(plan.layers):
        estimate = layer.estimates.get("seconds")
        actual = measured.get(index)
        rows.append(
            {
                "layer": index,
                "strategy": layer.strategy,
                "estimate_s": None if estimate is None else round(float(estimate), 3),
                "actual_s": None if actual is None else round(actual, 3),
                "actual_over_estimate": round(actual / estimate, 2) if actual and estimate else None,
            }
        )
    return rows


def estimate_lines(rows: list[dict]) -> list[str]:
    return [
        f"sparkgnn layer {r['layer'] + 1} ({r['strategy']}): estimated {r['estimate_s']} s, took {r['actual_s']} s"
        + (f" ({r['actual_over_estimate']}x)" if r["actual_over_estimate"] else "")
        for r in rows
    ]


def _initial_rows(vertices, keys, partitions: int, column: str = "x"):
    """Own rows of every vertex, routed to its owner: x for a fresh run, or a stored h^(l) (PE store)
    to resume from layer l."""
    part = partition_expr("id", partitions)
    return vertices.selectExpr(
        f"{key_expr(keys, part)} as k",
        f"cast({part} as int) as pt",
        "0 as kind",
        "cast(id as long) as id",
        "cast(-1 as long) as aux",
        "cast(1.0 as float) as w",
        f"{column} as x",
    )


def _join_edges(spark, rows, prepared, keys):
    """edge_join wiring: own rows stay; each unrouted source payload is joined onto every out-edge of
    its vertex and routed to the edge's destination partition."""
    own = rows.where("kind = 0")
    payloads = rows.where("kind = 1").selectExpr("id as src", "v")
    edges = prepared.edges_by_dst(spark)
    # a graph's edge attributes ride on each edge row (column `a`; own rows carry none)
    attr = [EDGE_ATTR_COLUMN] if prepared.edge_attr_dim else []
    per_edge = payloads.join(edges, "src").selectExpr(
        f"{key_expr(keys, 'pd')} as k",
        "cast(pd as int) as pt",
        "4 as kind",
        "src as id",
        "dst as aux",
        "w",
        "v",
        *attr,
    )
    if attr:
        own = own.selectExpr("*", f"cast(null as array<float>) as {EDGE_ATTR_COLUMN}")
    return own.unionByName(per_edge)


def _vertex_files(graph) -> list[str] | None:
    """The vertex Parquet files of a graph directory on a local disk (what the files exchange's
    feature scan reads in the tasks), or None for a graph given as DataFrames or stored remotely."""
    from sparkgnn.files import data_files, is_local, join
    from sparkgnn.graph.layout import VERTICES_DIR

    path = getattr(graph, "path", None)
    if not path or not is_local(path):
        return None
    directory = join(path, VERTICES_DIR)
    return [join(directory, f.rel) for f in data_files(directory)] or None


def _wire_pushdown(spark, step, rows, prepared, keys, plan):
    return wire_states(spark, rows, prepared, keys, aggregate_op(plan, step.layer))


# How a step's input is built from the previous step's rows where Spark's SQL does work first
# (inputs key -> wiring); every other step routes the rows as they are.
WIRING = {
    "edges_rows": lambda spark, step, rows, prepared, keys, plan: _join_edges(spark, rows, prepared, keys),
    "spark_states": _wire_pushdown,
}


def _wire(spark, step, rows, prepared, keys, plan):
    wiring = WIRING.get(step.inputs)
    if wiring is not None:
        rows = wiring(spark, step, rows, prepared, keys, plan)
    return route(rows, plan.partitions)


def execute(
    spark,
    prepared,
    plan,
    model_fingerprint: str,
    graph,
    transport: dict,
    with_pred: bool,
    needs_dst: list[bool],
    on_layer=None,
    resume=None,
    write_to: str | None = None,
    exchange=None,
    stats: tuple = (),
    stage_layer=None,
):
    """Run all steps; returns (final DataFrame (id, h[, pred]) not yet materialised, RunReport, ...).

    With `on_layer(l, rows)` (PE precomputation) every step that completes conv l-1 hands its
    materialised rows (own rows with h^(l) and state rows) to the callback, including the last, and
    no output DataFrame is returned. `resume=(l, DataFrame(id, h))` starts from a stored h^(l).
    With `write_to` (an existing staging directory) the last step's tasks write the output Parquet
    there themselves (step_outputs.outputs_final_files) and the final DataFrame holds one row per
    partition (pt, rows, bytes); `finish(..., staged=write_to)` then commits it. `exchange`
    (engine.exchange, default the shuffle) carries the routed rows between steps; the caller
    closes it after finish. `stage_layer(l) -> folder` (PE precomputation): the tasks of the step
    that completes layer l write its rows (id, h, state) into that folder themselves
    (step_outputs.write_pe_part) and `on_layer(l, rows)` commits them; without it the rows come
    back through Spark, which only the shuffle exchange carries. `stats` are the statistic keys
    the model's convs read (sparkgnn.stat_keys.stat_keys), which every own table carries (the
    out-edge ones written beforehand by engine.prepare.ensure_out_stats)."""
    unknown = sorted(set(stats) - set(STAT_KEYS))
    if unknown:
        raise SparkGNNError(
            f"the model reads node statistics {unknown} that prepared layouts do not carry; "
            f"they carry {', '.join(STAT_KEYS)}"
        )
    absent = sorted(key for key in stats if is_out_stat(key) and not fsys.exists(out_stat_marker(prepared.path, key)))
    if absent:
        raise SparkGNNError(
            f"out-edge statistics {absent} were not computed for this layout (prepare.ensure_out_stats)"
        )
    if on_layer is not None and stage_layer is None and exchange is not None and exchange.name != "shuffle":
        raise SparkGNNError(f"a PE precomputation through the {exchange.name} exchange needs stage_layer")
    partitions = plan.partitions
    with phases.phase("routing keys"):
        keys = partition_keys(spark, partitions)
    strategies = [layer.strategy for layer in plan.layers]
    pre = [layer.pre_transform for layer in plan.layers]
    start_layer = resume[0] if resume else 0
    steps = schedule(strategies, needs_dst, start_layer, final="final" if on_layer is None else "own_only")
    exchange = exchange or ShuffleExchange()
    exchange.start(
        run_key(
            {
                "graph": graph.fingerprint,
                "model": model_fingerprint,
                "partitions": partitions,
                "keys": [int(k) for k in keys],
                "steps": [dataclasses.astuple(step) for step in steps],
                "pre_transform": pre,
                "with_pred": with_pred,
                "with_state": on_layer is not None,
                "start_layer": start_layer,
                "exchange": exchange.name,
            }
        )
    )
    if write_to is not None and steps[-1].outputs == "final":
        steps[-1] = dataclasses.replace(steps[-1], outputs="final_files")
    num_layers = len(plan.layers)
    meter = ShuffleMeter(spark)
    threads = int(plan.memory.get("threads_per_task", 1))
    if transport.get("kind", "inprocess") == "inprocess" and threads > 1:
        transport = dict(transport, threads=threads)  # fewer tasks at once than cores: each gets more
    retain = plan.memory.get("retain_bytes") or None
    report = RunReport(
        prepare_s=prepared.seconds,
        prepare_reused=prepared.reused,
        exchange=exchange.name,
        labels=[step.label for step in steps],
    )
    # the vertices' own rows through Spark, built only for a first step that reads Spark's rows
    # (the files exchange's first step reads the feature scan's files instead)
    rows = None
    # A rerun of a failed job (same work dir, graph, model and plan) starts after its last committed
    # step. Not for PE precomputation: its store commits layers itself and resumes from them.
    first = 0
    kept = exchange.run.last_committed(len(steps) - 1) if on_layer is None and exchange.durable else None
    if kept is not None:
        rows = exchange.resume(spark, kept)
        first = kept + 1
        report.resumed_after = kept
        log.info(f"sparkgnn: resuming after '{steps[kept].label}', committed by an earlier run in {exchange.run.path}")
    files = None if resume or first else _vertex_files(graph)
    if files and exchange.reuse_features(prepared.path, keys):
        # an earlier job on this graph and P kept the scanned features beside the layout
        log.info(f"sparkgnn: reusing the features scanned for {partitions} partitions by an earlier job")
    elif files:
        set_job_description(spark, "sparkgnn feature scan")
        started = time.perf_counter()
        with step_failures("feature scan", exchange, on_layer is None), phases.phase("feature scan", quiet=True):
            scanned = exchange.scan_features(spark, files, keys, keep_in=prepared.path)
        if scanned is not None:
            report.steps.append(
                StepReport(
                    "feature scan",
                    time.perf_counter() - started,
                    meter.delta(),
                    exchanged_bytes=scanned[1],
                    estimated=False,
                )
            )
            log.info(_progress(report.steps[-1]))
    final_df = final_timers = None
    for index, step in enumerate(steps):
        if index < first:
            continue
        last = index == len(steps) - 1
        ends_job = last and on_layer is None  # the step whose output is the job's result
        completes = on_layer is not None and INPUT_STAGE[step.inputs] in AGGREGATING_STAGES
        pe_dir = stage_layer(step.layer + 1) if completes and stage_layer is not None else None
        exchange_in, exchange_out = exchange.paths(index, ends_job)
        cfg = StepConfig(
            prep_dir=prepared.path,
            partitions=partitions,
            keys=tuple(int(k) for k in keys),
            model=model_fingerprint,
            layer=step.layer,
            num_layers=num_layers,
            inputs=step.inputs,
            outputs=step.outputs,
            pre_transform=pre[step.layer] if step.layer >= 0 else False,
            next_pre_transform=pre[step.layer + 1] if step.layer + 1 < num_layers else False,
            transport=transport,
            with_pred=with_pred,
            with_state=on_layer is not None,
            stats=tuple(stats),
            out_dir=write_to if step.outputs == "final_files" else None,
            pe_dir=pe_dir,
            exchange_in=exchange_in,
            exchange_out=exchange_out,
            retain_bytes=retain,
            keep_between_steps=bool(plan.memory.get("keep_between_steps", True)),
        )
        schema = {
            "final": OUTPUT_PRED_SCHEMA_DDL if with_pred else OUTPUT_SCHEMA_DDL,
            "final_files": FILES_SCHEMA_DDL,
        }.get(step.outputs, ROW_SCHEMA_DDL)
        schema = exchange.output_schema(index, ends_job, schema)
        timers = task_counters(spark, TIMERS, (PEAK_RSS,))
        if exchange_in is None:
            if rows is None:  # the first step this run runs (a resumed one's too)
                vertices, column = (resume[1], "h") if resume else (graph.vertices, "x")
                rows = _initial_rows(vertices, keys, partitions, column)
            source = _wire(spark, step, rows, prepared, keys, plan)
        else:
            source = exchange.control(spark)
        out = source.mapInArrow(functools.partial(run_step, cfg, timers=timers), schema)
        if ends_job:
            final_df = out
            final_timers = timers
            break
        set_job_description(spark, f"sparkgnn {step.label}")
        started = time.perf_counter()
        with (
            step_failures(step.label, exchange, on_layer is None, report.labels.__getitem__),
            phases.phase(step.label, quiet=True),
        ):
            rows, exchanged = exchange.materialise(spark, out, index)
        seconds = time.perf_counter() - started
        shuffle = meter.delta()
        report.steps.append(
            StepReport(step.label, seconds, shuffle, _read(timers), step.layer, _peak(timers), exchanged)
        )
        log.info(_progress(report.steps[-1]))
        if completes:
            on_layer(step.layer + 1, rows)
            if pe_dir is None:
                rows = rows.where(f"kind != {PE_STATE}")
    report.final_layer = steps[-1].layer
    return final_df, report, meter, steps[-1].label, final_timers


def _read(timers: dict) -> dict:
    return {name: round(timers[name].value, 3) for name in TIMERS if name in timers}


def _peak(timers: dict | None) -> int | None:
    return int(timers[PEAK_RSS].value) if timers and PEAK_RSS in timers else None


def _progress(step: StepReport, suffix: str = "") -> str:
    line = f"sparkgnn {step.label}: {step.seconds:.2f} s"
    if step.shuffle and step.shuffle.get("shuffle_write_bytes"):
        line += f", shuffled {_mb(step.shuffle['shuffle_write_bytes'])}"
    if step.shuffle and step.shuffle.get("tasks"):  # the JVM module's listener (engine.metrics)
        line += f", {step.shuffle['tasks']} Spark tasks ran {step.shuffle['task_run_s']:.1f} s"
        if step.shuffle.get("failed_tasks"):
            line += f" ({step.shuffle['failed_tasks']} attempts failed)"
    if step.exchanged_bytes is not None:
        line += f", routed {_mb(step.exchanged_bytes)} through files"
    if step.task_seconds:
        line += " (task s: " + ", ".join(f"{k[:-2]} {v:.2f}" for k, v in step.task_seconds.items()) + ")"
    if step.peak_task_rss_bytes:
        line += f", task peak RSS {step.peak_task_rss_bytes / 2**30:.2f} GiB"
    return line + suffix


def _mb(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:.1f} MiB"


def _commit_task_files(final_df, staged: str, with_pred: bool) -> int:
    """Run the last step (its tasks write part files into `staged`) and check every partition
    reported once; returns the rows written. An output with no rows gets one empty file with the
    output schema, so it reads back like a Spark-written empty result."""
    reports = final_df.collect()
    rows, _ = check_reports(reports)
    if not reports:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from sparkgnn.files import filesystem

        fields = [("id", pa.int64()), ("h", pa.list_(pa.float32()))] + ([("pred", pa.int64())] if with_pred else [])
        fs, directory = filesystem(staged)
        with fs.open_output_stream(f"{directory}/part-00000.parquet") as sink:
            pq.write_table(pa.schema(fields).empty_table(), sink)
    return rows


def staged_output(out: str) -> str:
    """A fresh staging directory beside `out` for tasks to write into (outputs.staging_path)."""
    from sparkgnn.files import filesystem

    staged = staging_path(out)
    fs, directory = filesystem(staged)
    fs.create_dir(directory, recursive=True)
    return staged


def finish(
    spark,
    final_df,
    report,
    meter,
    label: str,
    out: str | None,
    timers: dict | None = None,
    staged: str | None = None,
    with_pred: bool = False,
    guard=None,
):
    """Materialise the last step: write Parquet under `out` (staged beside it, then swapped in:
    a failure leaves any previous result intact; the caller checked `out` first), or checkpoint
    in memory. With `staged` the tasks of the last step wrote the files there (execute's
    write_to); otherwise Spark's writer does. `guard` (engine.failures.step_failures) names the
    step in a failure of its Spark job."""
    set_job_description(spark, f"sparkgnn {label}")
    started = time.perf_counter()
    guard = guard or contextlib.nullcontext
    if out:
        tasks_wrote = staged is not None
        staged = staged or staging_path(out)
        try:
            with guard(), phases.phase(label, quiet=True):
                if tasks_wrote:
                    report.rows_written = _commit_task_files(final_df, staged, with_pred)
                else:
                    final_df.write.parquet(staged)
        except BaseException:
            discard(staged)
            raise
        with phases.phase("output commit"):
            swap_into_place(staged, out)
            result = read_parquet(spark, out)
    else:
        with guard(), phases.phase(label, quiet=True):
            result = final_df.localCheckpoint(eager=True)
    seconds = time.perf_counter() - started
    shuffle = meter.delta()
    report.steps.append(
        StepReport(label, seconds, shuffle, _read(timers) if timers else {}, report.final_layer, _peak(timers))
    )
    log.info(_progress(report.steps[-1], f" -> {out}" if out else ""))
    set_job_description(spark, None)
    return result
