"""MergeableConv: a graph convolution decomposed into the DL engine's contract

    prepare_src(h) / prepare_dst(h)  per node, where the node's row lives
    message(src_e, dst_e, weight_e)  per edge, wherever the edge lives
    aggregator.partial / merge / finalize   (see aggregators.py)
    update(h_dst, agg)               per destination node, after the merge

WHY this split: the executor moves node payloads to edges (join, replication or combiner plans),
reduces edges partition by partition and merges the partial states, so every piece must be
computable with only the data that is local at that step. Anything that depends on the
destination alone (GCN's dst normalisation, bias, root weight, GIN's MLP, GAT's head
concatenation) is moved out of the message into `update`, which keeps messages free of
destination payloads whenever the layer allows it (only GAT needs one).

`pre_transform` selects transform-then-propagate: the layer's first linear map is applied in
`prepare_src` (so the payload shipped to edges has the output width) instead of in `update`.
It is exact only when the aggregation commutes with a linear map (sum, mean) or when the layer
applies the map before the message anyway (GAT). It is a request: a layer with
`can_pre_transform == False` ignores it and behaves as in raw mode, so widths reported for
"pre_transform" are then the raw ones.

`stats` (dict name -> Tensor[rows]) is always row-aligned with the `h` / `h_dst` it is passed
with: the executor joins the per-node statistics of STATS onto node rows before calling.

Edge attributes: a conv with `edge_attr_dim` D > 0 reads PyG's `edge_attr` instead of edge weights.
The per-edge slot of `message(src_e, dst_e, weight_e, pre)` then carries the edges' attribute rows
[E, D] (float32), so every executor ships them exactly where it ships a weight (with the edge), and
its self-loop policy gives the added loops their attributes (layers/selfloops.py, `replace_mean`).

Convolutions register themselves in `CONVS` by kind, and rebuild from `config()` (JSON) plus a
state_dict, which is how saved models are loaded without pickling code.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers.aggregators import Aggregator
from sparkgnn.layers.selfloops import apply_self_loops
from sparkgnn.layers.stats import STATS
from sparkgnn.registry import Registry

CONVS: Registry[type] = Registry("conv kind", ValueError)


def register_conv(kind: str):
    def deco(cls):
        cls.kind = kind
        return CONVS.register(kind, cls)

    return deco


def build_conv(config: dict) -> MergeableConv:
    cfg = dict(config)
    kind = cfg.pop("kind")
    return CONVS.lookup(kind)(**cfg)


class MergeableConv(torch.nn.Module):
    kind: str = ""
    in_dim: int
    out_dim: int
    aggregator: Aggregator
    self_loops: str = "none"
    uses_edge_weight: bool = False
    # width of the edge attributes the messages read (0: none); module doc
    edge_attr_dim: int = 0
    required_stats: tuple = ()
    needs_dst_in_message: bool = False
    can_pre_transform: bool = False
    # False for a layer that runs as a whole over each destination's in-edges (the generic
    # fallback, layers/generic.py): it has no partial states, so its in-edges are never split;
    # propagate then calls its `by_destinations`, and aggregate_state refuses it.
    edge_mergeable: bool = True

    # -- description -----------------------------------------------------------------------
    def config(self) -> dict:
        """JSON-able constructor arguments (plus "kind"); weights travel in the state_dict."""
        raise NotImplementedError

    def _pre(self, pre_transform: bool) -> bool:
        return bool(pre_transform) and self.can_pre_transform

    def src_width(self, pre_transform: bool) -> int:
        raise NotImplementedError

    def dst_width(self) -> int:
        return 0

    def msg_width(self, pre_transform: bool) -> int:
        return self.src_width(pre_transform)

    def state_width(self, pre_transform: bool) -> int:
        return self.aggregator.state_width(self.msg_width(pre_transform))

    def plan_info(self) -> dict:
        """Pure data (ints, strings, bools, lists) for the torch-free planner."""
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "aggregator": self.aggregator.name,
            "aggregator_options": self.aggregator.config(),
            "aggregator_linear": self.aggregator.linear,
            "src_width": {"raw": self.src_width(False), "pre_transform": self.src_width(True)},
            "dst_width": self.dst_width(),
            "msg_width": {"raw": self.msg_width(False), "pre_transform": self.msg_width(True)},
            "state_width": {"raw": self.state_width(False), "pre_transform": self.state_width(True)},
            "needs_dst_in_message": self.needs_dst_in_message,
            "can_pre_transform": self.can_pre_transform,
            "self_loops": self.self_loops,
            "uses_edge_weight": self.uses_edge_weight,
            "edge_attr_dim": self.edge_attr_dim,
            "required_stats": list(self.required_stats),
            "decomposable": True,
            # passes over the in-edges (Aggregator.phases): an engine round runs one, so a layer
            # with more is expanded into one round per pass first (layers/phases.py, Model)
            "phases": self.aggregator.phases,
            # weight x source payload: an engine without this layer's code can form the messages
            "message_scaled": bool(self.message_scale(None, False)[0]),
        }

    # -- the contract ----------------------------------------------------------------------
    def prepare_src(self, h: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        raise NotImplementedError

    def prepare_dst(self, h: Tensor, stats: dict) -> Tensor | None:
        return None

    def message(self, src_e: Tensor, dst_e: Tensor | None, weight_e: Tensor | None, pre_transform: bool) -> Tensor:
        raise NotImplementedError

    def update(self, h_dst: Tensor, agg: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        raise NotImplementedError

    def message_scale(self, weight_e: Tensor | None, pre_transform: bool):
        """(True, scale) when message(src_e, ...) == scale[:, None] * src_e (scale None meaning 1)
        for this layer, i.e. the message needs neither the destination nor a non-linearity; then an
        executor may aggregate with a sparse matrix product. (False, None) otherwise."""
        return False, None

    # -- reference single-process execution of the contract --------------------------------
    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        edge_weight: Tensor | None = None,
        parts: int = 1,
        seed: int = 0,
        pre_transform: bool = False,
        edge_attr: Tensor | None = None,
    ) -> Tensor:
        return propagate(
            self,
            x,
            edge_index[0],
            edge_index[1],
            edge_weight,
            parts=parts,
            seed=seed,
            pre_transform=pre_transform,
            edge_attr=edge_attr,
        )


def compute_stats(
    conv: MergeableConv, src: Tensor, dst: Tensor, weight: Tensor | None, num_nodes: int, names=None
) -> dict:
    """conv's node statistics (`names`: only those of them) over the edges src -> dst."""
    w = weight if conv.uses_edge_weight else None
    wanted = conv.required_stats if names is None else names
    return {name: STATS.lookup(name)(src, dst, w, num_nodes) for name in wanted}


