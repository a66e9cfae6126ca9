"""`sparkgnn.infer`: exact batch inference of a trained model over a whole graph on Spark."""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from sparkgnn.engine import calibration, phases, pruned
from sparkgnn.engine.degrees import out_degree_histogram
from sparkgnn.engine.exchange import (
    EXCHANGES,
    exchange_kind,
    executors_share_this_disk,
    files_reach_every_task,
    fits_on_disk,
)
from sparkgnn.engine.executor import estimate_lines, estimate_vs_actual, execute, finish, staged_output
from sparkgnn.engine.failures import step_failures
from sparkgnn.engine.jvm import why_unavailable
from sparkgnn.engine.materialise import materialise_kind
from sparkgnn.engine.prepare import (
    ensure_layouts,
    ensure_out_stats,
    is_prepared,
    layout_writer,
    prepare,
    scans_in_tasks,
)
from sparkgnn.engine.pushdown import NEEDS_SPARK_ROWS, shuffle_partitions
from sparkgnn.engine.result import JobResult, legacy_positional, model_name, warn_return_report
from sparkgnn.engine.session import configure, mapped_memory_budget, memory_per_task
from sparkgnn.engine.spark_compat import default_parallelism
from sparkgnn.errors import GraphValidationError, LayerFailed, PlanError, SparkGNNError
from sparkgnn.files import absolute
from sparkgnn.graph.problems import MAX_EXAMPLES, Problem
from sparkgnn.outputs import check_output, discard
from sparkgnn.planner.pruning import WHOLE
from sparkgnn.runners import check_workers, workers_for
from sparkgnn.stat_keys import stat_keys

if TYPE_CHECKING:
    from typing import TypeAlias

    import torch
    from pyspark.sql import DataFrame, SparkSession

    from sparkgnn.graph import Graph
    from sparkgnn.messenger.local import LocalCluster
    from sparkgnn.models import Model
    from sparkgnn.planner.ir import Plan

    #: What `infer`, `precompute` and `refresh` accept as a graph: a Graph, a graph directory, or a
    #: GraphFrame (anything with .vertices and .edges DataFrames).
    GraphSource: TypeAlias = Graph | str | os.PathLike[str] | Any
    #: ... and as a model: a Model, a saved model directory or a PyTorch Geometric module.
    ModelSource: TypeAlias = Model | str | os.PathLike[str] | torch.nn.Module

#: infer's options in the previous release's positional order (legacy_positional maps them).
INFER_LEGACY_ORDER = (
    "out", "strategy", "partitions", "ids", "workers", "explain", "work_dir", "validate", "log",
    "return_report", "model_store", "overwrite", "exchange", "materialise", "prune",
)  # fmt: skip

log = logging.getLogger(__name__)


def coerce_graph(
    spark: SparkSession, graph: GraphSource, *, work_dir: str | None = None, validate: bool | None = None
) -> Graph:
    """A Graph, a graph directory, or anything GraphFrame-shaped (.vertices/.edges). A directory
    is validated as Graph.load does (`validate` None: unless graph.json vouches for it), after
    adopting what an earlier job in `work_dir` learnt about the same files (Graph.recall_facts:
    a directory another tool wrote is then neither validated nor fingerprinted again)."""
    from sparkgnn.engine.typed import refuse_typed_job
    from sparkgnn.graph import Graph

    if isinstance(graph, Graph):
        return graph
    refuse_typed_job(graph, None, "PE refresh")
    if isinstance(graph, (str, os.PathLike)):
        loaded = Graph.load(spark, os.fspath(graph), validate=False)
        if work_dir and loaded.recall_facts(work_dir):
            log.info(f"sparkgnn: graph {loaded.path}: validated and fingerprinted by an earlier job in {work_dir}")
        if validate is not False:
            loaded.validate(force=bool(validate))
        return loaded
    if hasattr(graph, "vertices") and hasattr(graph, "edges"):
        return Graph.from_graphframe(graph)
    raise SparkGNNError(
        f"cannot use {type(graph).__name__} as a graph: pass a sparkgnn.Graph, a graph directory or a GraphFrame"
    )


