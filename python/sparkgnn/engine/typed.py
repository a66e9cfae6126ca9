"""Batch inference of a typed model (models/hetero.py) over a typed graph (graph/typed_spark.py).

One typed round is run as, for every relation (src type, relation, dst type) of the round:

    the relation's graph   vertices: the source type's rows and the destination type's rows,
                           edges: the relation's (src, dst), without weights (PyG's typed
                           forward reads edge_index_dict only)
    the relation's model   a homogeneous Model of that relation's conv alone
    the homogeneous engine (`_infer_one`: prepare, planner, executor steps, strategies) over it

then the per-relation outputs of every destination type are merged with the round's
cross-relation aggregation (sum, mean over the relations into the type, max, min, or HGT's
softmax over the relations' partial softmax states) and the per-type node ops applied, in one
pass for the whole round (engine.typed_merge). The relation jobs' layouts are prepared
beforehand, the base layouts of all of a round's relations in one pass of prepare's tasks over
the relations' own folders, round 0's while its
inputs are computed (engine.typed_prepare), and the jobs themselves then run side by side on
driver threads too, their outputs taken in the relation order (engine.typed_jobs).

WHY every relation is an ordinary homogeneous job: the conv is the homogeneous layer (the same
weights, the same exactness tests), so reusing the whole engine keeps every strategy, the cost
model and the exchange exact for typed graphs without a second executor. A relation within one
type IS a homogeneous graph (self loops, node statistics, multi-pass layers all apply). A relation
between two types becomes a graph over both types' rows, source ids mapped to 2*id and destination
ids to 2*id+1 (disjoint, so a type's ids may overlap the other's; ids must lie within +-2^62, else
the job fails naming the type), with edges only from sources to
destinations: a destination's aggregate reads its source-type neighbours only and its root term
its own row, which is the bipartite conv (HeteroRound refuses the layers for which it is not:
self loops, node statistics, several passes). Each relation's output is checkpointed by its job
and each round's merged values are written as Parquet in the work dir, so a round's lineage never
grows with the model's depth.

A node type whose table has no features gets a constant column of ones of the width the model
reads (what PyG users feed such a type: `torch.ones(n, 1)`), its input ops applied once on the
driver (engine.typed_merge.constant_rows).

Input ops: WHY a type's input ops (a per-type Linear, ...) run inside the relation jobs: the first
round's input values are left lazy (no Spark job per type computes and writes them), so the ops
run in the tasks of each relation job's first step that read the type's rows, on the rows they
read (engine.typed_merge.apply_node_ops), and a featureless type's constant is a literal column
Spark fills in while it reads the ids. A type read by k relations has its ops applied k times:
row-wise ops on rows a task reads anyway, against a separate job per type that reads, converts
and writes every row and is read back by those k jobs. Nor do the relation jobs read their types'
files by the files exchange's feature scan (as a homogeneous graph directory's are): that is one
more Spark job in each of a round's relation jobs, and a type stored as one file is read by one
task, so the first round came out slower than through Spark's rows. `types` restricts the job to the
rounds' upstream of those output types: a round computes only the destination types a later round
(or the output) reads. `ids` ({node type: ids}) goes further, to the rows: engine.typed_ids walks
the rounds back from the requested (type, id) pairs to the rows each round must give, each
relation's graph is cut to those rows (between two types the in-edges of the rows it gives,
within one type the edges among the rows it reads) and the relation job gets the rows it gives
as its own `ids`, which the homogeneous engine's k-hop pruning (engine.pruned) runs on the driver,
as a pruned subgraph or over the cut graph, as it prices them. With prune "auto" or "local", a
request whose model recomputes a row from its in-edges alone and whose typed frontier fits the
driver runs on the driver instead, no relation job at all (engine.typed_local: a few Spark jobs
gather the frontier, typed serving's local rounds compute the requested rows).

The fixed cost of a relation job: WHY a whole-graph relation's graph carries a fingerprint derived
from the typed graph's and the relation (not computed from its rows): computing a content
fingerprint is two Spark passes over the relation's rows in every relation job, and what is keyed
by the graph fingerprint alone (engine.prepare's layout: ids, edges and their statistics; the
planner takes the feature width from the graph, not from the layout) depends on the relation's ids
and edges only, which the typed graph's fingerprint covers. So a relation's layout is prepared once
and reused by the same relation in every later round, and by later jobs over the same graph. The
rows do change with the round: the relation's one-conv model names the typed model's fingerprint
and the round in its spec, so the executor's run key (graph and model fingerprints) tells the
rounds' runs apart and a kept run folder is resumed only by the same round of the same model. A
relation of a pruned (`ids`) run keeps its content fingerprint: its rows depend on the request.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from sparkgnn.engine.phases import phase
from sparkgnn.engine.typed_jobs import run_relation_jobs
from sparkgnn.engine.typed_merge import apply_node_ops, constant_rows, merge_round
from sparkgnn.engine.typed_prepare import Prepares, prepare_relations, start_prepares
from sparkgnn.engine.typed_relations import relation_jobs
from sparkgnn.errors import SparkGNNError, UnsupportedModelError
from sparkgnn.files import absolute
from sparkgnn.layers.hetero import EdgeType, HeteroRound, edge_key
from sparkgnn.layers.nodeops import NodeOpStack
from sparkgnn.parquet_read import read_parquet

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from sparkgnn.engine.result import JobResult
    from sparkgnn.engine.typed_ids import IdSet
    from sparkgnn.graph.typed_spark import TypedGraph
    from sparkgnn.models.hetero import HeteroModel

log = logging.getLogger(__name__)

#: The folder of the work dir that holds a typed run's per-relation and per-round values.
RUN_FOLDER = "typed_runs"


def is_typed_source(obj: Any) -> bool:
    """Whether a graph or model argument is typed: a TypedGraph / HeteroModel, or the directory of one."""
    from sparkgnn.graph.typed_spark import TypedGraph
    from sparkgnn.models.hetero import HeteroModel, is_typed_spec

    if isinstance(obj, (TypedGraph, HeteroModel)):
        return True
    if not isinstance(obj, (str, os.PathLike)):
        return False
    path = os.fspath(obj)
    from sparkgnn.graph.typed_io import is_typed_graph_dir

    try:
        if is_typed_graph_dir(path):
            return True
    except (OSError, ValueError):
        pass
    import json

    from sparkgnn import files
    from sparkgnn.models.serialization import MANIFEST

    try:
        return is_typed_spec(json.loads(files.read_bytes(files.join(path, MANIFEST))).get("spec"))
    except (OSError, ValueError, AttributeError):
        return False


def refuse_typed_job(graph: Any, model: Any, job: str) -> None:
    """Refuse (UnsupportedModelError, one line) a typed graph or model given to `job`, a job that
    runs homogeneous graphs only (PE refresh)."""
    if is_typed_source(graph) or is_typed_source(model):
        raise UnsupportedModelError(
            f"{job}: typed graphs and models are not supported yet (they run with sparkgnn.infer, "
            "sparkgnn.precompute, pe.refresh.refresh_local and serving.typed.TypedQueryEngine)"
        )


def _coerce(spark, graph, model, validate: bool) -> tuple[TypedGraph, HeteroModel]:
    """The typed graph (a directory is validated unless its graph.json vouches for it; a
    TypedGraph when `validate`) and the typed model (a PyG module converted for the graph's
    metadata), the model's metadata checked against the graph's."""
    from sparkgnn.graph.typed_spark import TypedGraph
    from sparkgnn.models.hetero import HeteroModel

    if isinstance(graph, (str, os.PathLike)):
        from sparkgnn.graph.typed_io import is_typed_graph_dir

        if not is_typed_graph_dir(os.fspath(graph)):
            raise UnsupportedModelError(
                f"graph directory {os.fspath(graph)} is homogeneous but the model is typed (node and edge types)"
            )
        graph = TypedGraph.load(spark, os.fspath(graph))  # validated unless graph.json vouches for it
    elif not isinstance(graph, TypedGraph):
        raise UnsupportedModelError(
            f"a typed model runs on a typed graph (a TypedGraph or a typed graph directory), not {type(graph).__name__}"
        )
    elif validate:
        graph.validate()
    if isinstance(model, (str, os.PathLike)):
        if not is_typed_source(model):
            raise UnsupportedModelError(f"model {os.fspath(model)} is homogeneous but the graph is typed")
        model = HeteroModel.load(os.fspath(model))
    elif not isinstance(model, HeteroModel):
        import torch

        if not isinstance(model, torch.nn.Module) or type(model).__module__.startswith("sparkgnn."):
            raise UnsupportedModelError(
                f"a typed graph runs a typed model (a HeteroModel, its directory or a PyG to_hetero / "
                f"HeteroConv module), not {type(model).__name__}"
            )
        model = HeteroModel.from_pyg(model, graph.metadata())  # a PyG typed module, for this graph's types
    model.check_metadata(graph.metadata(), where=f"graph {graph.name!r}")
    _check_widths(graph, model)
    return graph, model


def _check_widths(graph: TypedGraph, model: HeteroModel) -> None:
    """Refuse (UnsupportedModelError, one line) a model that reads other feature widths than the
    graph's, before any relation runs (graph.json's widths: no Spark job when it vouches for
    them). A type without features passes: the job gives it the constant column the model reads."""
    wrong = []
    for t in graph.metadata()[0]:
        have, want = _feature_width(graph, t), model.in_dims.get(t)
        if have and want is not None and have != want:
            wrong.append(f"node type {t!r}: the graph's features are {have} wide but the model expects {want}")
    if wrong:
        raise UnsupportedModelError(f"the model does not fit graph {graph.name!r}'s feature widths: {'; '.join(wrong)}")


def needed_types(model: HeteroModel, types: Sequence[str] | None) -> list[set[str]]:
    """Per round, the types whose value that round must give: the requested output types for the
    last round, then, going back, every type a kept round's relations and keep ops read."""
    wanted = list(model.outputs) if not types else list(types)
    unknown = [t for t in wanted if t not in model.outputs]
    if unknown:
        raise SparkGNNError(f"types {unknown} are not outputs of the model (it gives {model.outputs})")
    rounds = model.round_list()
    need: list[set[str]] = [set() for _ in rounds]
    current = set(wanted)
    for index in range(len(rounds) - 1, -1, -1):
        rnd = rounds[index]
        need[index] = current & set(rnd.out_types)
        reads: set[str] = set()
        for s, _, d in rnd.edge_types:
            if d in need[index]:
                reads |= {s, d}
        reads |= {t for t in rnd.keep if t in need[index]}
        current = reads
    return need


