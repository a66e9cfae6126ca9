"""Typed (heterogeneous) rounds: one merge-aware conv per relation, merged across relations.

A typed graph has node types and relations (edge types `(src type, relation, dst type)`, in
PyG's metadata order). One round of a typed model is, for every destination type T:

    out_T = RELATION_AGGR over the relations (s, r, T) of the round of conv_(s,r,T)(h_s, h_T)
    out_T = keep_T(h_T)        for a type no relation of the round points into, when it is kept
    h_T  <- post_T(out_T)      per-type node ops

Each conv is an ordinary MergeableConv (layers/base.py) run over its relation's edges only: its
in-edges are split over partitions and merged exactly like a homogeneous layer's. A relation
between two types is bipartite (`propagate(..., h_dst=...)`): sources carry the source type's
rows, destinations the destination type's; it has no self loops and no node statistics (PyG's
to_hetero refuses self loops there, and GCN's normalisation needs one node set). A relation
within one type is a homogeneous graph of its own, so every layer runs there, multi-pass and
multi-round ones included (their rounds stay within the relation).

WHY the cross-relation aggregation is merge-aware: each relation's output for a node is final
once its own in-edges are merged, so the per-relation outputs are partial states of a second,
node-wise aggregation that is associative and commutative (sum: the sum; mean: the sum and the
number of relations; max / min: the elementwise max / min). Relations can therefore be computed
in any order and in different places and merged at the destination, exactly. PyG's `to_hetero`
and `HeteroConv` define the mean as the mean of the per-relation outputs over the relations that
point into the type (a node without edges in a relation still counts it: the conv's output on an
empty neighbourhood, its bias or root term, enters the mean), which is what RelationAggregator
computes.

HGT (layers/hgt.py) has no final per-relation output: its attention is one softmax over a node's
in-edges of every relation. Its relations give partial softmax states (max logit, sum of exp,
weighted sum per head, plus the node's own row for the skip) and the round's aggregation `softmax`
merges them like the homogeneous softmax merges partitions, then divides; the type's output op
(gelu, the per-type output Linear, the skip gate) is the first of its post ops.

`keep` serves layers that give every node an output even without incoming relations (RGCN's
root weight and bias); HeteroConv and to_hetero drop (HeteroConv) or refuse (to_hetero) such
types, so their rounds keep none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers.base import MergeableConv, build_conv, choose_pre_transform, propagate
from sparkgnn.layers.hgt import HGTRelationLayer
from sparkgnn.layers.nodeops import NodeOpStack
from sparkgnn.layers.phases import expand_passes

EdgeType = tuple[str, str, str]
RELATION_AGGRS = ("sum", "mean", "max", "min", "softmax")
KEY_SEPARATOR = "__"


def edge_key(edge_type: EdgeType) -> str:
    """`src__rel__dst`: a relation's name as a module / JSON key (PyG's key2str without its
    character replacements, which lose information)."""
    return KEY_SEPARATOR.join(edge_type)


def resolve_relation(edge_types: Sequence[EdgeType], label: Any) -> EdgeType:
    """The edge type `label` names (a key `src__rel__dst`, a relation name only one edge type has,
    or an index into edge_types); ValueError (one line) naming the graph's relations otherwise."""
    edge_types = [cast(EdgeType, tuple(e)) for e in edge_types]
    known = ", ".join(edge_key(e) for e in edge_types)
    if isinstance(label, (int, np.integer)) and not isinstance(label, bool):
        if not 0 <= int(label) < len(edge_types):
            raise ValueError(f"relation index {int(label)} is out of range (the graph has {len(edge_types)}: {known})")
        return edge_types[int(label)]
    if not isinstance(label, str) or not label:
        raise ValueError(f"a relation is an edge type key, a relation name or an index, got {label!r}")
    if KEY_SEPARATOR in label:
        wanted = cast(EdgeType, tuple(label.split(KEY_SEPARATOR)))
        if wanted not in edge_types:
            raise ValueError(f"the graph has no relation {label!r} (it has {known})")
        return wanted
    matches = [e for e in edge_types if e[1] == label]
    if not matches:
        raise ValueError(f"the graph has no relation {label!r} (it has {known})")
    if len(matches) > 1:
        keys = ", ".join(edge_key(e) for e in matches)
        raise ValueError(f"relation name {label!r} is ambiguous ({keys}): name the edge type by its key")
    return matches[0]


def check_type_name(name, what: str = "node type") -> str:
    """A type or relation name usable in keys: a non-empty string without '.' (module paths)
    and without the key separator '__' (edge keys must split back into their three parts)."""
    if not isinstance(name, str) or not name or "." in name or KEY_SEPARATOR in name:
        raise ValueError(f"{what} {name!r} must be a non-empty string without '.' or '{KEY_SEPARATOR}'")
    return name