def coerce_model(model: ModelSource) -> Model:
    """A sparkgnn Model, a saved model path, or a PyTorch Geometric module. A typed model (or
    its directory) is refused in one line: `infer` and `precompute` run it before reaching here
    (engine.typed, engine.precompute_typed); refresh and model batching run homogeneous graphs only
    so far."""
    from sparkgnn.models import Model
    from sparkgnn.models.hetero import refuse_typed

    refuse_typed(os.fspath(model) if isinstance(model, os.PathLike) else model, "PE refresh and model batching")
    if isinstance(model, Model):
        return model
    if isinstance(model, (str, os.PathLike)):
        return Model.load(os.fspath(model))
    return Model.from_pyg(model)


def check_model_fits(graph, model) -> None:
    """The model's first layer must read the graph's feature width (checked before any Spark job,
    so a mismatch is one clear line, not a shape error inside a task)."""
    if graph.feature_dim != model.in_dim:
        raise SparkGNNError(f"the graph's features are {graph.feature_dim} wide but the model expects {model.in_dim}")
    # also a layer whose edge features its conversion could not tell (models/pyg_convs._gen)
    convs = model.conv_list() if hasattr(model, "conv_list") else []
    ambiguous = any(getattr(c, "ambiguous_edge_dim", None) for c in convs)
    if model.edge_attr_dim or ambiguous:
        try:
            model.check_edge_attr(getattr(graph, "edge_attr_dim", 0) or None, where=f"graph {graph.name!r}")
        except ValueError as e:
            raise SparkGNNError(str(e)) from None


def load_job_inputs(
    spark: SparkSession,
    graph: GraphSource,
    model: ModelSource,
    *,
    validate: bool = True,
    work_dir: str | None = None,
    defer_validation: bool = False,
) -> tuple[Graph, Model]:
    """The setup `infer` and `precompute` start from: the session configured, the graph and the
    model loaded, the graph validated (unless `validate` is False; a directory always unless its
    graph.json, or a record an earlier job left in `work_dir`, vouches for it) and the model
    checked to read the graph's feature width, all before any costly Spark job, so bad input fails
    in one line. `defer_validation`: a directory nothing vouches for (Graph.unvouched) is left
    unvalidated here, for prepare's tasks to validate and fingerprint in their own passes
    (engine.prepare.scans_in_tasks), or for the first step that needs it to validate as before."""
    configure(spark)
    with phases.phase("graph open"):
        loaded_graph = coerce_graph(spark, graph, work_dir=work_dir, validate=False)
    with phases.phase("model load"):
        loaded_model = coerce_model(model)
    deferred = defer_validation and loaded_graph.unvouched
    if (validate or isinstance(graph, (str, os.PathLike))) and not deferred:  # a directory: Graph.load's rule
        with phases.phase("graph validation"):
            loaded_graph.validate()
    with phases.phase("graph facts"):  # the feature width: graph.json's, validation's, or one row read
        try:
            check_model_fits(loaded_graph, loaded_model)
        except SparkGNNError:
            if deferred:  # a malformed graph is refused for what is wrong with it, as without deferral
                loaded_graph.validate()
            raise
    return loaded_graph, loaded_model


def input_paths(graph, model, work_dir: str | None) -> dict:
    """The paths a job reads or keeps, by the name an error should use: outputs never overlap them."""
    path = lambda obj: os.fspath(obj) if isinstance(obj, (str, os.PathLike)) else None  # noqa: E731
    return {"graph directory": path(graph) or getattr(graph, "path", None), "model": path(model), "work dir": work_dir}


WORK_DIR_CONF = "spark.sparkgnn.workDir"


