"""compile(layers, graph_stats, task) -> Plan.

Pipeline: check inputs -> per layer decide transform ordering -> cost every registered strategy
(after the fusion rewrite, so candidates are priced as they would run) -> pick the cheapest or
the forced one -> assemble the chosen programs with the shared static inputs, hoist and fuse
across layers -> measure each layer's operators for its estimates -> link the DAG.

Strategies are chosen greedily layer by layer: a layer's choice only interacts with its
neighbours through the edge partitionings already cached (a strategy that needs a new one is
charged for building it) and through fusion (priced as a marginal cost in the previous pass).
With three strategies and a handful of layers that is exact enough and keeps every choice
explainable in one sentence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sparkgnn.planner import rewrites
from sparkgnn.planner.cost import CostModel, Estimate, measure
from sparkgnn.planner.errors import PlanError
from sparkgnn.planner.inputs import GraphStats, LayerSpec, Task, parse_graph_stats, parse_layers, parse_task
from sparkgnn.planner.ir import LayerPlan, Operator, Plan
from sparkgnn.planner.partitions import MESSAGE_CHUNK_BYTES, Sizing, task_memory_bytes, worker_bytes
from sparkgnn.planner.segments import ID_BYTES, dl, edge_row_bytes, graph, segment, to_python
from sparkgnn.planner.strategies import PARTITIONINGS, STRATEGIES, LayerContext, Program, Rows, Strategy


@dataclass
class _Decision:
    ctx: LayerContext
    strategy: Strategy
    program: Program
    candidates: dict[str, float]
    reason: str
    pre_transform_note: str


def compile(layers: Any, graph_stats: Any, task: Any, cost_model: CostModel | None = None) -> Plan:
    """Compile a model's layers (Model.plan_info()), Spark's graph statistics and a task into a
    Plan. `cost_model` defaults to CostModel() (constants calibrated in docs/PLATFORM.md)."""
    specs = parse_layers(layers)
    stats = parse_graph_stats(graph_stats)
    job = parse_task(task, tuple(STRATEGIES))
    model = cost_model if cost_model is not None else CostModel()
    _check_consistency(specs, stats, job)
    collect_all = _needs_collect_all(specs, job)
    if collect_all:
        stats = stats.single_partition()

    contexts = [_context(specs, position, stats, job) for position in range(len(specs))]
    edge_partitionings: list[str] = []
    decisions = []
    for ctx in contexts:
        decision = _decide(ctx, stats, job, model, edge_partitionings)
        if decision.strategy.edges_by not in edge_partitionings:
            edge_partitionings.append(decision.strategy.edges_by)
        decisions.append(decision)
    if collect_all:
        labels = ", ".join(f"layer {s.index} ({s.aggregator})" for s in specs if not s.decomposable)
        for decision in decisions:
            decision.reason = (
                f"collect-all on 1 partition, one batch, because {labels} is not decomposable; {decision.reason}"
            )

    layer_plans = _assemble(decisions, stats, job, model, edge_partitionings)
    total = sum((measure(lp.ops) for lp in layer_plans), Estimate())
    return Plan(
        partitions=stats.partitions,
        layers=layer_plans,
        strategy=job.strategy,
        fuse=job.fuse,
        collect_all=collect_all,
        estimates=total.to_dict(model),
        warnings=_memory_warnings(decisions, specs, stats, job, collect_all),
        cost_model=model.to_dict(),
        graph_stats=stats.as_dict(),
        memory=_memory(decisions, stats, job),
    )


def _concurrent_tasks(stats: GraphStats, job: Task) -> int:
    return job.concurrent_tasks if job.concurrent_tasks is not None else max(1, min(job.cores, stats.partitions))


def _memory(decisions: list[_Decision], stats: GraphStats, job: Task) -> dict[str, Any]:
    """Plan.memory: each layer's estimated peak task bytes, the worker's resident heap with the
    partitions it keeps cached (partitions.worker_bytes), how many tasks run at once and the budget
    each of them has (the Python workers' share divided among them)."""
    tasks = _concurrent_tasks(stats, job)
    needs = _task_memory(decisions, stats, job.mapped_payloads)
    served = -(-stats.partitions // tasks)
    edges = _largest_task_edges(stats)
    worker = max((worker_bytes(need, edges, served, job.mapped_payloads) for need in needs), default=0)
    # Spark keeps up to min(cores, P) Python workers alive and hands the next task to whichever is
    # idle, so with fewer tasks at once the others sit on what they kept from their last task: a
    # worker keeps its caches and heap between steps only if all of them together still fit.
    workers_alive = max(1, min(job.cores, stats.partitions))
    pool = job.cores * job.memory_per_task_bytes
    return {
        "peak_task_bytes_per_layer": [int(need) for need in needs],
        "worker_bytes": int(worker),
        "keep_between_steps": workers_alive * worker <= pool,
        # a worker keeps freed heap for reuse up to its share of the pool, or the estimate where that
        # is larger (sparkgnn.heap.release_retained_memory): trimming down to the estimate itself
        # made every step of 8M and 32M edges fault its buffers in again (32M layer 2: 10 -> 20 s)
        "retain_bytes": int(max(worker, pool / workers_alive)),
        "budget_per_task_bytes": int(job.memory_per_task_bytes * job.cores // tasks),
        "concurrent_tasks": tasks,
        "partitions_per_task": served,
        "threads_per_task": max(1, job.cores // tasks),
        "message_chunk_bytes": MESSAGE_CHUNK_BYTES,
        "mapped_payloads": job.mapped_payloads,
    }


# ---------------------------------------------------------------- checks


def _check_consistency(specs: list[LayerSpec], stats: GraphStats, job: Task) -> None:
    if job.partitions is not None and job.partitions != stats.partitions:
        raise PlanError(
            f"task asks for {job.partitions} partitions but graph_stats were computed for "
            f"{stats.partitions}; mirror/combine counts depend on the partitioning, recompute them"
        )
    if job.ids is not None and job.ids > stats.num_vertices:
        raise PlanError(f"task requests {job.ids} ids but the graph has only {stats.num_vertices} vertices")


def _needs_collect_all(specs: list[LayerSpec], job: Task) -> bool:
    """Non-decomposable aggregations (e.g. LSTM) cannot be split into mergeable partial states:
    even one partition's micro-batches would need merging. They run only on the collect-all path
    (one partition, one batch), and only when the task allows it."""
    blocked = [spec for spec in specs if not spec.decomposable]
    if not blocked:
        return False
    labels = "; ".join(spec.label for spec in blocked)
    if not job.collect_all:
        raise PlanError(
            f"{labels}: not decomposable, so no partitioned plan computes it exactly (its aggregation "
            "cannot be split into mergeable partial states); set task collect_all=True to run the "
            "model on a single partition with every edge collected"
        )
    if job.strategy == "combine":
        raise PlanError(f"strategy 'combine' cannot run {labels}: partial states cannot be merged")
    return True


# ---------------------------------------------------------------- per-layer decision


def _context(specs: list[LayerSpec], position: int, stats: GraphStats, job: Task) -> LayerContext:
    spec = specs[position]
    last = position == len(specs) - 1
    pre, _ = rewrites.choose_pre_transform(spec)
    input_width = stats.feature_dim if position == 0 else spec.in_dim
    output_width = spec.out_dim if last else specs[position + 1].in_dim
    # Selecting ids only prunes the last layer (its destinations are exactly the ids); earlier
    # layers would need the k-hop in-neighbourhood, which the stats do not give, so they stay
    # whole. Requested ids are assumed to be a uniform sample of the vertices.
    fraction = job.ids / stats.num_vertices if (last and job.ids is not None) else 1.0
    return LayerContext(
        spec=spec,
        pre_transform=pre,
        widths=rewrites.widths(spec, pre, input_width, output_width),
        rows=Rows.of(stats, fraction),
        partitions=stats.partitions,
        last=last,
        native_aggregates_missing=job.native_aggregates_missing,
    )


def _marginal(program: Program, hoisted: bool, fuse: bool) -> Estimate:
    """Cost of a layer's program as it would run. With fusion and a previous layer, the prefix
    runs inside that layer's last pass: price it as the difference it makes to a host pass."""
    if not fuse:
        return measure(program.prefix + program.body)
    if not hoisted:
        return measure(rewrites.fuse(program.prefix + program.body))
    host = segment([dl("ApplyVertex", "previous layer's update")], layer=None)
    fused = rewrites.fuse(rewrites.hoist(host, program.prefix) + program.body)
    return measure(fused) - measure(host)


def _decide(
    ctx: LayerContext, stats: GraphStats, job: Task, model: CostModel, edge_partitionings: list[str]
) -> _Decision:
    hoisted = job.fuse and ctx.index > 0
    costs: dict[str, float] = {}
    blockers: dict[str, str] = {}
    programs: dict[str, Program] = {}
    for name, strategy in STRATEGIES.items():
        blocker = strategy.blocker(ctx)
        if blocker:
            costs[name], blockers[name] = math.inf, blocker
            continue
        programs[name] = strategy.program(ctx)
        estimate = _marginal(programs[name], hoisted, job.fuse)
        if strategy.edges_by not in edge_partitionings:
            estimate = estimate + measure([PARTITIONINGS[strategy.edges_by](stats, ctx.edge_row)])
        costs[name] = estimate.seconds(model)

    if job.strategy == "auto":
        applicable = [n for n in STRATEGIES if not math.isinf(costs[n])]
        if not applicable:
            raise PlanError(
                f"no strategy can run {ctx.spec.label}: " + "; ".join(f"{n}: {b}" for n, b in blockers.items())
            )
        chosen = min(applicable, key=lambda n: costs[n])  # ties: registry order
    else:
        chosen = job.strategy
        if chosen in blockers:
            raise PlanError(f"strategy {chosen!r} cannot run {ctx.spec.label}: {blockers[chosen]}")
    _, note = rewrites.choose_pre_transform(ctx.spec)
    return _Decision(
        ctx, STRATEGIES[chosen], programs[chosen], costs, _reason(ctx, chosen, costs, blockers, job.strategy), note
    )


def _seconds(value: float) -> str:
    return "n/a" if math.isinf(value) else f"{value:.2f} s"


def _reason(ctx: LayerContext, chosen: str, costs: dict[str, float], blockers: dict[str, str], requested: str) -> str:
    why = STRATEGIES[chosen].why(ctx)
    others = sorted((n for n in costs if n != chosen and not math.isinf(costs[n])), key=lambda n: costs[n])
    if requested == "auto":
        text = f"auto: {chosen} is cheapest ({_seconds(costs[chosen])}): {why}"
        if others:
            text += f"; next best {others[0]} ({_seconds(costs[others[0]])})"
    else:
        applicable = [n for n in costs if not math.isinf(costs[n])]
        best = min(applicable, key=lambda n: costs[n])
        text = f"forced by task strategy={chosen} ({_seconds(costs[chosen])}): {why}"
        if best != chosen:
            text += f"; auto would pick {best} ({_seconds(costs[best])})"
    if blockers:
        text += "; not applicable: " + "; ".join(f"{n}: {b}" for n, b in blockers.items())
    return text


# ---------------------------------------------------------------- assembly


def _setup_ops(
    decisions: list[_Decision], stats: GraphStats, job: Task, edge_partitionings: list[str]
) -> list[Operator]:
    """Operators built once and shared by every layer: the scans, the cached edge partitionings,
    static per-vertex statistics, and the requested-ids filter."""
    weighted = any(d.ctx.spec.uses_edge_weight for d in decisions)
    edge_row = edge_row_bytes(weighted)
    ops = [
        graph(
            "Scan",
            stats.num_edges * edge_row,
            "edges (src, dst" + (", weight)" if weighted else ")"),
            rows=stats.num_edges,
            static=True,
            provides=["edges"],
        )
    ]
    ops += [PARTITIONINGS[by](stats, edge_row) for by in edge_partitionings]
    ops.append(
        graph(
            "Scan",
            to_python(stats.num_vertices, stats.feature_dim),
            f"vertices (id, x: {stats.feature_dim} floats)",
            rows=stats.num_vertices,
        )
    )
    names = sorted({s for d in decisions for s in d.ctx.spec.required_stats})
    if names:
        ops.append(
            graph(
                "LocalAggregate",
                stats.num_vertices * ID_BYTES * len(names),
                f"static per-vertex statistics {names}, computed once from the edges and joined onto the vertex rows",
                rows=stats.num_vertices,
                reads=["edges"],
            )
        )
    return ops


def _requested_ids(job: Task) -> list[Operator]:
    """With selected ids, the last layer only needs the in-edges of those ids."""
    if job.ids is None:
        return []
    return [
        graph(
            "Join",
            job.ids * ID_BYTES,
            f"the {job.ids:,} requested ids (broadcast) with edges on dst: in-edges the last layer needs",
            rows=job.ids,
            static=True,
            reads=["edges"],
            provides=["requested"],
        )
    ]


def _materialize(ctx: LayerContext) -> Operator:
    what = "output embeddings/predictions" if ctx.last else f"h^{ctx.index + 1}: checkpointed to cut lineage"
    return graph("Materialize", 0, what, rows=ctx.rows.vertices, layer=ctx.index)


def _assemble(
    decisions: list[_Decision], stats: GraphStats, job: Task, model: CostModel, edge_partitionings: list[str]
) -> list[LayerPlan]:
    chains: list[list[Operator]] = []
    for position, decision in enumerate(decisions):
        ops = _setup_ops(decisions, stats, job, edge_partitionings) if position == 0 else []
        if position == len(decisions) - 1:
            ops += _requested_ids(job)
        if not (job.fuse and position > 0):
            ops += decision.program.prefix
        ops += decision.program.body + [_materialize(decision.ctx)]
        if job.fuse and position + 1 < len(decisions):
            ops = rewrites.hoist(ops, decisions[position + 1].program.prefix)
        if job.fuse:
            ops = rewrites.fuse(ops)
        chains.append(rewrites.fill_materialize(ops))
    _link(chains, last_reads_requested=job.ids is not None)

    plans = []
    for decision, ops in zip(decisions, chains, strict=True):
        ctx = decision.ctx
        notes = [decision.pre_transform_note]
        if job.fuse:
            passes = measure(ops).passes
            hoisted = sorted({op.layer for op in ops if op.layer is not None and op.layer != ctx.index})
            note = f"fusion: DL operators run in {passes} Pipe round trip(s)"
            if hoisted:
                note += f", including the owner-side preparation of layer(s) {hoisted}"
            notes.append(note)
        else:
            notes.append("fusion off: one Pipe round trip per DL operator")
        plans.append(
            LayerPlan(
                index=ctx.index,
                strategy=decision.strategy.name,
                pre_transform=ctx.pre_transform,
                ops=ops,
                estimates=measure(ops).to_dict(model),
                candidates=dict(decision.candidates),
                reason=decision.reason,
                kind=ctx.spec.kind,
                in_dim=ctx.spec.in_dim,
                out_dim=ctx.spec.out_dim,
                aggregator=ctx.spec.aggregator,
                rewrites=notes,
            )
        )
    return plans


def _link(chains: list[list[Operator]], last_reads_requested: bool) -> None:
    """Give every operator its id and children: the previous operator of the main chain (across
    layers), plus the static inputs it reads. Static operators are side branches."""
    providers: dict[str, Operator] = {}
    previous: Operator | None = None
    counter = 0
    for position, ops in enumerate(chains):
        first_of_layer = True
        for op in ops:
            op.id = f"op{counter}"
            counter += 1
            reads = list(op.attrs.get("reads", []))
            # A Pipe shipping a static input (e.g. the cached edges) reads it too.
            reads += [name for name in op.attrs.get("side", {}) if name in providers and name not in reads]
            if last_reads_requested and position == len(chains) - 1 and first_of_layer and not op.attrs.get("static"):
                reads.append("requested")
                op.attrs["reads"] = reads
            children = [providers[name] for name in reads if name in providers]
            if op.attrs.get("static"):
                op.children = children
                for name in op.attrs.get("provides", []):
                    providers[name] = op
                continue
            op.children = ([previous] if previous is not None else []) + [c for c in children if c is not previous]
            previous = op
            first_of_layer = False


def _largest_task_edges(stats: GraphStats) -> float:
    return stats.max_partition_edges if stats.max_partition_edges is not None else stats.num_edges / stats.partitions


def _task_memory(decisions: list[_Decision], stats: GraphStats, mapped_payloads: bool = False) -> list[float]:
    """Estimated peak bytes of each layer's largest task (planner.partitions.task_memory_bytes)."""
    edges = _largest_task_edges(stats)
    vertices = stats.num_vertices / stats.partitions
    needs = []
    for decision in decisions:
        w = decision.ctx.widths
        # edge_join ships one payload row per edge into the task; the others a row per source at
        # most: the task's own vertices plus its share of the mirrors prepare counted
        measured = vertices + stats.mirror_rows / stats.partitions if stats.mirror_rows is not None else math.inf
        rows = edges if decision.strategy.name == "edge_join" else min(edges, stats.num_vertices, measured)
        range_wise = decision.ctx.spec.range_wise
        needs.append(
            task_memory_bytes(
                edges, vertices, w.src, w.in_dim, w.out_dim, w.state, w.dst, rows, range_wise, mapped_payloads
            )
        )
    return needs


def _memory_warnings(
    decisions: list[_Decision], specs: list[LayerSpec], stats: GraphStats, job: Task, collect_all: bool
) -> list[str]:
    """Lotan A.1.3: prefer plans under the resource limits. The planner cannot repartition by
    itself (the stats are for this P), so an over-budget layer is a warning with the P that
    choose_partitions would pick, not an error."""
    edges = _largest_task_edges(stats)
    budget = job.memory_per_task_bytes * job.cores // _concurrent_tasks(stats, job)
    warnings = []
    for decision, need in zip(decisions, _task_memory(decisions, stats, job.mapped_payloads), strict=True):
        if need > budget:
            if collect_all:
                advice = "the collect-all path runs on one partition; it may spill or fail"
            else:
                suggested, tasks = Sizing(
                    specs,
                    stats.num_vertices,
                    stats.num_edges,
                    job.cores,
                    job.memory_per_task_bytes,
                    stats.feature_dim,
                    mapped_payloads=job.mapped_payloads,
                ).layout()
                advice = f"choose_layout suggests {suggested} partitions, {tasks} task(s) at once"
            warnings.append(
                f"layer {decision.ctx.index}: estimated peak task memory {need / 2**20:,.0f} MiB "
                f"(largest partition ~{edges:,.0f} edges) exceeds the {budget / 2**20:,.0f} MiB a task "
                f"has ({_concurrent_tasks(stats, job)} at once); {advice}"
            )
    return warnings
