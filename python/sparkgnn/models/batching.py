"""Model batching: k models over one graph as ONE model, so the graph is scanned, partitioned and
shipped once per layer instead of k times (Lotan, ../shared/papers/002 §5.2; layers/bundle.py).

The batched model is an ordinary Model in normal form (x -> pre -> conv_l -> post_l), so it is
saved, fingerprinted, loaded by workers with weights_only=True and planned like any other:
  rows     at every point a row holds *tracks* side by side, one per distinct computation so far;
           model i reads its own track. Models with equal pre stacks share the first track (so
           layer 1 reads x itself when no model has a pre stack), and models whose layer-l conv
           and post stack are equal (config and weights) and read the same track share the
           next one: an identical prefix of layers runs once.
  layer l  a BundleConv (layers/bundle.py) with one member per track after the layer; a model
           with fewer layers is carried by a pass-through member. Members share payloads and
           aggregations where they compute the same thing.
  pre/post a ParallelOp (layers/nodeops.py) applying each track's stack to its columns.
The batched output is the final tracks side by side; `ModelBatch.slices` says which columns are
whose, so results split back per model.

Models whose layers cannot share an edge list (another self-loop policy at some layer, or
node statistics with and without edge weights) cannot be one model: `why_incompatible` says why,
`plan_batches` groups a list of models into batches that can.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from sparkgnn.errors import SparkGNNError
from sparkgnn.layers.base import CONVS, MergeableConv
from sparkgnn.layers.bundle import BundleConv
from sparkgnn.layers.nodeops import NodeOpStack, ParallelOp
from sparkgnn.layers.signatures import module_key
from sparkgnn.models.model import SPEC_FORMAT, SPEC_VERSION, Model


class BatchError(SparkGNNError, ValueError):
    """Models that cannot be batched together (different input widths, conflicting edge lists)."""


@dataclass
class ModelBatch:
    """The batched model and how to read each member model's result out of its rows."""

    model: Model
    names: list[str]
    slices: list[tuple[int, int]]  # columns of each model's final output in the batched output
    outputs: list[str]  # each model's output kind: "logits" gets pred = argmax of its columns

    def split(self, h: torch.Tensor) -> list[torch.Tensor]:
        """The batched output's columns per model, in model order."""
        return [h[:, start:stop] for start, stop in self.slices]


def why_incompatible(models: Sequence[Model], names: Sequence[str]) -> str | None:
    """Why these models cannot run as one model (None when they can): at some layer their convs
    need different edge lists (layers/bundle.py, module doc), or a model's layer is not a conv
    that a bundle can rebuild from its config."""
    if len(models) > 1:
        for name, m in zip(names, models, strict=True):
            if m.is_dag:  # its rows carry saved slots that a side-by-side stack would not keep
                return f"{name} has skip connections (residual adds, concatenation, jumping knowledge)"
            rounds = [conv.kind for conv in m.conv_list() if CONVS.get(conv.kind) is not type(conv)]
            if rounds:  # a multi-pass layer runs as rounds that exist only inside its model
                return f"{name} runs rounds {rounds} that cannot be rebuilt on their own (multi-pass layers)"
            if m.edge_attr_dim:  # a bundle's messages carry edge weights, not edge attributes
                return f"{name} reads edge features (edge_attr), which a batch of models does not carry"
            whole = [conv.kind for conv in m.conv_list() if conv.plan_info().get("whole_neighbourhoods")]
            if whole:  # the user's own conv over whole neighbourhoods: no per-edge message to share
                return f"{name} runs {whole} on whole neighbourhoods (generic fallback), which a bundle cannot share"
    depth = max(m.num_rounds for m in models)
    for layer in range(depth):
        at = [(name, m.conv(layer)) for name, m in zip(names, models, strict=True) if layer < m.num_rounds]
        policies = {conv.self_loops for _, conv in at}
        if len(policies) > 1:
            which = ", ".join(f"{name}: {conv.kind} self_loops={conv.self_loops}" for name, conv in at)
            return f"layer {layer + 1} needs different self-loop policies ({which})"
        weighted = any(conv.uses_edge_weight for _, conv in at)
        mixed = [name for name, conv in at if conv.required_stats and conv.uses_edge_weight != weighted]
        if mixed:
            return (
                f"layer {layer + 1}: {', '.join(mixed)} compute node statistics without edge weights "
                "while another model's layer uses them"
            )
    return None


def plan_batches(models: Sequence[Model], names: Sequence[str]) -> list[list[int]]:
    """Indices of `models` grouped into batches that can each run as one model, first fit in
    order (one batch when all are compatible)."""
    batches: list[list[int]] = []
    for i in range(len(models)):
        for batch in batches:
            members = batch + [i]
            if why_incompatible([models[j] for j in members], [names[j] for j in members]) is None:
                batch.append(i)
                break
        else:
            batches.append([i])
    return batches


def check_same_input_width(models: Sequence[Model], names: Sequence[str]) -> None:
    """Models run together read the same graph features, so they must take the same input width;
    a BatchError lists each model's width where they differ."""
    widths = {name: m.in_dim for name, m in zip(names, models, strict=True)}
    if len(set(widths.values())) > 1:
        listed = ", ".join(f"{name}: {width}" for name, width in widths.items())
        raise BatchError(f"batched models must read the same input width; they read {listed}")