def resolve_work_dir(spark, out: str | None, work_dir: str | None) -> str:
    """The work dir, absolute (files.absolute: tasks read and write under it). Given, else beside
    `out`, else `spark.sparkgnn.workDir`, else Spark's checkpoint dir; the driver's temp dir only
    where every executor shares this machine's disk (local and local-cluster masters): elsewhere the
    tasks would not find what the driver prepared there, so the job is refused instead."""
    if work_dir:
        return absolute(work_dir)
    if out:
        head, _sep, _name = absolute(out).rstrip("/").rpartition("/")
        return f"{head}/_sparkgnn_work"
    for conf in (WORK_DIR_CONF, "spark.checkpoint.dir"):
        configured = spark.conf.get(conf, None)
        if configured:
            return absolute(configured.rstrip("/") + ("/sparkgnn" if conf == "spark.checkpoint.dir" else ""))
    if not executors_share_this_disk(spark):
        master = spark.conf.get("spark.master", "") or ""
        raise SparkGNNError(
            f"on a cluster (master {master}) the work dir must be on a filesystem every executor reaches: "
            f"pass --work-dir (hdfs://..., s3a://... or a shared mount) or set {WORK_DIR_CONF}"
        )
    app = spark.conf.get("spark.app.id", None) or "local"
    return os.path.join(tempfile.gettempdir(), f"sparkgnn-{app}")


@dataclasses.dataclass(frozen=True)
class ChosenLayout:
    """What plan_for decides before it prepares: the model's layers as the planner reads them,
    the graph's sizes, the session's cores and memory per task, the work dir, and the partition
    count and concurrent tasks (planner.choose_layout)."""

    layers: list
    stats: dict
    cores: int
    task_memory: int
    root: str
    partitions: int
    tasks: int


def layout_for(
    spark,
    graph,
    model,
    partitions: int | None = None,
    *,
    out: str | None = None,
    work_dir: str | None = None,
    exchange: str = "shuffle",
    keep_states: bool = False,
    mapped_payloads: bool = False,
) -> ChosenLayout:
    """The partition count (and concurrent tasks) plan_for prepares `graph` for, with plan_for's
    arguments, without preparing: engine.typed_prepare prepares a round's relation layouts for
    the counts their jobs will ask for in one pass. A memory-bound layout counts the sources'
    out-degrees first (one Spark job)."""
    from sparkgnn import planner

    layers = model.plan_info()
    with phases.phase("graph statistics"):  # graph.json's or validation's counts, else the footers' or a count
        stats = graph.sizes()
    if keep_states:  # states are kept in the raw space (pe module doc): no transform-then-propagate either,
        # so every width the plan's operators name (pushdown's native aggregate reads it) is the raw one
        layers = [dict(layer, range_wise=False, can_pre_transform=False) for layer in layers]
    cores = default_parallelism(spark)
    task_memory = memory_per_task(spark)
    root = resolve_work_dir(spark, out, work_dir)

    serial = exchange == "files"  # a files-exchange task can serve several partitions in turn
    mapped_budget = mapped_memory_budget(spark) if mapped_payloads else None

    def layout_with(out_degrees=None) -> tuple[int, int]:
        return planner.choose_layout(
            layers,
            stats["num_vertices"],
            stats["num_edges"],
            graph.feature_dim,
            cores,
            task_memory,
            requested=partitions,
            out_degrees=out_degrees,
            mapped_payloads=mapped_payloads,
            mapped_budget_bytes=mapped_budget,
            serial_partitions=serial,
        )

    num_partitions, tasks = layout_with()
    if partitions is None and (num_partitions > cores or tasks < cores):  # memory bound: count the sources
        with phases.phase("out-degree histogram"):
            histogram = out_degree_histogram(graph, root)
        num_partitions, tasks = layout_with(histogram)
    return ChosenLayout(layers, stats, cores, task_memory, root, num_partitions, tasks)


