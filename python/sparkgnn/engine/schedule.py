"""From per-layer strategies to the sequence of fused steps the executor runs (pure Python).

A step finishes layer l's aggregation (how its input arrived depends on layer l's strategy) and
prepares what layer l+1's strategy needs shipped. The first step only prepares layer 0's inputs;
the last one emits the output. A combine layer whose messages need the destination (attention)
takes one extra step: destination payloads must reach the source side before partials exist.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a layer's strategy expects to find when its aggregation step runs.
INPUT_FOR = {"replicate": "edges_static", "edge_join": "edges_rows", "combine": "states", "pushdown": "spark_states"}
# What the previous step must emit so the layer's strategy can run.
EMIT_FOR = {"replicate": "mirrors", "edge_join": "edge_payloads", "combine": "partials", "pushdown": "edge_payloads"}


@dataclass(frozen=True)
class Step:
    layer: int  # conv whose aggregation this step finishes (-1 for the first step)
    inputs: str  # steps.INPUTS key
    outputs: str  # step_outputs.OUTPUTS key
    label: str  # what the progress line and the Spark UI say


def schedule(strategies: list[str], needs_dst: list[bool], start_layer: int = 0, final: str = "final") -> list[Step]:
    """Steps for convs start_layer..k-1. start_layer > 0 resumes from stored h^(start_layer) (PE
    store); `final` is what the last step emits ("final": output rows, "own_only": routed own rows
    for a PE store)."""
    num_layers = len(strategies)
    if num_layers == 0:
        raise ValueError("a model needs at least one layer")
    unknown = [s for s in strategies if s not in INPUT_FOR]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; known: {sorted(INPUT_FOR)}")
    steps: list[Step] = []

    def emit_towards(layer_next: int, from_layer: int, inputs: str, label: str) -> None:
        strategy = strategies[layer_next]
        if strategy == "combine" and needs_dst[layer_next]:
            steps.append(Step(from_layer, inputs, "dst_payloads", label))
            steps.append(
                Step(from_layer, "given", "partials", f"layer {layer_next + 1}/{num_layers}: combine (partials)")
            )
        else:
            steps.append(Step(from_layer, inputs, EMIT_FOR[strategy], label))

    if not 0 <= start_layer < num_layers:
        raise ValueError(f"start layer {start_layer} outside a {num_layers}-layer model")
    if start_layer:
        emit_towards(
            start_layer,
            start_layer - 1,
            "resume",
            f"load h^{start_layer} + scatter for layer {start_layer + 1}/{num_layers}: {strategies[start_layer]}",
        )
    else:
        emit_towards(0, -1, "first", f"scan + scatter for layer 1/{num_layers}: {strategies[0]}")
    for layer in range(start_layer, num_layers):
        label = f"layer {layer + 1}/{num_layers}: {strategies[layer]}"
        inputs = INPUT_FOR[strategies[layer]]
        if layer + 1 < num_layers:
            emit_towards(layer + 1, layer, inputs, label)
        else:
            steps.append(Step(layer, inputs, final, label))
    return steps
