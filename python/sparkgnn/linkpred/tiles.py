"""Exact top-k by tiles: score a block of sources against a tile of candidates, keep each source's
k best, and merge the partial lists of all tiles into the final ranking.

Order: a higher raw score first, and among equal scores the SMALLER candidate id, so the result is
one total order and every run and partitioning gives the same answer. WHY this merges exactly: each
tile keeps a source's k best of its candidates under that order; the k best overall are each the
best of their own tile's candidates that rank above them, so they are among the tile's k kept
(`merge_topk` of the partial lists = the top-k of the union). Ranking uses the decoder's raw score
(before a `final` sigmoid, which may round distinct scores to one value); the output score is
`final(raw)`.
"""

from __future__ import annotations

import numpy as np
import torch

from sparkgnn.decoders import Decoder

PAIR_CHUNK = 1 << 16  # pairs per decoder call for decoders that are not an inner product
TILE_SCORES = 1 << 24  # scores held at once by tile_topk (64 MiB of float32)


def pair_scores(decoder: Decoder, sources: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """[S, C] raw scores of every (source, candidate) pair: a matrix product for inner-product
    decoders, the decoder over the pairs in chunks otherwise."""
    s, c = torch.from_numpy(np.ascontiguousarray(sources)), torch.from_numpy(np.ascontiguousarray(candidates))
    with torch.no_grad():
        if decoder.inner_product:
            return (decoder.search_vectors(s) @ decoder.search_vectors(c).T).numpy()
        out = np.empty(len(s) * len(c), dtype=np.float32)
        rows = max(1, PAIR_CHUNK // max(1, len(c)))
        for start in range(0, len(s), rows):
            block = s[start : start + rows]
            left = block.repeat_interleave(len(c), dim=0)
            right = c.repeat(len(block), 1)
            out[start * len(c) : (start + len(block)) * len(c)] = decoder.raw(left, right).numpy()
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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, raw score) of each source's k best candidates in this tile (module doc's order).
    `exclude`: (src, dst) pairs never to return (known edges).

    WHY row chunks and a threshold rather than sorting each row: a tile's score matrix would grow
    with sources x candidates (tens of GB for a 100K x 100K tile) and a full sort of each row costs
    ~100x a top-k selection; each chunk of TILE_SCORES scores keeps, per source, every candidate
    scoring at least its k-th best (so equal scores at the cut stay), and merge_topk orders those
    exactly."""
    order = np.argsort(cand_ids, kind="stable")
    return sorted_tile_topk(
        decoder, src_ids, sources, np.asarray(cand_ids, np.int64)[order], candidates[order], k, exclude
    )


def sorted_tile_topk(
    decoder: Decoder,
    src_ids: np.ndarray,
    sources: np.ndarray,
    cand_ids: np.ndarray,
    candidates: np.ndarray,
    k: int,
    exclude: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """tile_topk of candidates whose `cand_ids` are already ascending (no reordering copy)."""
    cand_ids = np.asarray(cand_ids, np.int64)
    src_ids = np.asarray(src_ids, dtype=np.int64)
    keep = min(k, len(cand_ids))
    if not keep or not len(src_ids):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    rows_ex, cols_ex = np.zeros(0, np.int64), np.zeros(0, np.int64)
    if exclude is not None and len(exclude[0]):
        rows_ex, cols_ex = locate_pairs(src_ids, cand_ids, exclude[0], exclude[1])
    step = max(1, TILE_SCORES // len(cand_ids))
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for start in range(0, len(src_ids), step):
        stop = min(start + step, len(src_ids))
        scores = pair_scores(decoder, sources[start:stop], candidates).astype(np.float32, copy=False)
        if len(rows_ex):
            inside = (rows_ex >= start) & (rows_ex < stop)
            scores[rows_ex[inside] - start, cols_ex[inside]] = -np.inf
        with torch.no_grad():
            kth = torch.topk(torch.from_numpy(scores), keep, dim=1).values[:, -1:].numpy()
        rows, cols = np.nonzero((scores >= kth) & (scores > -np.inf))  # excluded pairs are never returned
        parts.append((src_ids[start:stop][rows], cand_ids[cols], scores[rows, cols]))
    src, dst, score = (np.concatenate(column) for column in zip(*parts, strict=True))
    src, dst, score, _rank = merge_topk(src, dst, score, keep)
    return src, dst, score


def table_topk(
    decoder: Decoder,
    src_ids: np.ndarray,
    sources: np.ndarray,
    cand_ids: np.ndarray,
    candidates: np.ndarray,
    k: int,
    exclude: tuple[np.ndarray, np.ndarray] | None = None,
    *,
    tile_scores: int = TILE_SCORES,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, raw score, rank) of each source's k best among ALL `candidates` (`cand_ids`
    ascending), sorted by source then rank: the candidates are walked in tiles of about
    `tile_scores` / len(sources) rows, each tile's per-source k best kept (sorted_tile_topk) and
    the partial lists merged (merge_topk, exact by the module doc). WHY tiles of the candidates
    and not only of the sources: a product of a few source rows with every candidate re-reads the
    whole candidate matrix per few sources (memory-bound); a tile that stays in cache is reused
    by every source of the batch."""
    if tile_scores < 1:
        raise ValueError(f"tile_scores must be >= 1, got {tile_scores!r}")
    cand_ids = np.asarray(cand_ids, np.int64)
    rows = max(1, tile_scores // max(1, len(src_ids)))
    parts = [
        sorted_tile_topk(decoder, src_ids, sources, cand_ids[lo : lo + rows], candidates[lo : lo + rows], k, exclude)
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