def plan_for(
    spark,
    graph,
    model,
    strategy: str = "auto",
    partitions: int | None = None,
    work_dir: str | None = None,
    out: str | None = None,
    exchange: str = "shuffle",
    keep_states: bool = False,
    mapped_payloads: bool = False,
):
    """Prepare the graph for a partition count and compile the plan (no inference yet), costed
    with the constants measured for `exchange` (engine.exchange). `keep_states`: the job keeps
    every vertex's merged state (PE precompute), so no layer's state is range-wise in the memory
    rule (planner.partitions). `mapped_payloads`: the tasks read remote payloads from memory-mapped
    exchange files (files exchange, layers in-process), so the rule leaves them out."""
    from sparkgnn import planner

    chosen = layout_for(
        spark,
        graph,
        model,
        partitions,
        out=out,
        work_dir=work_dir,
        exchange=exchange,
        keep_states=keep_states,
        mapped_payloads=mapped_payloads,
    )
    layers, stats, cores, task_memory, root = chosen.layers, chosen.stats, chosen.cores, chosen.task_memory, chosen.root
    num_partitions, tasks = chosen.partitions, chosen.tasks
    writer = layout_writer(graph, exchange, shared_disk=files_reach_every_task(spark, root))
    if not scans_in_tasks(graph, writer):  # else prepare's tasks validate and fingerprint it as they read it
        if getattr(graph, "unvouched", False):  # load_job_inputs deferred it
            with phases.phase("graph validation"):
                graph.validate()
        with phases.phase("graph fingerprint"):  # graph.json's, an earlier job's, or one pass over the graph
            graph.fingerprint  # noqa: B018 - computed here so prepare's phase holds prepare alone
            graph.remember_facts(root)  # a directory graph.json does not vouch for: the next job skips both
    with phases.phase("prepare"):
        prepared = prepare(spark, graph, num_partitions, root, writer=writer)
    graph_stats = dict(prepared.stats, feature_dim=graph.feature_dim)
    task = {
        "strategy": strategy,
        "partitions": num_partitions,
        "cores": cores,
        "memory_per_task_bytes": task_memory,
        "ids": None,
        "fuse": True,
        "mapped_payloads": mapped_payloads,
        "concurrent_tasks": tasks,
        "native_aggregates": _native_aggregates(spark, exchange),
    }
    with phases.phase("plan"):
        cost_model, observations = calibration.load(root, cores, target_edges=stats["num_edges"], exchange=exchange)
        log.info(calibration.summary(cost_model, observations, root))
        plan = planner.compile(layers, graph_stats, task, cost_model)
    with phases.phase("prepare"):
        prepared = ensure_layouts(spark, graph, prepared, [layer.strategy for layer in plan.layers], writer=writer)
        # the out-edge statistics the convs read, on demand (engine.prepare's module doc)
        keys = stat_keys(model.conv_list())
        prepared = ensure_out_stats(spark, prepared, keys, writer=writer)
    return prepared, plan


def layer_pricer(spark, graph, model, partitions: int | None, root: str, exchange: str):
    """(seconds(num_vertices, num_edges), P for the whole graph): the compiled plan's estimate for
    running `model`'s layers over a graph of that size on this session, with the work dir's
    calibrated cost model (planner.pruning prices a pruned subgraph against the whole graph with it;
    the layouts are costed from counts alone, no prepare)."""
    from sparkgnn import planner

    layers = model.plan_info()
    cores = default_parallelism(spark)
    task_memory = memory_per_task(spark)
    stats = graph.stats()
    cost_model, _ = calibration.load(
        root, cores, target_edges=stats["num_edges"], exchange=exchange, warn_unreadable=False
    )

    def layout(num_vertices: int, num_edges: int) -> int:
        args = (layers, num_vertices, num_edges, graph.feature_dim, cores, task_memory)
        return planner.choose_layout(*args, requested=partitions)[0]

    def seconds(num_vertices: int, num_edges: int) -> float:
        count = layout(num_vertices, num_edges)
        graph_stats = {"num_vertices": num_vertices, "num_edges": num_edges, "feature_dim": graph.feature_dim}
        # "auto": a forced strategy may need statistics only a prepared layout has (mirror counts)
        task = {"strategy": "auto", "partitions": count, "cores": cores, "memory_per_task_bytes": task_memory}
        task.update(ids=None, fuse=True, native_aggregates=_native_aggregates(spark, exchange))
        plan = planner.compile(layers, dict(graph_stats, partitions=count), task, cost_model)
        return float(plan.estimates.get("seconds", 0.0))

    return seconds, layout(stats["num_vertices"], stats["num_edges"])


def _native_aggregates(spark, exchange: str):
    """task['native_aggregates'] for the planner: True when pushdown can run here, else why not."""
    if exchange != "shuffle":
        return f"the {exchange} exchange carries routed rows only; pushdown joins payloads in Spark (use the shuffle)"
    return why_unavailable(spark) or True


