"""A partition's edges sorted by destination (CSR), built once per process and reused by every
layer and every later step on the same edges.

Why: a partition's in-edges are static (prepared once per graph and P), yet each layer's sparse
product A @ X needs them in CSR order: a stable argsort of |E| destinations plus a gather, about
0.9 s per 4M-edge partition here, against roughly 1 s for the product itself. The Spark worker
(in-process transport) and the messenger worker are both reused across layers, so the sort is
paid by the first layer only.

A hit is decided by content, not by a name: an entry keeps the src and dst tensors it was built
from and a lookup compares them element-wise (milliseconds for millions of edges), so an edge list
that changed (a different graph, a self-loop policy that adds edges, another partition of the same
size) can never be served a stale order. At most MAX_ENTRIES entries are kept (least recently used
first out): a worker usually serves one or two partitions per step.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

MAX_ENTRIES = 2


@dataclass(frozen=True)
class Csr:
    src: torch.Tensor  # the edge list the entry was built from (kept to verify hits)
    dst: torch.Tensor
    order: torch.Tensor  # edge positions in (stable) destination order
    crow: torch.Tensor  # num_dst + 1 row offsets
    col: torch.Tensor  # src[order]

    @property
    def in_degree(self) -> torch.Tensor:
        return self.crow.diff()


_entries: OrderedDict[tuple, Csr] = OrderedDict()


def _build(src: torch.Tensor, dst: torch.Tensor, num_dst: int) -> Csr:
    order = torch.argsort(dst, stable=True)
    crow = torch.zeros(num_dst + 1, dtype=torch.long, device=dst.device)
    crow[1:] = torch.cumsum(torch.bincount(dst, minlength=num_dst), 0)
    return Csr(src=src, dst=dst, order=order, crow=crow, col=src[order])


def by_destination(src: torch.Tensor, dst: torch.Tensor, num_dst: int) -> Csr:
    """The CSR of edges (src[i] -> dst[i]) over `num_dst` destinations, from the cache when the
    same edge list was sorted before in this process."""
    key = (str(dst.device), int(dst.numel()), int(num_dst))
    hit = _entries.get(key)
    if hit is not None and torch.equal(hit.dst, dst) and torch.equal(hit.src, src):
        _entries.move_to_end(key)
        return hit
    csr = _build(src, dst, num_dst)
    _entries[key] = csr
    _entries.move_to_end(key)
    while len(_entries) > MAX_ENTRIES:
        _entries.popitem(last=False)
    return csr


def clear() -> None:
    _entries.clear()