def _feature_width(graph: TypedGraph, node_type: str) -> int:
    meta = (graph.meta.get("types") or {}).get(node_type, {})
    if "feature_dim" in meta:
        return int(meta["feature_dim"])
    row = graph.vertices[node_type].where("x IS NOT NULL").selectExpr("size(x) AS f").first()
    return int(row.f) if row else 0


def infer_typed(
    spark: SparkSession,
    graph: Any,
    model: Any,
    *,
    out: str | None = None,
    types: Sequence[str] | None = None,
    ids: Mapping[str, Any] | None = None,
    strategy: str = "auto",
    partitions: int | None = None,
    workers: Any = "inprocess",
    explain: bool = False,
    work_dir: str | None = None,
    validate: bool = True,
    model_store: str | None = None,
    overwrite: bool = False,
    exchange: str = "auto",
    materialise: str = "auto",
    prune: str = "auto",
) -> JobResult:
    """Exact outputs of a typed model for every vertex of its output types (or of `types`): a
    JobResult whose frames are keyed by node type, each (id, h[, pred]); with `out`, type T's
    result is also written as Parquet to out/T (staged, then swapped in). Reports and plans are
    keyed `<round>:<relation key>` per relation run. `ids` ({node type: ids or a DataFrame with
    an `id` column}, instead of `types`): only those rows, on the driver when they fit it
    (engine.typed_local, prune "auto" or "local"), else each relation job pruned to what they
    need (module doc) with `prune` (engine.api.infer's modes); an unknown type or id is refused
    in one line before any relation runs.
    `explain`: each relation's plan is logged as it is made, and a table of every relation's
    strategies, size and estimated against measured seconds at the end (explain_relations)."""
    from sparkgnn.engine.api import input_paths, resolve_work_dir
    from sparkgnn.engine.result import JobResult
    from sparkgnn.engine.session import configure
    from sparkgnn.engine.typed_ids import SparkIdSets, requested_sets, walk
    from sparkgnn.outputs import check_output, discard

    if ids is not None and types:
        raise SparkGNNError("pass ids= or types= on a typed graph, not both (the ids' keys name their types)")
    configure(spark)
    out = absolute(out) if out else None
    root = resolve_work_dir(spark, out, work_dir)
    if out:
        check_output(out, input_paths(graph, model, root), overwrite, holds_others=True)
    with phase("typed graph and model: opened and checked"):
        graph, model = _coerce(spark, graph, model, validate)
    if ids is not None and prune in ("auto", "local"):
        local = _local_run(spark, graph, model, ids, out=out, overwrite=overwrite, root=root, explain=explain)
        if local is not None:
            return local
    id_sets = SparkIdSets(lambda edge_type: graph.edges[edge_type])
    rows: list[dict[str, IdSet]] | None = None
    if ids is not None:
        try:
            with phase("typed ids: checked and walked back through the rounds"):
                requested = requested_sets(spark, graph, ids, id_sets)
                rows = walk(model, requested, id_sets)
        except BaseException:
            id_sets.release()
            raise
        # a type none of whose rows a later round reads (the walk found no in-neighbour of the
        # rows it gives) is not computed: its relations would run on no rows; _run_round gives
        # it no rows, so a relation reading it as its source side sees none (no edges from it)
        need = [{t for t, level_ids in level.items() if level_ids.size} for level in rows[1:]]
        outputs = [t for t in model.outputs if t in requested]
    else:
        need = needed_types(model, types)
        outputs = list(types) if types else list(model.outputs)
    if out:
        for t in outputs:
            check_output(os.path.join(out, t), input_paths(graph, model, root), overwrite)
    run_dir = f"{root.rstrip('/')}/{RUN_FOLDER}/{uuid.uuid4().hex}"
    reports: dict[str, Any] = {}
    plans: dict[str, Any] = {}
    common = dict(strategy=strategy, partitions=partitions, workers=workers, explain=explain, work_dir=root)
    common.update(validate=False, model_store=model_store, exchange=exchange, materialise=materialise)
    if ids is not None:
        common["prune"] = prune  # each relation job's own k-hop pruning (module doc)

    # round 0's inputs: the types the first round reads, with their pre ops
    first = model.round_list()[0]
    reads = {t for s, _, d in first.edge_types if d in need[0] for t in (s, d)} | (set(first.keep) & need[0])
    with phase("typed graph and model fingerprints"):  # graph.json's, else a pass over the graph
        fingerprints = (None if rows is not None else graph.fingerprint, model.fingerprint())
    widths = {
        t: cast(NodeOpStack, model.pre_ops[t]).out_dim(w) if t in model.pre_ops else w for t, w in model.in_dims.items()
    }
    early = Prepares([], 0)
    try:
        if rows is None:  # round 0's layouts are prepared while its inputs are computed (typed_prepare)
            with phase("typed round 0: relation layouts, started"):
                ids_only = {t: graph.vertices[t].selectExpr("id", "CAST(NULL AS array<float>) AS h") for t in reads}
                jobs = relation_jobs(
                    graph, first, 0, need[0], ids_only, widths, common, rows=None, fingerprints=fingerprints
                )
                early = start_prepares(spark, [(job[2], job[3]) for job in jobs], common, 0)
        with phase("typed inputs: features and input ops per type"):
            values = _inputs(graph, model, reads, rows[0] if rows is not None else None)
        early.wait()
        for index, rnd in enumerate(model.round_list()):
            values = _run_round(
                spark,
                graph,
                rnd,
                index,
                need[index],
                values,
                widths,
                run_dir,
                common,
                reports,
                plans,
                rows=(rows[index], rows[index + 1]) if rows is not None else None,
                fingerprints=fingerprints,
            )
            widths = rnd.out_dims(widths, index)
        with phase("typed outputs: written per type"):
            frames = _outputs(spark, model, values, outputs, out)
    finally:
        with phase("typed cleanup: run folder and id sets"):
            early.close()
            discard(run_dir)
            id_sets.release()
    if explain:
        log.info(explain_relations(plans, reports))
    return JobResult(frames, reports, plans)