def edge_values(conv: MergeableConv, weight, edge_attr) -> Tensor | None:
    """What the conv's messages read per edge: the [E, D] attribute rows for a conv with
    `edge_attr_dim` (refused when missing or of another width), the weights for one that uses
    them, else None."""
    if conv.edge_attr_dim:
        if edge_attr is None:
            raise ValueError(
                f"{conv.kind}: this layer reads edge attributes (edge_attr, width {conv.edge_attr_dim}); none given"
            )
        attr = torch.as_tensor(edge_attr)
        attr = attr.view(-1, 1) if attr.dim() == 1 else attr
        if attr.dim() != 2 or attr.shape[1] != conv.edge_attr_dim:
            raise ValueError(
                f"{conv.kind}: edge_attr has shape {tuple(attr.shape)}, expected [E, {conv.edge_attr_dim}]"
            )
        return attr
    return None if weight is None or not conv.uses_edge_weight else torch.as_tensor(weight)


def _layer_inputs(conv: MergeableConv, h: Tensor, src, dst, weight, stats, pre_transform, edge_attr=None, h_dst=None):
    """What every execution of a layer starts from: node statistics, the edge list after the
    self-loop policy, the effective pre-transform flag and the src / dst node payloads.
    `h_dst`: the destination rows of a bipartite relation (sources `h`, another node type); such
    a relation has neither self loops nor node statistics (their rows would be the sources')."""
    src = torch.as_tensor(src, dtype=torch.long)
    dst = torch.as_tensor(dst, dtype=torch.long)
    w_in = edge_values(conv, weight, edge_attr)
    if h_dst is not None:
        if conv.self_loops != "none" or conv.required_stats:
            what = f"self loops ({conv.self_loops})" if conv.self_loops != "none" else f"{list(conv.required_stats)}"
            raise UnsupportedModelError(
                f"{conv.kind}: a relation between two node types has no {what}; only a relation within one type does"
            )
        edges = (src, dst, w_in)
        return (
            {},
            edges,
            conv._pre(pre_transform),
            conv.prepare_src(h, {}, conv._pre(pre_transform)),
            conv.prepare_dst(h_dst, {}),
        )
    if stats is None:
        stats = compute_stats(conv, src, dst, None if conv.edge_attr_dim else w_in, h.shape[0])
    edges = apply_self_loops(src, dst, w_in, h.shape[0], conv.self_loops)
    pre = conv._pre(pre_transform)
    return stats, edges, pre, conv.prepare_src(h, stats, pre), conv.prepare_dst(h, stats)


