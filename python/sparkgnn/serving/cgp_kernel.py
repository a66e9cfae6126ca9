"""The computation-graph-parallelism (CGP) partition kernel (OMEGA section 6): who owns what, one
partition's share of a layer, the owners' merge, and the bytes CGP exchanges. Every executor runs
its partitions through it: in-process (delta.LayerExecutor with partitions=P), as Spark tasks and
on messenger workers (cgp_worker.partition_task, driven by spark_cgp), so they all compute the
same partial states and report the same bytes for the same request.

Ownership. With P partitions, a vertex of G belongs to partition (original id mod P) and query i
of the request to partition (i mod P). An edge is aggregated by its SOURCE's owner, from that
partition's own stored rows plus the values all-gathered to it; a target's stored state and its
merge belong to the target's owner.

Kernel. `partition_partials(conv, p, ...)` computes, for partition p and one layer:
    NEW partials   the messages of the NEW edges p owns, aggregated per target (agg.partial)
    OLD partials   the same for the OLD edges p owns (messages from stored values), negated
    stored states  the stored merged state of every from_state target p owns
as (states, index) blocks: index[i][r] is the target position of states[i][r]. Any partition
may hold rows for any target; `merge_partials` merges all blocks per target (merge is
associative and commutative, so block order changes only float summation order).

Bytes (the ONE definition every executor reports; the bytes that cross partitions in OMEGA,
whatever the executor physically ships, e.g. every block goes to the Spark driver):
    partial_bytes    a partial row of target t computed by partition p crosses partitions iff
                     owner(t) != p: row width x 4 bytes each. Partials of a partition's own
                     targets and stored states (read by their owner) cross nothing.
    allgather_bytes  after each layer every owner sends the new values of its targets to the
                     P - 1 other partitions: T x width x 4 x (P - 1) for T targets (so all
                     layers, the last included, count; 0 when P == 1).
Not counted: shipping the request's structure or jobs to the partitions, values read from a
partition's own store (Meter.bytes_fetched counts those), and the destination inputs that
destination-reading messages (GAT) need at the source's partition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from sparkgnn.layers.aggregators import as_f32

COMM_KEYS = ("partial_bytes", "allgather_bytes")


def owner_of_ids(ids: np.ndarray, parts: int) -> np.ndarray:
    """Partition of vertices of G given by ORIGINAL id (module doc)."""
    return np.mod(ids, parts)


def owner_of(ctx, prep, union: np.ndarray, parts: int) -> np.ndarray:
    """Partition of each union vertex: G vertex -> original id mod P, query i -> i mod P."""
    if parts == 1:
        return np.zeros(len(union), np.int64)
    n = ctx.num_nodes
    out = np.empty(len(union), np.int64)
    g = union < n
    out[g] = owner_of_ids(ctx.graph.ids[union[g]], parts)
    out[~g] = np.mod(union[~g] - n, parts)
    return out


def _np_unique_inverse(values: np.ndarray):
    return np.unique(values, return_inverse=True)


@dataclass
class Partials:
    """Partition p's blocks for one layer (module doc) and the bytes they send to other owners."""

    p: int
    states: list = field(default_factory=list)  # [rows, state width] tensors
    index: list = field(default_factory=list)  # np.ndarray: target position of each row
    partial_bytes: int = 0

    def add(self, state: torch.Tensor, rows: np.ndarray, target_owner: np.ndarray) -> None:
        self.states.append(state)
        self.index.append(rows)
        crossing = int((target_owner[rows] != self.p).sum())
        self.partial_bytes += crossing * int(state.shape[1]) * 4