def _local_run(
    spark, graph: TypedGraph, model: HeteroModel, ids: Mapping[str, Any], *, out, overwrite, root, explain
) -> JobResult | None:
    """The request answered on the driver (engine.typed_local): the typed frontier gathered in a
    few Spark jobs and the rounds run locally, the outputs written as a relation run's are; None
    when the model or the frontier's size rules it out (the relation jobs then run it)."""
    from sparkgnn.engine import typed_local
    from sparkgnn.engine.api import input_paths
    from sparkgnn.engine.result import JobResult
    from sparkgnn.outputs import check_output

    why = typed_local.why_not_local(model)
    if why is not None:
        log.info(f"sparkgnn: {why}")
        return None
    with phase("typed ids: frontier and rows gathered to the driver"):
        frontier = typed_local.collect(spark, graph, model, ids)
    if frontier is None:
        return None
    outputs = [t for t in model.outputs if t in frontier.requested]
    if out:
        for t in outputs:
            check_output(os.path.join(out, t), input_paths(graph, model, root), overwrite)
    with phase("typed local rounds on the driver"):
        frames, report, plan = typed_local.run(spark, model, frontier)
    with phase("typed outputs: written per type"):
        if out:
            frames = _outputs(spark, model, frames, outputs, out)
        else:  # the driver's rows already: nothing to checkpoint
            frames = {t: _with_pred(model, frames[t]) for t in outputs}
    if explain:
        log.info(typed_local.explain(frontier, report))
    return JobResult(frames, {typed_local.LOCAL_KEY: report}, {typed_local.LOCAL_KEY: plan})


