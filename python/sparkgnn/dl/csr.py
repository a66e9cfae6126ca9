"""A partition's edges sorted by destination (CSR), built once per process and reused by every
layer and every later step on the same edges.

Why: a partition's in-edges are static (prepared once per graph and P), yet each layer's sparse
product A @ X needs them in CSR order: a stable argsort of |E| destinations plus a gather, which
costs about as much as the product itself (docs/ARCHITECTURE.md, "Data movement and the planner").
The Spark worker (in-process transport) and the messenger worker are both reused across layers, so
the sort is paid by the first layer only.

Split at `split` (the number of own payload rows): a step's sources are local ids in
[own | mirror], but the two payload blocks arrive as separate tensors. Concatenating them for one
product A @ [own; mirror] copies every payload row ((n_own + n_mirror) x F floats), so an entry keeps the
edges as two CSRs over the same destinations instead: `own` (sources < split) and `mirror` (sources
>= split, columns re-based by -split), and the step computes A_own @ own + A_mirror @ mirror. Only
the split form is stored, not the whole CSR as well: no caller needs the whole once it is split
(emit_partials' sources are all own, so its `mirror` block is empty and `own` is the whole CSR), and
both forms at once would double the entry's |E| index memory. The two blocks are views of one order
and one col array, so an entry costs what the whole CSR cost (2 x |E| int64 plus per-destination
offsets). Without `split` an entry is the whole CSR in `own`. With the files exchange the mirror
rows arrive as one memory-mapped matrix per source partition (engine.routed_files), so `split` may
also be a list of block starts: one CSR block per source file, each multiplied by its own file's
matrix (P + 1 blocks: their offsets cost (P + 1) x num_dst int64).

A hit is decided by content, not by a name: an entry keeps the src and dst tensors it was built
from and a lookup compares them element-wise (one linear pass, cheap next to the sort), so an edge
list that changed (a different graph, a self-loop policy that adds edges, another partition of the same
size) can never be served a stale order. At most MAX_ENTRIES entries are kept (least recently used
first out): a worker usually serves one or two partitions per step.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from sparkgnn.planner.partitions import CACHED_PARTITIONS

MAX_ENTRIES = CACHED_PARTITIONS  # the planner counts what a worker keeps (planner.partitions)


@dataclass(frozen=True)
class Block:
    """The edges whose sources lie in one block of the source rows, as a CSR over all destinations:
    row d holds d's edges of the block in their original (stable) order."""

    crow: torch.Tensor  # num_dst + 1 row offsets
    col: torch.Tensor  # the edges' sources, re-based to the block's first row
    order: torch.Tensor  # the edges' positions in the edge list (per-edge values: scale[order])

    @property
    def num_edges(self) -> int:
        return int(self.col.numel())


@dataclass(frozen=True)
class Csr:
    src: torch.Tensor  # the edge list the entry was built from (kept to verify hits)
    dst: torch.Tensor
    blocks: tuple[Block, ...]  # one per source block, columns re-based to the block's first row
    in_degree: torch.Tensor  # edges per destination, all blocks

    @property
    def own(self) -> Block:
        """Sources < split: the own block (every edge when the entry has one block)."""
        return self.blocks[0]

    @property
    def mirror(self) -> Block:
        """Sources >= split, when the entry was split once (an empty block when never split)."""
        if len(self.blocks) > 2:
            raise ValueError(f"this CSR has {len(self.blocks) - 1} mirror blocks; use .blocks")
        return self.blocks[1] if len(self.blocks) == 2 else _empty_block(self.own.crow.numel() - 1, self.src.device)


_entries: OrderedDict[tuple, Csr] = OrderedDict()


def _empty_block(num_dst: int, device) -> Block:
    empty = torch.zeros(0, dtype=torch.long, device=device)
    return Block(crow=torch.zeros(num_dst + 1, dtype=torch.long, device=device), col=empty, order=empty)


def _offsets(counts: torch.Tensor) -> torch.Tensor:
    crow = torch.zeros(counts.numel() + 1, dtype=torch.long, device=counts.device)
    crow[1:] = torch.cumsum(counts, 0)
    return crow


def _bounds(split) -> tuple[int, ...]:
    if split is None:
        return ()
    bounds = (int(split),) if isinstance(split, int) else tuple(int(b) for b in split)
    if any(b < 0 for b in bounds) or list(bounds) != sorted(bounds):
        raise ValueError(f"block bounds must be ascending and >= 0, got {bounds}")
    return bounds


def _build(src: torch.Tensor, dst: torch.Tensor, num_dst: int, bounds: tuple[int, ...]) -> Csr:
    # One stable sort by (block, destination): own edges first, then each mirror block, each block
    # in destination order and, within a destination, in edge-list order.
    blocks = len(bounds) + 1
    if bounds:
        block_of = torch.bucketize(src, torch.tensor(bounds, dtype=src.dtype, device=src.device), right=True)
        key = torch.add(dst, block_of, alpha=num_dst)
        del block_of
    else:
        key = dst
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=blocks * num_dst).view(blocks, num_dst)
    del key
    col = src[order]
    ends = torch.cumsum(counts.sum(dim=1), 0).tolist()
    starts = [0] + ends[:-1]
    out = []
    for b in range(blocks):
        e0, e1 = starts[b], ends[b]
        if b:
            col[e0:e1] -= bounds[b - 1]
        out.append(Block(crow=_offsets(counts[b]), col=col[e0:e1], order=order[e0:e1]))
    return Csr(src=src, dst=dst, blocks=tuple(out), in_degree=counts.sum(dim=0))


def by_destination(src: torch.Tensor, dst: torch.Tensor, num_dst: int, split=None) -> Csr:
    """The CSR of edges (src[i] -> dst[i]) over `num_dst` destinations, in blocks of sources:
    `split` is the first mirror row (two blocks, module docstring) or an ascending sequence of
    block starts (one block per source partition's payload file, engine.routed_files), None for
    one block. From the cache when the same edge list was sorted with the same blocks before in
    this process."""
    bounds = _bounds(split)
    key = (str(dst.device), int(dst.numel()), int(num_dst), bounds)
    hit = _entries.get(key)
    if hit is not None and torch.equal(hit.dst, dst) and torch.equal(hit.src, src):
        _entries.move_to_end(key)
        return hit
    csr = _build(src, dst, num_dst, bounds)
    _entries[key] = csr
    _entries.move_to_end(key)
    while len(_entries) > MAX_ENTRIES:
        _entries.popitem(last=False)
    return csr


def clear() -> None:
    _entries.clear()