def propagate(
    conv: MergeableConv,
    h: Tensor,
    src: Tensor,
    dst: Tensor,
    weight: Tensor | None = None,
    *,
    parts: int = 1,
    seed: int = 0,
    pre_transform: bool = False,
    stats: dict | None = None,
    edge_attr: Tensor | None = None,
    h_dst: Tensor | None = None,
) -> Tensor:
    """Run one layer exactly the way a distributed executor would: self-loop policy, node
    statistics, node payloads, edges dealt at random (seeded) into `parts` partitions, a partial
    state per partition over the destinations it touches, all partial states merged in a random
    order, finalize, update. With any `parts` the result must equal PyG's forward.

    A multi-pass aggregator (Aggregator.phases > 1, e.g. the normalized moments) runs every pass
    over the SAME partitioning, each with its own random merge order; between passes each
    destination's finalized result is gathered to its edges (`context`, OMEGA's AllGather) and
    fed to the next pass through `phase_message`. So partition-independence is tested the same way
    for one pass or several.

    `h_dst`: a bipartite relation's destination rows (a typed graph's relation between two node
    types, `h` holding the sources): the result has one row per destination."""
    if not conv.edge_mergeable:
        if h_dst is not None:
            raise UnsupportedModelError(f"layer {conv.kind} runs over one node set; not over a relation between two")
        by_destinations = getattr(conv, "by_destinations")  # noqa: B009 - only such layers define it
        return by_destinations(h, torch.as_tensor(src), torch.as_tensor(dst), parts=max(1, int(parts)), seed=seed)
    num_nodes = (h if h_dst is None else h_dst).shape[0]
    parts = max(1, int(parts))
    stats, (s, d, w), pre, xs, xd = _layer_inputs(conv, h, src, dst, weight, stats, pre_transform, edge_attr, h_dst)
    agg = conv.aggregator
    msg_w = conv.msg_width(pre)

    gen = torch.Generator().manual_seed(int(seed))
    assign = torch.randint(0, parts, (s.numel(),), generator=gen)
    pieces = []  # per non-empty partition: its edges' destinations, local dst ids, messages
    for p in range(parts):
        sel = (assign == p).nonzero().view(-1)
        if sel.numel() == 0:
            continue
        dp = d[sel]
        uniq, local = torch.unique(dp, return_inverse=True)
        m = conv.message(
            xs.index_select(0, s[sel]),
            None if xd is None else xd.index_select(0, dp),
            None if w is None else w[sel],
            pre,
        )
        if m.shape[1] != msg_w:
            raise RuntimeError(f"{conv.kind}: message width {m.shape[1]} != declared {msg_w}")
        pieces.append((dp, uniq, local, m))
    context = None
    for phase in range(agg.phases):
        stage = agg.phase(phase)
        states, rows = [], []
        for dp, uniq, local, m in pieces:
            m = agg.phase_message(phase, m, None if context is None else context.index_select(0, dp))
            states.append(stage.partial(m, local, uniq.numel()))
            rows.append(uniq)
        if states:
            order = torch.randperm(len(states), generator=gen).tolist()
            merged = stage.merge(torch.cat([states[i] for i in order]), torch.cat([rows[i] for i in order]), num_nodes)
        else:
            merged = stage.identity(num_nodes, msg_w)
        context = stage.finalize(merged)
    assert context is not None  # phases >= 1
    return conv.update(h if h_dst is None else h_dst, context, stats, pre)


def aggregate_state(
    conv: MergeableConv,
    h: Tensor,
    src: Tensor,
    dst: Tensor,
    weight: Tensor | None = None,
    *,
    stats: dict | None = None,
    pre_transform: bool = False,
    edge_attr: Tensor | None = None,
) -> Tensor:
    """The MERGED aggregation state of every node (one partial over all edges, self-loop policy
    applied): what a PE store keeps next to h^(l) so that serving can later recompute a node from
    its state merged with only the edges that changed, instead of refetching all its neighbours.
    `update(h, finalize(aggregate_state(...)), stats, pre_transform)` equals propagate(...).
    For a multi-pass aggregator it is the last pass's state (the earlier passes run first, to
    give it its per-destination context)."""
    if not conv.edge_mergeable:
        raise UnsupportedModelError(f"layer {conv.kind} keeps no aggregation state: its in-edges are never split")
    num_nodes = h.shape[0]
    stats, (s, d, w), pre, xs, xd = _layer_inputs(conv, h, src, dst, weight, stats, pre_transform, edge_attr)
    m = conv.message(xs.index_select(0, s), None if xd is None else xd.index_select(0, d), w, pre)
    agg = conv.aggregator
    context = None
    for phase in range(agg.phases - 1):
        stage = agg.phase(phase)
        edge_context = None if context is None else context.index_select(0, d)
        context = stage.finalize(stage.partial(agg.phase_message(phase, m, edge_context), d, num_nodes))
    last = agg.phases - 1
    edge_context = None if context is None else context.index_select(0, d)
    return agg.phase(last).partial(agg.phase_message(last, m, edge_context), d, num_nodes)


def choose_pre_transform(conv: MergeableConv) -> bool:
    """Default mode when the caller does not force one: transform-then-propagate when the
    layer allows it and it makes the payload shipped to edges strictly narrower."""
    return conv.can_pre_transform and conv.src_width(True) < conv.src_width(False)