def _inputs(
    graph: TypedGraph, model: HeteroModel, reads: set[str], rows: dict[str, IdSet] | None
) -> dict[str, DataFrame]:
    """The first round's input rows per type it reads: the graph's features (ones for a type
    without features, module doc) through the type's pre ops; with `rows` (a pruned run), only
    those rows of each type. Lazy, no Spark job here (module doc, "Input ops")."""
    values: dict[str, DataFrame] = {}
    for t in sorted(reads):
        width = model.in_dims[t]
        have = _feature_width(graph, t)
        frame = graph.vertices[t].selectExpr("id", "x AS h")
        if rows is not None:
            frame = frame.join(rows[t].frame, "id", "left_semi")
        stack = cast(NodeOpStack, model.pre_ops[t]) if t in model.pre_ops else None
        if have == 0 and width != 0:
            log.info(f"sparkgnn: node type {t!r} has no features: it is given a constant column of {width} ones")
            frame = constant_rows(frame, width, stack)  # its input ops applied once, on the driver
        elif have != width:
            raise SparkGNNError(f"node type {t!r}: the graph's features are {have} wide but the model expects {width}")
        elif stack is not None:
            frame = apply_node_ops(frame, stack)  # in the tasks of the relation jobs that read it
        values[t] = frame
    return values


