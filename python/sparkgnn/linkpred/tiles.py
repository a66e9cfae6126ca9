"""Exact top-k by tiles: score a block of sources against a tile of candidates, keep each source's
k best, and merge the partial lists of all tiles into the final ranking.

Order: a higher raw score first, and among equal scores the SMALLER candidate id, so the result is
one total order and every run and partitioning gives the same answer. WHY this merges exactly: each
tile keeps a source's k best of its candidates under that order; the k best overall are each the
best of their own tile's candidates that rank above them, so they are among the tile's k kept
(`merge_topk` of the partial lists = the top-k of the union). Ranking uses the decoder's raw score
(before a `final` sigmoid, which may round distinct scores to one value); the output score is
`final(raw)`.

`device`: where the scores are made and selected ("cpu", "cuda", "cuda:i"). On a GPU every
candidate is one tile, and a caller that scores many source slices against the same candidates
passes them as a tensor already on the device (topk.broadcast_topk sends a task's broadcast table
once), each chunk of sources is scored and selected there
(select_kept), and only the kept (row, column, score) triples come back; the merge stays on the
host. A device's float32 products sum in another order than the CPU's, so scores can differ in the
last bits and two candidates within that distance of each other at the k-th place may swap
(bench/results/gpu_topk.json measures how often: never on its samples).
"""

from __future__ import annotations

import numpy as np
import torch

from sparkgnn.cliargs import DEVICE_PATTERN
from sparkgnn.decoders import Decoder

PAIR_CHUNK = 1 << 16  # pairs per decoder call for decoders that are not an inner product
TILE_SCORES = 1 << 24  # scores held at once by tile_topk (64 MiB of float32)
DEVICE_TILE_SCORES = 1 << 27  # the same on a GPU (512 MiB): fewer, larger kernels
DEVICE_PAIR_CHUNK = 1 << 20  # PAIR_CHUNK on a GPU
DEVICE_PATH_ON_CPU = False  # tests set it to run the GPU's code path on CPU tensors


def device_path(dev: torch.device) -> bool:
    """Whether `dev` takes the device path (tensors, selection on the device, one whole tile)."""
    return dev.type != "cpu" or DEVICE_PATH_ON_CPU


def check_device(device: str) -> str:
    """`device` if it names a device top-k can run on ("cpu", "cuda", "cuda:i"), else ValueError
    (one line). Whether this process sees that device is resolve_device's question: a driver
    without a GPU may run a job whose tasks have one."""
    if not isinstance(device, str) or not DEVICE_PATTERN.fullmatch(device):
        raise ValueError(f"device must be cpu, cuda or cuda:i, got {device!r}")
    return device


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`device` as a torch device; a CUDA device this process cannot use is refused in one line
    (a top-k asked to run on the GPU never falls back to the CPU in silence)."""
    dev = torch.device(device or "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"top-k on {dev} asked for, but this process sees no CUDA device (torch {torch.__version__})")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"top-k runs on cpu or cuda, not {dev}")
    return dev


def tile_budget(device: torch.device, tile_scores: int | None) -> int:
    """Scores one tile holds at once: `tile_scores` when given, else the device's default."""
    if tile_scores is not None:
        return tile_scores
    return DEVICE_TILE_SCORES if device.type == "cuda" else TILE_SCORES