def parse_edge_key(key: str) -> EdgeType:
    parts = key.split(KEY_SEPARATOR)
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"relation key {key!r} is not 'src{KEY_SEPARATOR}rel{KEY_SEPARATOR}dst'")
    return parts[0], parts[1], parts[2]


class RelationAggregator:
    """The cross-relation aggregation as partial states (module doc): `state(out)` of one
    relation's output, `merge(a, b)` of two states (associative, commutative), `finalize(state)`.
    A state is a pair (value, number of relations merged into it). `softmax` (HGT) takes the
    heads and the value width F of its relations' states [max (H) | sum exp (H) | weighted sum
    (F) | carried row]: its merge rescales both sides to the larger max and adds, keeping one
    carried row (every relation carries the same destination row); finalize divides."""

    def __init__(self, name: str, *, heads: int = 0, channels: int = 0):
        if name not in RELATION_AGGRS:
            raise ValueError(f"cross-relation aggregation {name!r} is not one of {RELATION_AGGRS}")
        self.name = name
        self.heads, self.channels = int(heads), int(channels)
        if name == "softmax" and (self.heads < 1 or self.channels < 1 or self.channels % self.heads):
            raise ValueError(f"the softmax across relations needs heads dividing channels, got {heads}, {channels}")

    def out_width(self, width: int) -> int:
        """The finalized width of relation outputs `width` wide (softmax: the states' max and
        exp sums are gone)."""
        return width - 2 * self.heads if self.name == "softmax" else width

    def state(self, out: Tensor) -> tuple[Tensor, int]:
        return out, 1

    def merge(self, a: tuple[Tensor, int], b: tuple[Tensor, int]) -> tuple[Tensor, int]:
        if a[0].shape != b[0].shape:
            raise ValueError(f"relations give outputs of shapes {tuple(a[0].shape)} and {tuple(b[0].shape)}")
        if self.name == "softmax":
            value = self._softmax_merge(a[0], b[0])
        elif self.name in ("sum", "mean"):
            value = a[0] + b[0]
        elif self.name == "max":
            value = torch.maximum(a[0], b[0])
        else:
            value = torch.minimum(a[0], b[0])
        return value, a[1] + b[1]

    def finalize(self, state: tuple[Tensor, int]) -> Tensor:
        if self.name == "softmax":
            return self._softmax_divide(state[0])
        return state[0] / state[1] if self.name == "mean" else state[0]

    def _softmax_merge(self, a: Tensor, b: Tensor) -> Tensor:
        """Two states rescaled to their larger max and added; a's carried row kept."""
        h, n, c = self.heads, a.shape[0], self.channels // self.heads
        end = 2 * h + self.channels
        mx = torch.maximum(a[:, :h], b[:, :h])
        sa, sb = (torch.exp(x[:, :h] - mx).masked_fill(x[:, :h] == -math.inf, 0.0) for x in (a, b))
        s = a[:, h : 2 * h] * sa + b[:, h : 2 * h] * sb
        w = a[:, 2 * h : end].view(n, h, c) * sa.unsqueeze(-1) + b[:, 2 * h : end].view(n, h, c) * sb.unsqueeze(-1)
        return torch.cat([mx, s, w.view(n, self.channels), a[:, end:]], dim=1)

    def _softmax_divide(self, state: Tensor) -> Tensor:
        h, n, c = self.heads, state.shape[0], self.channels // self.heads
        end = 2 * h + self.channels
        agg = state[:, 2 * h : end].view(n, h, c) / (state[:, h : 2 * h] + 1e-16).unsqueeze(-1)
        return torch.cat([agg.reshape(n, self.channels), state[:, end:]], dim=1)

    def fold(self, rows: Tensor, group: Tensor, num: int) -> Tensor:
        """Rows grouped by `group` (0..num-1, every group non-empty) merged and finalized, one
        row per group: what `combine` gives each group's rows, for a merge that holds many
        nodes' relation outputs in one matrix (engine.typed_merge)."""
        if self.name != "softmax":
            raise ValueError(f"fold is for the softmax across relations, not {self.name!r}")
        h, n, c = self.heads, rows.shape[0], self.channels // self.heads
        end = 2 * h + self.channels
        mx_rows = rows[:, :h]
        mx = torch.full((num, h), -math.inf, dtype=rows.dtype)
        mx = mx.scatter_reduce(0, group.view(-1, 1).expand(-1, h), mx_rows, reduce="amax")
        scale = torch.exp(mx_rows - mx.index_select(0, group)).masked_fill(mx_rows == -math.inf, 0.0)
        s = torch.zeros(num, h, dtype=rows.dtype).index_add_(0, group, rows[:, h : 2 * h] * scale)
        w_rows = (rows[:, 2 * h : end].view(n, h, c) * scale.unsqueeze(-1)).view(n, self.channels)
        w = torch.zeros(num, self.channels, dtype=rows.dtype).index_add_(0, group, w_rows)
        first = torch.full((num,), n, dtype=torch.long).scatter_reduce(0, group, torch.arange(n), reduce="amin")
        carried = rows[first, end:]
        return self._softmax_divide(torch.cat([mx, s, w, carried], dim=1))

    def combine(self, outputs: list[Tensor], order: list[int] | None = None) -> Tensor:
        """All relation outputs merged (in `order`, a permutation: the result does not depend on it)."""
        order = list(range(len(outputs))) if order is None else order
        state = self.state(outputs[order[0]])
        for i in order[1:]:
            state = self.merge(state, self.state(outputs[i]))
        return self.finalize(state)


