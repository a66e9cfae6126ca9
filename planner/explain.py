"""plan.explain(): the plan as text, shaped like Spark's `explain()`.

Why a tree per layer: a reader debugging a slow job wants, per layer, which strategy ran, why,
what the alternatives would have cost, and which operator moves how many bytes through which
engine. Each layer is printed from its last operator down to its inputs (children indented
under "+-" / ":-" as Spark does); inputs produced by an earlier layer or a shared static input
printed before are shown as one-line references instead of being expanded again.
"""

from __future__ import annotations

import math

from sparkgnn.planner.ir import LayerPlan, Operator, Plan

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as docs/PLATFORM.md reports memory)."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _seconds(value: float) -> str:
    return "n/a" if math.isinf(value) else f"{value:.2f} s"


def _line(op: Operator, layer_index: int) -> str:
    text = f"{op.name} [{op.engine}] {human_bytes(op.est_bytes)}"
    if op.est_rows:
        text += f" rows={op.est_rows:,}"
    if op.layer is not None and op.layer != layer_index:
        text += f" (layer {op.layer}, fused here)"
    return f"{text}  {op.detail}" if op.detail else text


def _tree(
    op: Operator, layer: LayerPlan, own: set[str], printed: set[str], prefix: str, connector: str, out: list[str]
) -> None:
    if op.id not in own or op.id in printed:
        where = "earlier layer" if op.id not in own else "above"
        out.append(f"{prefix}{connector}{op.name} [{op.engine}] ({op.id}, see {where})")
        return
    printed.add(op.id)
    out.append(f"{prefix}{connector}{_line(op, layer.index)}")
    child_prefix = prefix + ("   " if connector in ("", "+- ") else ":  ")
    for position, child in enumerate(op.children):
        last = position == len(op.children) - 1
        _tree(child, layer, own, printed, child_prefix, "+- " if last else ":- ", out)


def _header(layer: LayerPlan, num_layers: int) -> list[str]:
    est = layer.estimates
    candidates = " | ".join(
        f"{name} {_seconds(cost)}{' (chosen)' if name == layer.strategy else ''}"
        for name, cost in layer.candidates.items()
    )
    return [
        f"== Layer {layer.index + 1}/{num_layers}: {layer.kind} {layer.in_dim} -> {layer.out_dim}, "
        f"aggregator={layer.aggregator}, strategy={layer.strategy}, "
        f"pre_transform={'yes' if layer.pre_transform else 'no'} ==",
        f"candidates: {candidates}",
        f"reason: {layer.reason}",
        "estimate: shuffle {}, python in {} / out {}, {} pass(es), {} edges, {}".format(
            human_bytes(est.get("shuffle_bytes", 0)),
            human_bytes(est.get("python_in_bytes", 0)),
            human_bytes(est.get("python_out_bytes", 0)),
            int(est.get("passes", 0)),
            f"{int(est.get('edges', 0)):,}",
            _seconds(est.get("seconds", 0.0)),
        ),
        *(f"rewrite: {note}" for note in layer.rewrites),
    ]


def _memory_line(plan: Plan) -> list[str]:
    memory = plan.memory
    if not memory.get("peak_task_bytes_per_layer"):
        return []
    peaks = ", ".join(human_bytes(b) for b in memory["peak_task_bytes_per_layer"])
    lines = [
        f"memory per task: estimated peak {peaks} (per layer) of a {human_bytes(memory['budget_per_task_bytes'])} "
        f"budget; messages aggregated in destination ranges of at most {human_bytes(memory['message_chunk_bytes'])}"
        + ("; remote payloads read in place from memory-mapped exchange files" if memory.get("mapped_payloads") else "")
    ]
    if "concurrent_tasks" in memory:
        lines.append(
            f"tasks: {memory['concurrent_tasks']} at once, {memory['partitions_per_task']} partition(s) each per step "
            f"in turn, {memory['threads_per_task']} torch thread(s) each; a worker's heap estimated at "
            f"{human_bytes(memory['worker_bytes'])} with the partitions it keeps cached"
            + ("" if memory.get("keep_between_steps", True) else "; caches and free heap dropped after each task")
        )
    return lines


def explain(plan: Plan) -> str:
    est = plan.estimates
    lines = [
        f"== sparkgnn plan: {len(plan.layers)} layer(s), {plan.partitions} partition(s), "
        f"strategy={plan.strategy}, fuse={'on' if plan.fuse else 'off'}"
        f"{', collect-all' if plan.collect_all else ''} ==",
        "total: shuffle {}, python {}, {} pass(es), {}".format(
            human_bytes(est.get("shuffle_bytes", 0)),
            human_bytes(est.get("python_bytes", 0)),
            int(est.get("passes", 0)),
            _seconds(est.get("seconds", 0.0)),
        ),
        *_memory_line(plan),
        *_pruning_lines(plan),
        *(f"WARNING: {w}" for w in plan.warnings),
    ]
    for layer in plan.layers:
        lines.append("")
        lines += _header(layer, len(plan.layers))
        lines += operator_tree(layer)
    return "\n".join(lines)


def operator_tree(layer: LayerPlan) -> list[str]:
    """A layer's operators as tree lines, from its last operator down to its inputs (the batch
    explain and the serving request explain, planner.serving, print layers alike)."""
    lines: list[str] = []
    own = {op.id for op in layer.ops}
    printed: set[str] = set()
    roots = [op for op in layer.ops if not _consumed_in_layer(op, layer)]
    for root in reversed(roots):
        _tree(root, layer, own, printed, "", "", lines)
    return lines


def _pruning_lines(plan: Plan) -> list[str]:
    """The k-hop frontier of requested ids and which way of running them was chosen (planner.pruning)."""
    pruning = plan.pruning
    if not pruning:
        return []
    vertices, in_edges = pruning["vertices"], pruning["in_edges"]
    hops = " / ".join(f"D_{j} {n:,}" for j, n in enumerate(vertices))
    lines = [f"pruning: {pruning['reason']}", f"  frontier vertices: {hops}"]
    k = pruning["hops"]
    for l in range(k):
        if k - 1 - l < len(in_edges):
            lines.append(
                f"  layer {l + 1}/{k} needs h for D_{k - 1 - l} ({vertices[k - 1 - l]:,} vertices) "
                f"from its {in_edges[k - 1 - l]:,} in-edges"
            )
    return lines


def _consumed_in_layer(op: Operator, layer: LayerPlan) -> bool:
    return any(op in other.children for other in layer.ops)