def _exchange_for(spark, requested: str, strategy: str, root: str) -> str:
    """The exchange a run uses: a strategy forced by name that needs Spark's rows (edge_join,
    pushdown) takes the shuffle when the exchange is left to auto; else exchange_kind decides."""
    if requested == "auto" and strategy in NEEDS_SPARK_ROWS:
        log.info(f"sparkgnn: strategy {strategy} joins payloads in Spark: routed rows go through Spark's shuffle")
        return "shuffle"
    return exchange_kind(spark, requested, root)


def _usable_exchange(kind: str, requested: str, plan, root: str) -> str:
    """The files exchange falls back to the shuffle (auto) or is refused (asked for by name) when
    the plan joins payloads onto edges or its largest step would not fit twice on the disk."""
    if kind != "files":
        return kind
    step_bytes = max((layer.estimates.get("shuffle_bytes", 0) for layer in plan.layers), default=0)
    fits, free = fits_on_disk(root, step_bytes)
    why = None
    joined = sorted({layer.strategy for layer in plan.layers} & NEEDS_SPARK_ROWS)
    if joined:
        why = f"the plan joins payloads onto edges in Spark ({', '.join(joined)})"
    elif not fits:
        why = (
            f"two steps of ~{step_bytes / 2**30:.1f} GiB of routed rows do not fit "
            f"in {free / 2**30:.1f} GiB free under {root}"
        )
    if why is None:
        return kind
    if requested == "files":
        raise SparkGNNError(f"exchange 'files' cannot be used: {why}; use 'shuffle'")
    log.info(f"sparkgnn: {why}: routed rows go through Spark's shuffle")
    return "shuffle"


