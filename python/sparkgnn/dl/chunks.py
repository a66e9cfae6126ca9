"""Bounded memory for per-edge messages: aggregate a partition's edges in destination ranges.

WHY: a layer whose messages cannot be summed by a sparse product (GAT's attention, max/min,
softmax, a message that reads the destination) materialises an |E| x F message tensor. On a large
partition that tensor, not the vertex rows, is what decides whether a task fits its memory, and
buying the room by multiplying partitions would cost more than memory (more partitions on the
same cores = a larger replication factor R_f and more bytes shipped per layer). Cutting the partition's edges
into destination ranges keeps every destination's edges in one chunk, so each chunk's partial
states are the destination's whole state (exact, same messages, same per-destination order), and
at most `chunk_bytes` of messages exist at once. The planner can then keep P at the core count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch


def dst_ranges(dst_counts: np.ndarray, max_edges: int) -> Iterator[tuple[int, int, int, int]]:
    """(first dst, end dst, first edge, end edge) ranges covering every destination 0..len-1, each
    with at most `max_edges` edges (a destination with more in-edges than that gets its own range),
    for edges sorted by destination. Destinations without edges fall inside some range."""
    num = len(dst_counts)
    ends = np.cumsum(dst_counts, dtype=np.int64)
    d0, e0 = 0, 0
    while d0 < num:
        d1 = int(np.searchsorted(ends, e0 + max_edges, side="right"))
        d1 = min(max(d1, d0 + 1), num)
        e1 = int(ends[d1 - 1])
        yield d0, d1, e0, e1
        d0, e0 = d1, e1


def chunked_by_dst(
    partial: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, int, int], torch.Tensor],
    src: torch.Tensor,
    dst: torch.Tensor,
    weight: torch.Tensor | None,
    num_dst: int,
    bytes_per_edge: int,
    chunk_bytes: int,
) -> torch.Tensor:
    """partial(src, local dst, weight, first dst, num dst) -> [num dst, S] states of destinations
    first..first+num-1, called on destination ranges of at most chunk_bytes // bytes_per_edge edges
    and concatenated (local dst = dst - first). One call over everything when the edges fit."""
    max_edges = max(1, int(chunk_bytes) // max(int(bytes_per_edge), 1))
    if src.numel() <= max_edges:
        return partial(src, dst, weight, 0, num_dst)
    order = torch.argsort(dst, stable=True)  # stable: each destination's edges keep their order
    src, dst = src[order], dst[order]
    weight = None if weight is None else weight[order]
    counts = torch.bincount(dst, minlength=num_dst).cpu().numpy()
    states = []
    for d0, d1, e0, e1 in dst_ranges(counts, max_edges):
        w = None if weight is None else weight[e0:e1]
        states.append(partial(src[e0:e1], dst[e0:e1] - d0, w, d0, d1 - d0))
    return torch.cat(states, dim=0)