@torch.no_grad()
def partition_partials(
    conv,
    p: int,
    *,
    edge_owner: np.ndarray,
    old: np.ndarray,
    tgt: np.ndarray,
    weight: np.ndarray | None,
    target_owner: np.ndarray,
    from_state: np.ndarray,
    sources: Callable,
    stored_states: Callable,
    dst=(None, None),
    timer: Callable | None = None,
    unique_inverse: Callable | None = None,
) -> Partials:
    """Partition p's share of one layer (module doc). Edge arrays (owner, old flag, target position
    `tgt`, weight or None) may hold other partitions' edges too: only edge_owner == p are used.
    Target arrays (`target_owner`, `from_state`) cover all T targets.

    sources(sel, old) -> (values [U, w], {stat: [U]}, inv [len(sel)] or None): the inputs of the
    edges `sel` (all NEW, or all OLD: stored values and G's statistics), per distinct source with
    `inv` mapping edges to rows, or per edge (inv None).
    stored_states(rows) -> [R, s] tensor: stored states of the targets at positions `rows`.
    dst: (NEW, OLD) destination payloads [T, d] (conv.prepare_dst) or None, for messages that
    read the destination. `timer(key)`: a context manager timing "compute_s" (Meter.timer)."""
    timer = timer or (lambda key: nullcontext())
    unique_inverse = unique_inverse or _np_unique_inverse
    agg = conv.aggregator
    out = Partials(int(p))
    mine = edge_owner == p
    for is_old in (False, True):
        sel = np.flatnonzero(mine & (old == is_old))
        if not len(sel):
            continue
        vals, stats, inv = sources(sel, is_old)
        d = dst[1 if is_old else 0]
        with timer("compute_s"):
            payload = conv.prepare_src(vals, stats, False)
            if inv is not None:
                payload = payload[torch.from_numpy(inv)]
            w = None if weight is None else torch.from_numpy(weight[sel])
            d = None if d is None else d[torch.from_numpy(tgt[sel])]
            m = conv.message(payload, d, w, False)
            uniq, local = unique_inverse(tgt[sel])
            part = agg.partial(m, torch.from_numpy(local), len(uniq))
            if is_old:
                part = agg.negate(part)
        out.add(part, uniq, target_owner)
    rows = np.flatnonzero((target_owner == p) & from_state)
    if len(rows):
        out.add(stored_states(rows), rows, target_owner)
    return out


def merge_partials(conv, states: list, index: list, num: int) -> torch.Tensor:
    """The owners' merge: every target's blocks merged into one state [num, state width] (the
    merge identity for a target that received none)."""
    agg = conv.aggregator
    if not states:
        return agg.identity(num, conv.msg_width(False))
    if len(states) == 1 and _covers_once(index[0], num):
        # one block with a row for each target in order (one partition, every target reached):
        # merging it with the identity gives its own values, so the block is the merged state
        return as_f32(states[0])
    return agg.merge(torch.cat(states), torch.from_numpy(np.concatenate(index)), num)


def _covers_once(index: np.ndarray, num: int) -> bool:
    """True when `index` is 0, 1, ..., num - 1 (a block's rows are its targets' positions in order):
    num values, strictly increasing from 0 to num - 1."""
    if len(index) != num:
        return False
    return num == 0 or (index[0] == 0 and index[-1] == num - 1 and bool((index[1:] > index[:-1]).all()))


def no_exchange() -> dict:
    return dict.fromkeys(COMM_KEYS, 0)


def allgather_bytes(h: torch.Tensor, parts: int) -> int:
    """Bytes of all-gathering the new values `h` [T, width] to the other P - 1 partitions."""
    return int(h.shape[0]) * int(h.shape[1]) * 4 * (max(1, int(parts)) - 1)


def count_layer(comm: dict, partial_bytes: Iterable[int], h: torch.Tensor, parts: int) -> None:
    """Add one layer's exchanged bytes (module doc) to `comm` (keys COMM_KEYS): the partitions'
    Partials.partial_bytes and the all-gather of the layer's new values `h`."""
    comm["partial_bytes"] += int(sum(partial_bytes))
    comm["allgather_bytes"] += allgather_bytes(h, parts)