def _check(models: Sequence[Model], names: Sequence[str]) -> None:
    if not models:
        raise BatchError("no models to batch")
    if len(names) != len(models):
        raise BatchError(f"{len(names)} names for {len(models)} models")
    if len(set(names)) != len(names):
        raise BatchError(f"model names must be distinct, got {list(names)}")
    for name, model in zip(names, models, strict=True):
        if not isinstance(model, Model):
            raise BatchError(f"{name} is a {type(model).__name__}, not a sparkgnn Model")
    check_same_input_width(models, names)
    why = why_incompatible(models, names)
    if why:
        raise BatchError(f"models {', '.join(names)} cannot share one edge list: {why}")


def _stack_key(stack: NodeOpStack) -> Hashable:
    return module_key(stack) if len(stack) else None


def _parallel(in_dim: int, inputs: list[tuple[int, int]], stacks: list[NodeOpStack]) -> tuple[NodeOpStack, list]:
    """The node-op stage running `stacks` on column slices `inputs` side by side, and the output
    column slice of each. Empty when every stack is empty and the slices are the rows in order."""
    if all(len(s) == 0 for s in stacks) and _tiles(inputs, in_dim):
        return NodeOpStack(), list(inputs)
    if len(stacks) == 1 and inputs[0] == (0, in_dim):
        stack = NodeOpStack(stacks[0].config())
        stack.load_state_dict(stacks[0].state_dict())
        return stack, [(0, stacks[0].out_dim(in_dim))]
    op = ParallelOp(in_dim, [{"input": list(i), "ops": s.config()} for i, s in zip(inputs, stacks, strict=True)])
    for target, stack in zip(op.stacks, stacks, strict=True):
        target.load_state_dict(stack.state_dict())
    return NodeOpStack(ops=[op]), _side_by_side(op.branch_dims())


def _tiles(inputs: list[tuple[int, int]], width: int) -> bool:
    return inputs == _side_by_side([stop - start for start, stop in inputs]) and inputs[-1][1] == width


def _side_by_side(widths: list[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for w in widths:
        out.append((start, start + w))
        start += w
    return out


def _copy_conv(conv: MergeableConv) -> MergeableConv:
    from sparkgnn.layers.base import build_conv

    copy = build_conv(conv.config())
    copy.load_state_dict(conv.state_dict())
    return copy


def _bundle(in_dim: int, members: list[tuple[tuple[int, int], MergeableConv | None]]) -> MergeableConv:
    """The layer running `members` (input slice, conv or None = pass-through) side by side; a
    lone member reading every column is simply itself."""
    if len(members) == 1 and members[0][0] == (0, in_dim) and members[0][1] is not None:
        return _copy_conv(members[0][1])
    return BundleConv.from_convs(in_dim, members)


def batch_models(models: Sequence[Model], names: Sequence[str] | None = None) -> ModelBatch:
    """One Model computing every model of `models` (module doc), and where each one's output is."""
    models = list(models)
    names = [f"model_{i}" for i in range(len(models))] if names is None else [str(n) for n in names]
    _check(models, names)
    in_dim = models[0].in_dim
    # tracks: distinct computations so far, keyed; track_of[i]: model i's
    pre_keys = [_stack_key(m.pre_ops) for m in models]
    pre_distinct = list(dict.fromkeys(pre_keys))
    first = [models[pre_keys.index(key)] for key in pre_distinct]
    pre, slices = _parallel(in_dim, [(0, in_dim)] * len(pre_distinct), [m.pre_ops for m in first])
    track_of = [pre_distinct.index(key) for key in pre_keys]
    width = in_dim if not slices else slices[-1][1]
    convs, posts = [], []
    for layer in range(max(m.num_rounds for m in models)):
        keys: list[tuple[int, Hashable, Hashable]] = [
            (track_of[i], module_key(m.conv(layer)), module_key(m.post_list()[layer]))
            if layer < m.num_rounds
            else (track_of[i], None, None)
            for i, m in enumerate(models)
        ]
        distinct = list(dict.fromkeys(keys))
        owners = [keys.index(key) for key in distinct]  # the first model with each key
        members = [
            (slices[track], models[i].conv(layer) if layer < models[i].num_rounds else None)
            for (track, _c, _p), i in zip(distinct, owners, strict=True)
        ]
        conv = _bundle(width, members)
        outs = _side_by_side(
            [c.out_dim if c is not None else s[1] - s[0] for s, c in members]
            if isinstance(conv, BundleConv)
            else [conv.out_dim]
        )
        stacks = [models[i].post_list()[layer] if layer < models[i].num_rounds else NodeOpStack() for i in owners]
        post, slices = _parallel(conv.out_dim, outs, stacks)
        convs.append(conv)
        posts.append(post)
        track_of = [distinct.index(key) for key in keys]
        width = slices[-1][1]
    spec = {
        "format": SPEC_FORMAT,
        "version": SPEC_VERSION,
        "source": f"batch[{', '.join(names)}]",
        "output": "embedding",
        "in_dim": in_dim,
    }
    batched = Model(spec, _modules=(pre, convs, posts))
    return ModelBatch(
        model=batched,
        names=names,
        slices=[slices[track] for track in track_of],
        outputs=[m.output for m in models],
    )