def _outputs(spark, model: HeteroModel, values: dict[str, DataFrame], outputs: list[str], out: str | None):
    """The output types' frames (id, h[, pred]); with `out`, each written to out/<type> (staged,
    then swapped in) and read back, else checkpointed before the run folder is removed."""
    from sparkgnn.outputs import discard, staging_path, swap_into_place

    frames: dict[str, DataFrame] = {}
    for t in outputs:
        frame = _with_pred(model, values[t])
        if out:
            target = os.path.join(out, t)
            staged = staging_path(target)
            try:
                frame.write.parquet(staged)
            except BaseException:
                discard(staged)
                raise
            swap_into_place(staged, target, job="batch_inference")
            frame = read_parquet(spark, target)
            log.info(f"sparkgnn: typed output {t!r} -> {target}")
        else:
            frame = frame.localCheckpoint(eager=True)
        frames[t] = frame
    return frames


def _with_pred(model: HeteroModel, frame: DataFrame) -> DataFrame:
    """(id, h), with pred (the argmax of h) when the model ends in a classifier."""
    if model.output == "logits":
        return frame.selectExpr("id", "h", "CAST(array_position(h, array_max(h)) - 1 AS LONG) AS pred")
    return frame


def explain_relations(plans: Mapping[str, Any], reports: Mapping[str, Any]) -> str:
    """One line per relation run (`<round>:<relation key>`): the conv, the strategy of each
    engine layer and the partitions, what it ran over (the whole relation graph's vertices and
    edges, or with ids the pruning mode and the frontier's vertices and in-edges per hop), the
    planner's estimate and the measured seconds (steps plus prepare)."""
    lines = [f"== sparkgnn typed plan: {len(plans)} relation run(s) =="]
    for key, plan in plans.items():
        report = reports.get(key)
        stats = plan.graph_stats or {}
        pruning = plan.pruning or {}
        kinds = sorted({layer.kind for layer in plan.layers if layer.kind})
        if pruning:
            over = (
                f"{pruning.get('mode')} pruning, frontier {pruning.get('vertices')} vertices, "
                f"{pruning.get('in_edges')} in-edges"
            )
        else:
            over = (
                f"whole relation graph, {stats.get('num_vertices', '?')} vertices, {stats.get('num_edges', '?')} edges"
            )
        estimate = plan.estimates.get("seconds")
        if estimate is None:
            estimate = sum(layer.estimates.get("seconds", 0.0) for layer in plan.layers)
        measured = "-"
        if report is not None:
            measured = f"{sum(report.seconds_by_layer().values()) + report.prepare_s:.2f} s"
            if report.prepare_reused:
                measured += " (layout reused)"
        lines.append(
            f"{key}: {'/'.join(kinds) or '-'}, strategies {[layer.strategy for layer in plan.layers]}, "
            f"P={plan.partitions}, {over}, estimated {float(estimate):.2f} s, measured {measured}"
        )
    return "\n".join(lines)