@legacy_positional(INFER_LEGACY_ORDER)
def infer(
    spark: SparkSession,
    graph: GraphSource,
    model: ModelSource | Sequence[ModelSource],
    *,
    out: str | os.PathLike[str] | None = None,
    strategy: str = "auto",
    partitions: int | None = None,
    ids: Iterable[int] | DataFrame | Mapping[str, Iterable[int] | DataFrame] | None = None,
    workers: str | LocalCluster = "inprocess",
    explain: bool = False,
    work_dir: str | None = None,
    validate: bool = True,
    model_store: str | None = None,
    overwrite: bool = False,
    exchange: str = "auto",
    materialise: str = "auto",
    prune: str = "auto",
    types: Sequence[str] | None = None,
    return_report: bool | None = None,
    _legacy: bool = False,
) -> JobResult:
    """Exact embeddings/predictions of `model` for every vertex of `graph` (or the ones in `ids`).

    Returns a JobResult (engine.result): `.frame` is the DataFrame (id, h[, pred]) where h is the
    model's final output (float32 list) and pred its argmax when the model ends in a classifier;
    `.report` and `.plan` what the job cost and the plan it ran. With `out`, the result is also
    written there as Parquet:
    a non-empty `out` is refused unless `overwrite`, an `out` overlapping an input always, and the
    result is staged and swapped in at the end (sparkgnn.outputs), so a failed job loses nothing.
    `ids` (ids or a DataFrame with an `id` column) must be non-empty and name vertices of the graph.
    `workers`: where the layers run: "inprocess" (inside Spark's Python workers), "local[N]" (a
    broker + N standalone PyTorch workers started for this job), "tcp://host:port" (a running
    broker; its workers' --model-store must be `model_store`), or a started LocalCluster.
    `exchange`: how routed rows travel between layer steps (engine.exchange): "shuffle" (Spark's),
    "files" (Arrow files in the work dir, written and read by the tasks), or "auto" (files where
    every executor shares the work dir's local disk).
    `materialise`: how the shuffle exchange keeps a step's output (engine.materialise): "local"
    (localCheckpoint: lost with its executor), "reliable" (Parquet in the work dir: survives a lost
    executor, and a rerun with the same work dir resumes after the last committed step), or "auto"
    (local for a local[...] master, reliable on a cluster). The files exchange always keeps its
    steps in the work dir.
    `prune` (with `ids`): how the ids' k-hop upstream frontier is used (engine.pruned,
    planner.pruning): "auto" prices running only the frontier on the driver ("local"), the engine
    over the pruned subgraph ("subgraph") or the whole graph filtered ("whole") and takes the
    cheapest; a mode by name forces it (refused with the reason when it cannot apply); "off" runs
    the whole graph without computing the frontier.
    `model` may be a list of models (each as above): they run batched, sharing the graph's data
    movement, and the result holds one DataFrame per model, in order, in `frames` (engine.batching;
    with `out`, model NAME's result goes to out/NAME, NAME = the saved model's directory name or
    model_<i>).
    `graph`: a Graph, a graph directory or a GraphFrame; `model`: a Model, a saved model directory
    or a PyTorch Geometric module (Model.from_pyg). Every option after `model` is keyword-only;
    the previous release's positional options and `return_report=` still work, with a
    DeprecationWarning, and return what they returned then (engine.result.legacy_positional).
    A typed graph (a TypedGraph or a typed graph directory) runs a typed model (a HeteroModel or
    its directory; engine.typed): `frames` is keyed by output node type (with `out`, type T's
    result goes to out/T), and `types` names the output types to compute (default: all the
    model's), each round computing only what those need; `ids` there is a dict {node type: ids}
    (each round computing only the rows those need, engine.typed_ids).
    """
    from sparkgnn.engine.typed import infer_typed, is_typed_source

    if is_typed_source(graph) or (not isinstance(model, (list, tuple)) and is_typed_source(model)):
        _refuse_typed_options(model, legacy=_legacy or return_report is not None)
        _checked_prune(prune)
        with phases.job_clock() as clock:
            typed_options: dict[str, Any] = dict(strategy=strategy, partitions=partitions, workers=workers)
            typed_options.update(explain=explain, validate=validate, model_store=model_store)
            typed_options.update(exchange=exchange, materialise=materialise, ids=ids, prune=prune)
            typed = infer_typed(
                spark,
                graph,
                model,
                out=os.fspath(out) if out is not None else None,
                types=types,
                work_dir=work_dir,
                overwrite=overwrite,
                **typed_options,
            )
        return dataclasses.replace(typed, phases=clock.summary())
    if types is not None:
        raise SparkGNNError("types= names node types of a typed graph; this graph has one vertex type")
    if isinstance(ids, Mapping):
        raise SparkGNNError("ids as a dict {node type: ids} is for typed graphs; this graph has one vertex type")
    if return_report is not None:
        warn_return_report("infer")
    options: dict[str, Any] = dict(strategy=strategy, partitions=partitions, ids=ids, workers=workers)
    options.update(explain=explain)
    options.update(validate=validate, model_store=model_store, exchange=exchange, materialise=materialise, prune=prune)
    out = os.fspath(out) if out is not None else None
    many = isinstance(model, (list, tuple))
    with phases.job_clock() as clock:
        if isinstance(model, (list, tuple)):
            from sparkgnn.engine.batching import infer_models

            result = infer_models(spark, graph, model, out=out, work_dir=work_dir, overwrite=overwrite, **options)
        else:
            frame, report, plan = _infer_one(
                spark, graph, cast("ModelSource", model), out=out, work_dir=work_dir, overwrite=overwrite, **options
            )
            name = model_name(model)
            result = JobResult({name: frame}, {name: report}, {name: plan})
        result = dataclasses.replace(result, phases=clock.summary())
    if _legacy or return_report is not None:
        return result.legacy(as_list=many, with_report=bool(return_report))
    return result