def _relation_aggregator(aggr: str, convs: Mapping[EdgeType, MergeableConv]) -> RelationAggregator:
    """The round's cross-relation aggregation; `softmax` exactly when every relation gives HGT's
    partial softmax states (module doc), with their heads and widths, which must agree."""
    states = [isinstance(c, HGTRelationLayer) for c in convs.values()]
    if aggr != "softmax":
        if any(states):
            raise ValueError("HGT relations give partial softmax states: their round's aggregation must be softmax")
        return RelationAggregator(aggr)
    if not all(states):
        raise ValueError("the softmax across relations merges HGT relations only")
    shapes = {(c.heads, c.channels) for c in convs.values() if isinstance(c, HGTRelationLayer)}
    if len(shapes) != 1:
        raise ValueError(f"HGT relations of one round have different heads / widths {sorted(shapes)}")
    ((heads, channels),) = shapes
    return RelationAggregator("softmax", heads=heads, channels=channels)


def _stacks(configs: Mapping[str, list], what: str) -> dict[str, NodeOpStack]:
    if not isinstance(configs, Mapping):
        raise ValueError(f"{what} must map node types to node-op lists")
    return {check_type_name(t): NodeOpStack(ops) for t, ops in configs.items()}


class HeteroRound(torch.nn.Module):
    """One round of a typed model (module doc), built from its JSON config plus a state_dict, or
    from already built modules (`convs`: edge type -> conv; `keep`, `post`: type -> NodeOpStack)."""

    def __init__(
        self,
        config: dict | None = None,
        *,
        convs: Mapping[EdgeType, MergeableConv] | None = None,
        aggr: str = "sum",
        keep: Mapping[str, NodeOpStack] | None = None,
        post: Mapping[str, NodeOpStack] | None = None,
    ):
        super().__init__()
        if config is not None:
            if not isinstance(config, dict) or not isinstance(config.get("convs"), dict):
                raise ValueError("a typed round's config needs 'convs' (relation key -> conv config)")
            convs = {parse_edge_key(k): build_conv(c) for k, c in config["convs"].items()}
            aggr = config.get("aggr", "sum")
            keep = _stacks(config.get("keep", {}), "keep")
            post = _stacks(config.get("post", {}), "post")
        if not convs:
            raise ValueError("a typed round needs at least one relation")
        self.relation_aggr = _relation_aggregator(aggr, convs)
        self.edge_types: list[EdgeType] = [tuple(e) for e in convs]  # type: ignore[misc]
        for s, r, d in self.edge_types:
            check_type_name(s), check_type_name(r, "relation"), check_type_name(d)
        self.convs = torch.nn.ModuleDict({edge_key(e): c for e, c in convs.items()})
        self.keep = torch.nn.ModuleDict(dict(keep or {}))
        self.post = torch.nn.ModuleDict(dict(post or {}))
        for e, conv in convs.items():
            self._check_relation(e, conv)
        targets = set(self.dst_types)
        both = targets & set(self.keep)
        if both:
            raise ValueError(f"types {sorted(both)} are both relation destinations and kept in one round")

    @staticmethod
    def _check_relation(edge_type: EdgeType, conv: MergeableConv) -> None:
        """Refuse what a bipartite relation cannot run (module doc), naming the relation."""
        if edge_type[0] == edge_type[2]:
            return
        name = f"relation {edge_type} ({conv.kind})"
        if conv.self_loops != "none":
            raise UnsupportedModelError(f"{name}: self loops ({conv.self_loops}) between two node types do not exist")
        if conv.required_stats:
            raise UnsupportedModelError(
                f"{name}: needs node statistics {list(conv.required_stats)}, defined on one node set only"
            )
        if not conv.edge_mergeable:
            raise UnsupportedModelError(f"{name}: a whole-neighbourhood (generic) layer runs on one node set only")
        if len(expand_passes(conv)) != 1:
            raise UnsupportedModelError(
                f"{name}: takes several passes over the edges, which only a relation within one type supports"
            )
        if conv.edge_attr_dim:
            raise UnsupportedModelError(f"{name}: edge features on typed relations are not supported yet")

    # -- structure -------------------------------------------------------------------------
    @property
    def dst_types(self) -> list[str]:
        """The types relations of this round point into, in first-relation order."""
        return list(dict.fromkeys(d for _, _, d in self.edge_types))

    @property
    def out_types(self) -> list[str]:
        """The types this round gives a value: relation destinations, then kept types."""
        return self.dst_types + [t for t in self.keep if t not in self.dst_types]

    def conv(self, edge_type: EdgeType) -> MergeableConv:
        return cast(MergeableConv, self.convs[edge_key(edge_type)])

    def conv_items(self) -> list[tuple[EdgeType, MergeableConv]]:
        return [(e, self.conv(e)) for e in self.edge_types]

    def config(self) -> dict:
        return {
            "convs": {edge_key(e): c.config() for e, c in self.conv_items()},
            "aggr": self.relation_aggr.name,
            "keep": {t: cast(NodeOpStack, s).config() for t, s in self.keep.items()},
            "post": {t: cast(NodeOpStack, s).config() for t, s in self.post.items()},
        }

    def out_dims(self, in_dims: Mapping[str, int], index: int = 0) -> dict[str, int]:
        """Each output type's width given the round's input widths; ValueError naming the
        relation or type whose width does not fit."""
        dims: dict[str, int] = {}
        for (s, r, d), conv in self.conv_items():
            for t in (s, d):
                if t not in in_dims:
                    raise ValueError(f"round {index}: relation {(s, r, d)} reads type {t!r}, which has no value here")
                if in_dims[t] != conv.in_dim:
                    raise ValueError(
                        f"round {index}: relation {(s, r, d)} ({conv.kind}) expects width {conv.in_dim}, "
                        f"type {t!r} has {in_dims[t]}"
                    )
            if dims.setdefault(d, conv.out_dim) != conv.out_dim:
                raise ValueError(
                    f"round {index}: relations into {d!r} give widths {dims[d]} and {conv.out_dim}; "
                    f"the {self.relation_aggr.name} across relations needs one"
                )
        dims = {t: self.relation_aggr.out_width(w) for t, w in dims.items()}
        for t, stack in self.keep.items():
            if t not in in_dims:
                raise ValueError(f"round {index}: keeps type {t!r}, which has no value here")
            dims[t] = cast(NodeOpStack, stack).out_dim(in_dims[t])
        for t, stack in self.post.items():
            if t not in dims:
                raise ValueError(f"round {index}: post ops for type {t!r}, which the round gives no value")
            dims[t] = cast(NodeOpStack, stack).out_dim(dims[t])
        return dims

    # -- execution -------------------------------------------------------------------------
    def forward(
        self,
        h: Mapping[str, Tensor],
        edge_index: Mapping[EdgeType, Tensor],
        parts: int = 1,
        seed: int = 0,
        pre_transform: bool | None = None,
    ) -> dict[str, Tensor]:
        """The round over typed rows `h` and each relation's [2, E] edge list (per-type ids):
        every relation's conv propagated with its in-edges split over `parts` random partitions,
        the outputs merged across relations in a random order, then keep and post ops."""
        gen = torch.Generator().manual_seed(int(seed))
        outputs: dict[str, list[Tensor]] = {}
        for i, (e, conv) in enumerate(self.conv_items()):
            s, _, d = e
            ei = edge_index[e]
            x = h[s]
            for j, step in enumerate(expand_passes(conv) if s == d else [conv]):
                pre = choose_pre_transform(step) if pre_transform is None else bool(pre_transform)
                x = propagate(
                    step,
                    x,
                    ei[0],
                    ei[1],
                    parts=parts,
                    seed=seed * 1000003 + i * 101 + j,
                    pre_transform=pre,
                    h_dst=None if s == d else h[d],
                )
            outputs.setdefault(d, []).append(x)
        out: dict[str, Tensor] = {}
        for t, outs in outputs.items():
            order = torch.randperm(len(outs), generator=gen).tolist()
            out[t] = self.relation_aggr.combine(outs, order)
        for t, stack in self.keep.items():
            out[t] = stack(h[t])
        for t, stack in self.post.items():
            out[t] = stack(out[t])
        return out