def _persist(spark, frame: DataFrame, path: str) -> DataFrame:
    frame.write.parquet(path)
    return read_parquet(spark, path)


def _run_round(
    spark,
    graph: TypedGraph,
    rnd: HeteroRound,
    index: int,
    need: set[str],
    values: dict[str, DataFrame],
    widths: dict[str, int],
    run_dir: str,
    common: dict,
    reports: dict,
    plans: dict,
    *,
    rows: tuple[dict[str, IdSet], dict[str, IdSet]] | None = None,
    fingerprints: tuple[str | None, str],
) -> dict[str, DataFrame]:
    """One typed round (module doc): per relation into a needed type the homogeneous engine,
    then the cross-relation merge and the per-type node ops, each type's values persisted.
    `rows` (a pruned run): the rows the round reads and those it gives, per type;
    `fingerprints`: the typed graph's (None in a pruned run) and the typed model's (module doc)."""
    from sparkgnn.engine.api import _infer_one
    from sparkgnn.engine.spark_compat import default_parallelism

    with phase(f"typed round {index}: relation graphs"):  # a pruned run counts its cut edges here
        jobs = relation_jobs(graph, rnd, index, need, values, widths, common, rows=rows, fingerprints=fingerprints)
    if rows is None:
        prepare_relations(spark, [(g, m) for _, _, g, m, _ in jobs], common, index)

    def job(edge_type: EdgeType, conv, rel_graph, rel_model, options: dict):
        def run():
            log.info(f"sparkgnn: typed round {index}, relation {edge_key(edge_type)} ({conv.kind})")
            # out=None: the engine keeps the relation's rows (localCheckpoint); the merged
            # values are what this module writes to the run folder
            return _infer_one(spark, rel_graph, rel_model, **options)

        return run

    # side by side on driver threads (engine.typed_jobs) when the layers run in Spark's own
    # Python workers; a worker cluster of the caller's serves one job at a time
    results = run_relation_jobs(
        spark,
        [(edge_key(j[0]), job(*j)) for j in jobs],
        index,
        concurrent=common.get("workers", "inprocess") == "inprocess",
    )
    by_type: dict[str, list[DataFrame]] = {}
    for (edge_type, *_), (frame, report, plan) in zip(jobs, results, strict=True):
        s, _, d = edge_type
        key = f"{index}:{edge_key(edge_type)}"
        reports[key], plans[key] = report, plan
        if s != d:  # the destination type's rows, back to their own ids
            frame = frame.where("pmod(id, 2) = 1").selectExpr("(id - 1) div 2 AS id", "h")
        by_type.setdefault(d, []).append(frame.select("id", "h"))
    # the merge runs here (Spark is lazy): its own line in the job's phase table, per round
    with phase(f"typed round {index}: merge relations per type"):
        relation_parts = [plans[k].partitions for k in plans if k.startswith(f"{index}:")]
        partitions = max([default_parallelism(spark), *relation_parts])
        post = {t: cast(NodeOpStack, stack) for t, stack in rnd.post.items()}
        result = merge_round(
            spark, by_type, rnd.relation_aggr, post, f"{run_dir}/round{index}/merged", partitions=partitions
        )
        for t, stack in rnd.keep.items():  # a type no relation of the round points into
            if t in need:
                kept = values[t] if rows is None else values[t].join(rows[1][t].frame, "id", "left_semi")
                frame = apply_node_ops(kept, cast(NodeOpStack, stack))
                if t in rnd.post:
                    frame = apply_node_ops(frame, cast(NodeOpStack, rnd.post[t]))
                result[t] = _persist(spark, frame, f"{run_dir}/round{index}/values/{t}")
    if rows is not None:
        # a type the walk needs no row of (not in `need`: none of its relations ran) is read by
        # the next round as a relation's source side only, with no rows: PyG's forward sums over
        # the relations into a row, and one whose sources have no row gives it no neighbour
        for t in sorted(set(rows[1]) - set(result)):
            log.info(f"sparkgnn: typed round {index}: no row of node type {t!r} is needed, none computed")
            result[t] = spark.createDataFrame([], "id long, h array<float>")
    return result


__all__ = [
    "infer_typed",
    "is_typed_source",
    "refuse_typed_job",
    "needed_types",
    "explain_relations",
]
