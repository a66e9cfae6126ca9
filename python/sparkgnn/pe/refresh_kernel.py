"""One layer of an incremental PE refresh: which vertices change, and their new state and h.

WHY a refresh can touch only the change: h^(l) of a vertex depends on its own h^(l-1), its node
statistics (GCN degrees) and the messages of its in-edges; the PE store keeps each vertex's
MERGED aggregation state in raw message space. After a graph update, vertex t must be recomputed
at layer l iff one of those inputs changed:

    src_changed_l  = changed_{l-1} + vertices whose statistics changed + inserted vertices
                     (everything a vertex's OUT-messages are made of; a statistic over
                     OUT-edges, ChebConv's degree, changes at the source of a changed edge)
    targets_l      = src_changed_l + dst of inserted / deleted edges + out(src_changed_l)

A target is recomputed in one of two ways:

    delta    stored state, merged with the NEW messages of its inserted in-edges and of the kept
             in-edges whose source changed, and the NEGATED OLD messages of its deleted in-edges
             and of those same changed kept in-edges (old values, old statistics);
    scratch  from all of its in-edges in the updated graph (the self-loop policy applied), when
             the aggregator cannot remove a message (max, min, softmax), the vertex is new (no
             stored state), the message reads the destination (GAT) and the destination changed,
             or one of its own self-loops was inserted or deleted (self-loop policies rebuild
             every loop of a vertex from its existing ones).

Self-loops under a policy ("remaining", "replace") leave the regular edge logic: the policy keeps
exactly one loop per vertex, whose message changes when the vertex's own source side changes, so
a delta target with a changed source side swaps its OLD loop message for its NEW one. Under
"remove" (ChebConv) the graph's loops carry no message at all: they leave the edge logic too.

Edge attributes: a conv with `edge_attr_dim` reads the edges' attribute rows [E, D] where another
reads weights (layers/base.py), so a Side carries them in its `weight` slot and every edge list
below moves them with the edges. The "replace_mean" policy (GAT / GATv2 with edge_dim) gives a
vertex's loop the mean of its in-edges' attributes, which any changed in-edge moves; those convs
aggregate with softmax, which takes no delta, so their targets are recomputed from scratch, over
all their in-edges, loops included.

Edges are in the updated graph's layout of graph.updates.apply: kept edges first (position i is
the old graph's edge `kept_edges[i]`), inserted edges after them. The integer bookkeeping finds
the edges named above through the sides' EdgeIndex (pe/edge_index.py: a vertex's in- and
out-edges, kept up to date by the follower from each batch's change alone), or, without one, by
numpy masks over all edges (O(E), far cheaper than messages, but the whole cost of a small batch
at millions of edges); message computation runs only over the edges named above.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from sparkgnn import npsets
from sparkgnn.layers.base import compute_stats
from sparkgnn.layers.selfloops import apply_policy_to_targets, apply_self_loops
from sparkgnn.pe.edge_index import EdgeIndex


class GraphStats:
    """Node statistics of whole graphs (GCN's degrees), computed once per (graph, statistic) and
    kept for the last `keep` graphs asked about. WHY: a refresh reads the old and the new graph's
    statistics at every layer, and a follower's next batch reads this batch's new graph as its
    old one; each is a pass over every edge, the bulk of a small batch's work when recomputed for
    every layer and side (docs/ARCHITECTURE.md, the follower). A graph is a value (graph.updates.apply returns
    a new one and never edits its arrays), so the object itself is the key; the entries hold it,
    so its id cannot be reused while they are kept."""

    #: statistics `follow` carries from a graph to its update without a pass over every edge:
    #: unweighted counts, exact in float32 below 2^24 (GCN's degree: a vertex's in-edges that are
    #: not loops, plus the one loop add_remaining_self_loops leaves it)
    DERIVED = ("gcn_degree",)

    def __init__(self, keep: int = 2):
        self.keep = int(keep)
        self._graphs: list[tuple[object, dict]] = []  # (graph, {(statistic, weighted): tensor}), oldest first

    def _table(self, graph) -> dict:
        table = next((t for g, t in self._graphs if g is graph), None)
        if table is None:
            table = {}
            self._graphs = [*self._graphs, (graph, table)][-self.keep :]
        return table

    def follow(self, old_graph, applied) -> None:
        """Give applied.graph (old_graph updated) the unweighted DERIVED statistics old_graph has
        here, from those and the change alone: O(N + change) instead of a pass over every edge.
        The kept vertices keep their count less the removed edges' and plus the inserted edges'
        (loops excepted), an inserted vertex starts at its one loop."""
        old = next((t for g, t in self._graphs if g is old_graph), None)
        new_graph = applied.graph
        new = next((t for g, t in self._graphs if g is new_graph), {})
        keys = [key for key in (old or {}) if key[0] in self.DERIVED and not key[1] and key not in new]
        if old is None or not keys:
            return
        table = self._table(new_graph)
        kept = applied.old_rows >= 0
        removed = np.asarray(applied.removed_edges, np.int64)
        r_src, r_dst = old_graph.edge_src[removed], old_graph.edge_dst[removed]
        r_to = applied.new_rows[r_dst[r_src != r_dst]]
        inserted = np.asarray(applied.inserted_edges, np.int64)
        i_src, i_dst = new_graph.edge_src[inserted], new_graph.edge_dst[inserted]
        n = new_graph.num_nodes
        delta = np.bincount(i_dst[i_src != i_dst], minlength=n) - np.bincount(r_to[r_to >= 0], minlength=n)
        for key in keys:
            counts = np.ones(n, np.int64)
            counts[kept] = old[key].numpy()[applied.old_rows[kept]].astype(np.int64)
            table[key] = torch.from_numpy((counts + delta).astype(np.float32))

    def of(self, conv, graph) -> dict:
        """conv's statistics of every vertex of `graph`, as compute_stats gives them."""
        table = self._table(graph)
        weighted = bool(conv.uses_edge_weight and graph.weight is not None and not conv.edge_attr_dim)
        missing = [name for name in conv.required_stats if (name, weighted) not in table]
        if missing:

            def tensor(a):
                return torch.from_numpy(np.require(a, requirements="W"))  # Arrow-backed arrays are read-only

            w = tensor(graph.weight) if weighted else None
            src, dst = tensor(graph.edge_src), tensor(graph.edge_dst)
            for name in missing:
                table[(name, weighted)] = compute_stats(conv, src, dst, w, graph.num_nodes, names=[name])[name]
        return {name: table[(name, weighted)] for name in conv.required_stats}


@dataclass
class Side:
    """One graph (old or new) as a layer sees it: edges (dense rows), weights as the conv uses
    them (the [E, D] edge attributes for a conv that reads them), the conv's statistics of every
    vertex, and a function giving h^(l-1) of rows. `index`: the graph's EdgeIndex
    (pe/edge_index.py), which the planning reads a vertex's in- and out-edges from instead of
    passing over every edge (None: it passes over them)."""

    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray | None
    stats: dict
    values: Callable[[np.ndarray], torch.Tensor]  # h^(l-1) of rows
    index: EdgeIndex | None = None

    @classmethod
    def of(cls, conv, graph, values, *, index: EdgeIndex | None = None, stats: GraphStats | None = None) -> Side:
        """`graph` as `conv` sees it; `stats`: where its statistics are computed once and kept
        (a fresh GraphStats when None)."""
        w = graph.weight if conv.uses_edge_weight else None
        if conv.edge_attr_dim:
            w = getattr(graph, "edge_attr", None)
            if w is None:
                raise ValueError(f"{conv.kind} reads edge attributes (edge_attr), but graph {graph.name!r} has none")
        if index is not None and (index.num_edges != graph.num_edges or index.num_nodes != graph.num_nodes):
            raise ValueError(
                f"Side.of: the EdgeIndex given ({index.num_nodes} vertices, {index.num_edges} edges) is not "
                f"graph {graph.name!r}'s ({graph.num_nodes}, {graph.num_edges})"
            )
        return cls(graph.edge_src, graph.edge_dst, w, (stats or GraphStats()).of(conv, graph), values, index)

    def stats_of(self, rows: np.ndarray) -> dict:
        index = torch.from_numpy(rows)
        return {name: value[index].to(torch.float32) for name, value in self.stats.items()}


@dataclass
class LayerChange:
    """What one layer of a refresh recomputed (new-graph rows) and how."""

    targets: np.ndarray
    h: torch.Tensor
    state: torch.Tensor
    delta: int
    scratch: int
    new_messages: int
    old_messages: int


def _member(mask_size: int, rows: np.ndarray) -> np.ndarray:
    mask = np.zeros(mask_size, bool)
    mask[rows] = True
    return mask


def stats_changed(old: Side, new: Side, old_rows: np.ndarray) -> np.ndarray:
    """New-graph rows whose statistics differ from their old ones (inserted rows count)."""
    n = len(old_rows)
    changed = old_rows < 0
    kept = ~changed
    for name, value in new.stats.items():
        before = old.stats[name][torch.from_numpy(old_rows[kept])].numpy()
        changed[kept] |= value.numpy()[kept] != before
    return np.flatnonzero(changed) if n else np.zeros(0, np.int64)


def _messages(conv, side: Side, src, dst_pos, weight, dst_payload) -> torch.Tensor:
    """Messages of edges src -> target position `dst_pos` with `side`'s values and statistics."""
    uniq, inv = np.unique(src, return_inverse=True)
    payload = conv.prepare_src(side.values(uniq), side.stats_of(uniq), False)[torch.from_numpy(inv)]
    w = None if weight is None else torch.from_numpy(np.ascontiguousarray(weight, np.float32))
    d = None if dst_payload is None else dst_payload[torch.from_numpy(dst_pos)]
    return conv.message(payload, d, w, False)


def _loop_weights(conv, side: Side, nodes: np.ndarray) -> np.ndarray | None:
    """Weight of the one loop the conv's self-loop policy leaves on each of the sorted `nodes`
    (from their existing loops in `side`), or None for an unweighted conv."""
    if side.weight is None:
        return None
    if side.index is not None:
        edges = side.index.in_edges(nodes)
        loops = edges[side.src[edges] == side.dst[edges]]
    else:
        loops = np.flatnonzero((side.src == side.dst) & np.isin(side.dst, nodes))
    local = torch.from_numpy(np.searchsorted(nodes, side.src[loops]))
    weight = torch.from_numpy(np.ascontiguousarray(side.weight[loops], np.float32))
    s, _d, w = apply_self_loops(local, local, weight, len(nodes), conv.self_loops)
    assert w is not None  # a policy keeps weights when given some
    out = np.ones((len(nodes), *side.weight.shape[1:]), np.float32)
    out[s.numpy()] = w.numpy()
    return out


def _scratch_edges(conv, new: Side, targets: np.ndarray, num_new: int):
    """All in-edges of `targets` in the new graph with the self-loop policy applied: (source row,
    target position, weight or None)."""
    if new.index is not None:
        sel = new.index.in_edges(targets)
    else:
        sel = np.flatnonzero(_member(num_new, targets)[new.dst])
    src, dst = new.src[sel], new.dst[sel]
    w = None if new.weight is None else new.weight[sel]
    tgt = np.searchsorted(targets, dst)
    return apply_policy_to_targets(src, tgt, w, targets, conv.self_loops)


def _positions(targets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return np.searchsorted(targets, rows)


@dataclass
class LayerPlan:
    """The integer half of a layer's refresh: which targets, how each is recomputed, and which
    messages that takes. WHY apart from the computation: a partitioned refresh (engine/refresh)
    plans first to learn which h^(l-1) values and stored states its partition needs, fetches
    only those, and then computes."""

    targets: np.ndarray  # sorted new rows recomputed
    scratch: np.ndarray  # bool [targets]: recomputed from all in-edges (else by delta)
    delta_targets: np.ndarray
    scratch_edges: tuple  # (new src rows, new dst rows, weight) of the scratch targets' in-edges
    added: tuple  # (new src rows, new dst rows, weight): messages merged into delta targets
    removed: tuple  # (old src rows, new dst rows, weight): messages negated out of delta targets
    loops_new: tuple  # (new rows, loop weights): each changed delta target's new policy loop
    loops_old: tuple  # (old rows, new rows, loop weights): its old policy loop, negated

    def new_rows_needed(self) -> np.ndarray:
        """New-graph rows whose h^(l-1) (new) the computation reads."""
        return npsets.unique(np.concatenate([self.targets, self.scratch_edges[0], self.added[0], self.loops_new[0]]))

    def old_rows_needed(self) -> np.ndarray:
        """Old-graph rows whose h^(l-1) (old) the computation reads."""
        return npsets.unique(np.concatenate([self.removed[0], self.loops_old[0]]))

    def state_rows_needed(self, old_rows: np.ndarray) -> np.ndarray:
        """Old-graph rows whose stored state of layer l the computation merges into."""
        return old_rows[self.delta_targets]


def plan_layer(conv, old: Side, new: Side, applied, changed_prev: np.ndarray, owned=None) -> LayerPlan:
    """Plan layer l (module doc). `changed_prev`: sorted new-graph rows whose h^(l-1) changed;
    `owned`: bool mask over new rows, the only rows that may become targets (a partition of a
    partitioned refresh recomputes only the vertices it owns; None: every row)."""
    agg = conv.aggregator
    old_rows, new_rows = applied.old_rows, applied.new_rows
    n_new = len(old_rows)
    kept = len(applied.kept_edges)
    inserted = np.arange(kept, len(new.src), dtype=np.int64)
    removed = np.asarray(applied.removed_edges, np.int64)
    # a policy that keeps one loop per vertex ("remaining", "replace") vs one that drops them
    # all ("remove": ChebConv): both take the graph's loops out of the regular edge logic
    looped = conv.self_loops not in ("none", "remove")
    drops_loops = conv.self_loops != "none"

    src_changed = npsets.union(changed_prev, stats_changed(old, new, old_rows))
    src_changed_mask = _member(n_new, src_changed)
    removed_dst = new_rows[old.dst[removed]]
    removed, removed_dst = removed[removed_dst >= 0], removed_dst[removed_dst >= 0]
    if new.index is not None:
        kept_changed = new.index.out_edges(src_changed)
        kept_changed = kept_changed[kept_changed < kept]
    else:
        kept_changed = np.flatnonzero(src_changed_mask[new.src[:kept]])
    targets = npsets.unique(np.concatenate([src_changed, new.dst[inserted], removed_dst, new.dst[kept_changed]]))
    if owned is not None:
        targets = targets[owned[targets]]
    t = len(targets)

    scratch = np.zeros(t, bool) if agg.invertible else np.ones(t, bool)
    scratch |= old_rows[targets] < 0
    if conv.needs_dst_in_message:
        scratch |= src_changed_mask[targets]  # its own value or statistics changed
    if looped:
        new_loops = new.dst[inserted][new.src[inserted] == new.dst[inserted]]
        old_loops = removed_dst[old.src[removed] == old.dst[removed]]
        scratch |= np.isin(targets, np.concatenate([new_loops, old_loops]))
    delta_targets = targets[~scratch]
    delta_mask = _member(n_new, delta_targets)

    scratch_targets = targets[scratch]
    if len(scratch_targets):
        s, local, w = _scratch_edges(conv, new, scratch_targets, n_new)
        scratch_edges = (np.asarray(s, np.int64), scratch_targets[local], w)
    else:
        scratch_edges = (np.zeros(0, np.int64), np.zeros(0, np.int64), None)

    def regular(edges: np.ndarray, dst_rows: np.ndarray, src_rows: np.ndarray) -> np.ndarray:
        keep = delta_mask[dst_rows]
        if drops_loops:
            keep &= src_rows != dst_rows  # the policy's loops are handled below (none under "remove")
        return edges[keep]

    def weights(side: Side, edges: np.ndarray):
        return None if side.weight is None else side.weight[edges]

    ins = regular(inserted, new.dst[inserted], new.src[inserted])
    changed = regular(kept_changed, new.dst[kept_changed], new.src[kept_changed])
    gone = regular(removed, removed_dst, new_rows[old.src[removed]])
    both = np.concatenate([ins, changed])
    old_edges = np.concatenate([applied.kept_edges[changed], gone])
    old_dst = np.concatenate([new.dst[changed], new_rows[old.dst[gone]]])
    nodes = delta_targets[src_changed_mask[delta_targets]] if looped else np.zeros(0, np.int64)
    old_nodes = old_rows[nodes]
    return LayerPlan(
        targets=targets,
        scratch=scratch,
        delta_targets=delta_targets,
        scratch_edges=scratch_edges,
        added=(new.src[both], new.dst[both], weights(new, both)),
        removed=(old.src[old_edges], old_dst, weights(old, old_edges)),
        loops_new=(nodes, _loop_weights(conv, new, nodes) if looped else None),
        loops_old=(old_nodes, nodes, _loop_weights(conv, old, old_nodes) if looped else None),
    )


@torch.no_grad()
def compute_layer(
    conv, post, plan: LayerPlan, old: Side, new: Side, old_rows: np.ndarray, stored_states
) -> LayerChange:
    """Recompute the planned targets: `stored_states(old rows)` -> their stored merged states of
    layer l; `post(h)`: the model's node-wise ops after this conv. Returns the targets with their
    new h^(l) and state."""
    agg, targets = conv.aggregator, plan.targets
    t = len(targets)
    h_dst = new.values(targets)
    stats_dst = new.stats_of(targets)
    dst_payload = conv.prepare_dst(h_dst, stats_dst)  # a delta target's destination did not change
    width = conv.msg_width(False)
    parts, index = [], []
    counts = {"new": 0, "old": 0}

    def add(side: Side, src, dst_rows, weight, negate: bool) -> None:
        if not len(src):
            return
        pos = _positions(targets, dst_rows)
        m = _messages(conv, side, src, pos, weight, dst_payload)
        part = agg.partial(m, torch.from_numpy(pos), t)
        parts.append(agg.negate(part) if negate else part)
        index.append(torch.arange(t))
        counts["old" if negate else "new"] += len(src)

    for side, (src, dst_rows, weight), negate in (
        (new, plan.scratch_edges, False),
        (new, plan.added, False),
        (old, plan.removed, True),
        (new, (plan.loops_new[0], *plan.loops_new), False),
        (old, plan.loops_old, True),
    ):
        add(side, src, dst_rows, weight, negate)

    delta_pos = np.flatnonzero(~plan.scratch)
    if len(delta_pos):
        parts.append(stored_states(old_rows[plan.delta_targets]))
        index.append(torch.from_numpy(delta_pos))
    if parts:
        state = agg.merge(torch.cat(parts), torch.cat(index), t)
    else:
        state = agg.identity(t, width)
    h = post(conv.update(h_dst, agg.finalize(state), stats_dst, False))
    scratch = int(plan.scratch.sum())
    return LayerChange(targets, h, state, t - scratch, scratch, counts["new"], counts["old"])


def refresh_layer(conv, post, old: Side, new: Side, applied, changed_prev: np.ndarray, stored_states) -> LayerChange:
    """Plan and compute layer l over the whole graph (the single-machine refresh)."""
    plan = plan_layer(conv, old, new, applied, changed_prev)
    return compute_layer(conv, post, plan, old, new, applied.old_rows, stored_states)