def _infer_one(
    spark: SparkSession,
    graph: GraphSource,
    model: ModelSource,
    *,
    out: str | None = None,
    strategy: str = "auto",
    partitions: int | None = None,
    ids: Iterable[int] | DataFrame | None = None,
    workers: str | LocalCluster = "inprocess",
    explain: bool = False,
    work_dir: str | None = None,
    validate: bool = True,
    model_store: str | None = None,
    overwrite: bool = False,
    exchange: str = "auto",
    materialise: str = "auto",
    prune: str = "auto",
    ids_checked: bool = False,
) -> tuple[DataFrame, Any, Plan]:
    """`infer` for one model: (DataFrame, RunReport, Plan); also what a pruned run (engine.pruned)
    calls for the subgraph it runs. `ids_checked`: the caller derived `ids` from checked vertex
    ids (a pruned run's subgraph, a typed relation's rows from engine.typed_ids' walk), so the
    join that checks them against the vertices is not run again."""
    from sparkgnn.dl.model_store import register

    with phases.phase("input checks"):
        check_workers(workers)  # a typo fails in a second, not after preparing the graph
        _checked_prune(prune)
        out = absolute(out) if out else out  # tasks write the output parts: not relative to their cwd
        model_store = absolute(model_store) if model_store else model_store
        root = resolve_work_dir(spark, out, work_dir)
        if out:
            check_output(out, input_paths(graph, model, root), overwrite)
    # without ids, a directory nothing vouches for is validated by prepare's own tasks (plan_for)
    graph, model = load_job_inputs(spark, graph, model, validate=validate, work_dir=root, defer_validation=ids is None)
    with phases.phase("requested ids"):
        if ids is None:
            ids_df = None
        else:
            ids_df = _ids_frame(spark, ids).cache() if ids_checked else checked_ids(spark, graph, ids)
    kind = _exchange_for(spark, exchange, strategy, root)
    pruning = {}
    if ids_df is not None and model.edge_attr_dim and prune not in ("off", WHOLE):
        # the pruned runs (driver-local frontier, pruned subgraph) carry no edge attributes yet
        if prune != "auto":
            raise SparkGNNError(
                f"prune={prune!r} does not carry edge features yet; the model reads edge_attr "
                "(use prune='auto' or 'whole')"
            )
        log.info("sparkgnn: the model reads edge features, so --ids runs the whole graph and keeps the ids' rows")
        prune = "off"
    if ids_df is not None and prune != "off":
        with phases.phase("pruning: frontier and choice"):
            pricer, whole_partitions = layer_pricer(spark, graph, model, partitions, root, kind)
            ctx = pruned.choose(
                spark, graph, model, ids_df, prune, pricer, is_prepared(graph, whole_partitions, root), strategy
            )
        if ctx.choice.mode != WHOLE:
            again = dict(strategy=strategy, partitions=partitions, workers=workers, work_dir=root, ids_checked=True)
            again.update(model_store=model_store, overwrite=overwrite, exchange=exchange, materialise=materialise)
            run = pruned.RUNS.lookup(ctx.choice.mode)
            with phases.phase(f"pruned run ({ctx.choice.mode})"):  # a subgraph's engine phases are its own
                result, report, plan = run(ctx, out, infer=_infer_one, infer_kwargs=again)
            if explain:
                log.info(plan.explain())
            return result, report, plan
        pruning = ctx.choice.summary()
    mapped = kind == "files" and workers == "inprocess"  # remote payloads stay in mapped files
    prepared, plan = plan_for(
        spark, graph, model, strategy, partitions, work_dir=root, exchange=kind, mapped_payloads=mapped
    )
    usable = _usable_exchange(kind, exchange, plan, root)
    if usable != kind and mapped:  # P was chosen for payloads in files: plan again for the shuffle
        prepared, plan = plan_for(spark, graph, model, strategy, partitions, work_dir=root, exchange=usable)
    kind = usable
    plan.pruning = pruning
    if explain:
        log.info(plan.explain())
    model_store = model_store or os.path.join(root, "models")
    with phases.phase("model store"):
        fingerprint = register(model, model_store)
    needs_dst = [bool(info["needs_dst_in_message"]) for info in model.plan_info()]
    with phases.phase("workers start"):
        runners = workers_for(workers, model_store)
    with_pred = model.output == "logits"
    # Tasks write the output files themselves unless rows must first be filtered by ids (a join).
    staged = staged_output(out) if out and ids_df is None else None
    route = EXCHANGES[kind](root, plan.partitions, plan.concurrent_tasks, materialise_kind(spark, materialise))
    keep = False
    try:
        with shuffle_partitions(spark, plan), phases.phase("steps: driver between steps"):
            final_df, report, meter, label, timers = execute(
                spark,
                prepared,
                plan,
                fingerprint,
                graph,
                runners.spec,
                with_pred=with_pred,
                needs_dst=needs_dst,
                write_to=staged,
                exchange=route,
                stats=stat_keys(model.conv_list()),
            )
            if ids_df is not None:
                final_df = final_df.join(ids_df, "id", "left_semi")
            result = finish(
                spark,
                final_df,
                report,
                meter,
                label,
                out,
                timers=timers,
                staged=staged,
                with_pred=with_pred,
                guard=lambda: step_failures(label, route, True, report.labels.__getitem__),
            )
            for line in estimate_lines(estimate_vs_actual(report, plan)):
                log.info(line)
            with phases.phase("calibration record"):
                calibration.record(
                    root, default_parallelism(spark), plan, report.seconds_by_plan_layer(), exchange=kind
                )
    except BaseException as exc:
        if staged is not None:
            discard(staged)
        keep = isinstance(exc, LayerFailed) and exc.run_path is not None  # a rerun resumes from it
        raise
    finally:
        with phases.phase("cleanup (exchange files, workers)"):
            if route.close(keep):
                log.info(f"sparkgnn: kept the committed steps in {route.run.path} for a rerun to resume from")
            runners.close()
    return result, report, plan