def pair_scores(decoder: Decoder, sources: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """[S, C] raw scores of every (source, candidate) pair: a matrix product for inner-product
    decoders, the decoder over the pairs in chunks otherwise."""
    s, c = torch.from_numpy(np.ascontiguousarray(sources)), torch.from_numpy(np.ascontiguousarray(candidates))
    return score_matrix(decoder, s, c).numpy()


@torch.no_grad()
def score_matrix(
    decoder: Decoder, s: torch.Tensor, c: torch.Tensor, c_sides: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    """pair_scores on tensors, on their device (the decoder's parameters must be there too).
    `c_sides`: decoder.project(c) when the caller scores many source chunks against the same
    candidates (sorted_tile_topk projects them once, not once per chunk)."""
    if decoder.inner_product:
        return decoder.search_vectors(s) @ decoder.search_vectors(c).T
    out = torch.empty(len(s) * len(c), dtype=torch.float32, device=s.device)
    rows = max(1, (PAIR_CHUNK if s.device.type == "cpu" else DEVICE_PAIR_CHUNK) // max(1, len(c)))
    sides = decoder.project(s), c_sides if c_sides is not None else decoder.project(c)
    if sides[0] is not None and sides[1] is not None:  # per-node halves (Decoder.project)
        src_side, dst_side = sides[0][0], sides[1][1]
        for start in range(0, len(s), rows):
            block = src_side[start : start + rows]
            scores = decoder.raw_projected(block[:, None, :], dst_side[None, :, :])
            out[start * len(c) : (start + len(block)) * len(c)] = scores.flatten()
        return out.reshape(len(s), len(c))
    for start in range(0, len(s), rows):
        block = s[start : start + rows]
        left = block.repeat_interleave(len(c), dim=0)
        right = c.repeat(len(block), 1)
        out[start * len(c) : (start + len(block)) * len(c)] = decoder.raw(left, right)
    return out.reshape(len(s), len(c))


def locate_pairs(
    row_ids: np.ndarray, sorted_col_ids: np.ndarray, pair_src: np.ndarray, pair_dst: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of the (src, dst) pairs whose src is in `row_ids` and dst in `sorted_col_ids`
    (ascending), as indices into those arrays; pairs outside the block are dropped."""
    row_ids = np.asarray(row_ids, np.int64)
    pair_src, pair_dst = np.asarray(pair_src, np.int64), np.asarray(pair_dst, np.int64)
    if not len(row_ids) or not len(sorted_col_ids):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    by_id = np.argsort(row_ids, kind="stable")
    row_pos = np.minimum(np.searchsorted(row_ids[by_id], pair_src), len(row_ids) - 1)
    col_pos = np.minimum(np.searchsorted(sorted_col_ids, pair_dst), len(sorted_col_ids) - 1)
    hit = (row_ids[by_id][row_pos] == pair_src) & (sorted_col_ids[col_pos] == pair_dst)
    return by_id[row_pos[hit]], col_pos[hit]


def tile_topk(
    decoder: Decoder,
    src_ids: np.ndarray,
    sources: np.ndarray,
    cand_ids: np.ndarray,
    candidates: np.ndarray,
    k: int,
    exclude: tuple[np.ndarray, np.ndarray] | None = None,
    *,
    device: str | torch.device | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, raw score) of each source's k best candidates in this tile (module doc's order).
    `exclude`: (src, dst) pairs never to return (known edges); `device`: module doc.

    WHY row chunks and a threshold rather than sorting each row: a tile's score matrix would grow
    with sources x candidates (tens of GB for a 100K x 100K tile) and a full sort of each row costs
    ~100x a top-k selection; each chunk of TILE_SCORES scores keeps, per source, every candidate
    scoring at least its k-th best (so equal scores at the cut stay), and merge_topk orders those
    exactly."""
    order = np.argsort(cand_ids, kind="stable")
    return sorted_tile_topk(
        decoder,
        src_ids,
        sources,
        np.asarray(cand_ids, np.int64)[order],
        candidates[order],
        k,
        exclude,
        device=device,
    )


def sorted_tile_topk(
    decoder: Decoder,
    src_ids: np.ndarray,
    sources: np.ndarray | torch.Tensor,
    cand_ids: np.ndarray,
    candidates: np.ndarray | torch.Tensor,
    k: int,
    exclude: tuple[np.ndarray, np.ndarray] | None = None,
    *,
    device: str | torch.device | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """tile_topk of candidates whose `cand_ids` are already ascending (no reordering copy).
    `sources` and `candidates` may already be tensors on `device` (table_topk moves them there)."""
    dev = resolve_device(device)
    cand_ids = np.asarray(cand_ids, np.int64)
    src_ids = np.asarray(src_ids, dtype=np.int64)
    keep = min(k, len(cand_ids))
    if not keep or not len(src_ids):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    rows_ex, cols_ex = np.zeros(0, np.int64), np.zeros(0, np.int64)
    if exclude is not None and len(exclude[0]):
        rows_ex, cols_ex = locate_pairs(src_ids, cand_ids, exclude[0], exclude[1])
    step = max(1, tile_budget(dev, None) // len(cand_ids))
    if device_path(dev):
        decoder = decoder.to(dev)
    dev_sources, dev_candidates = on(dev, sources), on(dev, candidates)
    with torch.no_grad():
        c_sides = None if decoder.inner_product else decoder.project(dev_candidates)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for start in range(0, len(src_ids), step):
        stop = min(start + step, len(src_ids))
        inside = (rows_ex >= start) & (rows_ex < stop)
        excluded = (rows_ex[inside] - start, cols_ex[inside])
        scored = score_matrix(decoder, dev_sources[start:stop], dev_candidates, c_sides)
        rows, cols, vals = select_kept(scored, keep, excluded)
        parts.append((src_ids[start:stop][rows], cand_ids[cols], vals))
    src, dst, score = (np.concatenate(column) for column in zip(*parts, strict=True))
    src, dst, score, _rank = merge_topk(src, dst, score, keep)
    return src, dst, score


@torch.no_grad()
def select_kept(
    scores: torch.Tensor, keep: int, excluded: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cols, scores) of every entry of the [S, C] `scores` (on any device) at least its row's
    `keep`-th best, the `excluded` (rows, cols) never (set to -inf in place); only these triples
    come back to the host.

    WHY one top-k of keep + 1 per row and not a mask of the whole matrix: when a row's (keep+1)-th
    best is below its keep-th, nothing outside the top-k' reaches the cut, so the kept entries are
    among those keep + 1 (no pass over the [S, C] scores beyond the top-k, no compaction of it);
    only rows whose ties run past keep + 1 are masked in full. On the CPU too: a slice of 512
    sources against 200K candidates took 0.8-0.9 s this way against 1.2-1.4 s with numpy's mask."""
    scores = scores.float()
    inf = float("-inf")
    if len(excluded[0]):
        at = (torch.from_numpy(excluded[0]).to(scores.device), torch.from_numpy(excluded[1]).to(scores.device))
        scores.index_put_(at, torch.tensor(inf, device=scores.device))
    wide = min(keep + 1, scores.shape[1])
    vals, cols = torch.topk(scores, wide, dim=1)
    kth = vals[:, keep - 1 : keep]
    kept = (vals >= kth) & (vals > inf)
    if wide > keep:
        kept[vals[:, -1] >= kth[:, 0]] = False  # ties past keep + 1: those rows are masked in full below
    rows, at_rank = kept.nonzero(as_tuple=True)
    parts = [(rows, cols[rows, at_rank], vals[rows, at_rank])]
    if wide > keep:
        tied = (vals[:, -1] >= kth[:, 0]).nonzero(as_tuple=True)[0]
        if len(tied):
            sub = scores[tied]
            t_rows, t_cols = ((sub >= kth[tied]) & (sub > inf)).nonzero(as_tuple=True)
            parts.append((tied[t_rows], t_cols, sub[t_rows, t_cols]))
    rows, cols, vals = (torch.cat(column) for column in zip(*parts, strict=True))
    return rows.cpu().numpy(), cols.cpu().numpy(), vals.cpu().numpy()


def on(device: torch.device, array: np.ndarray | torch.Tensor) -> torch.Tensor:
    """`array` as a float32 tensor on `device` (a tensor already there is returned as it is)."""
    if isinstance(array, torch.Tensor):
        return array.to(device)
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).to(device)


def table_topk(
    decoder: Decoder,
    src_ids: np.ndarray,
    sources: np.ndarray,
    cand_ids: np.ndarray,
    candidates: np.ndarray | torch.Tensor,
    k: int,
    exclude: tuple[np.ndarray, np.ndarray] | None = None,
    *,
    tile_scores: int | None = None,
    device: str | torch.device | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, raw score, rank) of each source's k best among ALL `candidates` (`cand_ids`
    ascending), sorted by source then rank: the candidates are walked in tiles of about
    `tile_scores` (default: the device's, tile_budget; on a GPU by default all candidates as one
    tile) / len(sources) rows, each tile's per-source k
    best kept (sorted_tile_topk) and the partial lists merged (merge_topk, exact by the module doc).
    WHY tiles of the candidates and not only of the sources: a product of a few source rows with
    every candidate re-reads the whole candidate matrix per few sources (memory-bound); a tile that
    stays in cache is reused by every source of the batch."""
    dev = resolve_device(device)
    whole = device_path(dev) and tile_scores is None  # a GPU holds every candidate as one tile
    tile_scores = tile_budget(dev, tile_scores)
    if tile_scores < 1:
        raise ValueError(f"tile_scores must be >= 1, got {tile_scores!r}")
    cand_ids = np.asarray(cand_ids, np.int64)
    rows = max(1, len(cand_ids) if whole else tile_scores // max(1, len(src_ids)))
    side: tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor] = (sources, candidates)
    if device_path(dev):
        side = (on(dev, sources), on(dev, candidates))
    parts = [
        sorted_tile_topk(
            decoder,
            src_ids,
            side[0],
            cand_ids[lo : lo + rows],
            side[1][lo : lo + rows],
            k,
            exclude,
            device=dev,
        )
        for lo in range(0, len(cand_ids), rows)
    ]
    if not parts:
        empty = np.zeros(0, np.int64)
        return empty, empty, np.zeros(0, np.float32), np.zeros(0, np.int32)
    src, dst, score = (np.concatenate(column) for column in zip(*parts, strict=True))
    return merge_topk(src, dst, score, k)


def merge_topk(
    src: np.ndarray, dst: np.ndarray, score: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, score, rank) of each source's k best among partial lists (rank 1 = best), sorted
    by source then rank."""
    src, dst, score = np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(score, np.float32)
    order = np.lexsort((dst, -score, src))
    src, dst, score = src[order], dst[order], score[order]
    if not len(src):
        return src, dst, score, np.zeros(0, np.int32)
    starts = np.r_[0, np.flatnonzero(src[1:] != src[:-1]) + 1]
    group_start = np.repeat(starts, np.diff(np.r_[starts, len(src)]))
    rank = (np.arange(len(src)) - group_start + 1).astype(np.int32)
    keep = rank <= k
    return src[keep], dst[keep], score[keep], rank[keep]