def _refuse_typed_options(model, *, legacy: bool) -> None:
    """What a typed run does not take yet, refused in one line before any Spark job."""
    if isinstance(model, (list, tuple)):
        raise SparkGNNError("a typed graph runs one typed model per job, not a list of models")
    if legacy:
        raise SparkGNNError("a typed graph returns a JobResult only: pass options by keyword, without return_report")


def _checked_prune(prune: str) -> str:
    from sparkgnn.planner.pruning import PRUNE_CHOICES

    if prune not in PRUNE_CHOICES:
        raise SparkGNNError(f"unknown prune mode {prune!r}; choose one of {', '.join(PRUNE_CHOICES)}")
    return prune


def _ids_frame(spark, ids):
    if hasattr(ids, "columns"):
        if "id" not in ids.columns:
            raise PlanError("the ids DataFrame needs an 'id' column")
        return ids.selectExpr("cast(id as long) as id").distinct()
    values = sorted({int(i) for i in ids})
    if not values:
        raise PlanError("ids is empty: nothing to infer (pass ids=None to infer every vertex)")
    return spark.createDataFrame([(v,) for v in values], "id long")


LOCAL_IDS_CHECKED = 1 << 20  # ids given in memory up to this many: checked against the vertices in one job


def checked_ids(spark, graph, ids):
    """The requested ids as a DataFrame, refused when empty or when any is not a vertex id (a
    silent partial answer is worse than an error): count + first offenders, like graph checks.
    Ids given in memory (a sequence, up to LOCAL_IDS_CHECKED) are checked in one Spark job: the
    vertices that are requested, found by a semi-join with the ids broadcast (no shuffle of the
    vertex table, no job to see the ids are there); an ids DataFrame by an anti-join."""
    if not hasattr(ids, "columns"):
        values = sorted({int(i) for i in ids})
        if len(values) <= LOCAL_IDS_CHECKED:
            return _checked_local_ids(spark, graph, values)
    frame = _ids_frame(spark, ids).cache()
    if frame.limit(1).count() == 0:
        raise PlanError("ids is empty: nothing to infer (pass ids=None to infer every vertex)")
    unknown = frame.join(graph.vertices.select("id"), "id", "left_anti")
    first = [row.id for row in unknown.orderBy("id").limit(MAX_EXAMPLES).collect()]
    if first:
        count = unknown.count() if len(first) == MAX_EXAMPLES else len(first)
        raise GraphValidationError(
            f"graph {graph.name}: " + Problem("unknown_id", count, tuple(str(i) for i in first)).message()
        )
    return frame


def _checked_local_ids(spark, graph, values: list[int]):
    """checked_ids for distinct sorted ids in memory (one Spark job)."""
    if not values:
        raise PlanError("ids is empty: nothing to infer (pass ids=None to infer every vertex)")
    frame = spark.createDataFrame([(v,) for v in values], "id long")
    found = graph.vertices.selectExpr("cast(id as long) as id").join(frame.hint("broadcast"), "id", "left_semi")
    known = {int(row.id) for row in found.collect()}
    unknown = [v for v in values if v not in known]
    if unknown:
        first = tuple(str(i) for i in unknown[:MAX_EXAMPLES])
        raise GraphValidationError(f"graph {graph.name}: " + Problem("unknown_id", len(unknown), first).message())
    return frame
