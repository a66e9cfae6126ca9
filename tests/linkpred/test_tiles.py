"""linkpred/tiles.py: tile-wise top-k merged over P tiles equals a numpy brute force (ties by id)."""

import itertools

import numpy as np
import pytest
import torch

from sparkgnn.decoders import build_decoder
from sparkgnn.linkpred import tiles
from sparkgnn.linkpred.tiles import merge_topk, pair_scores, table_topk, tile_topk

K = 10


def _brute_force(scores: np.ndarray, src_ids, cand_ids, k, exclude=frozenset()):
    rows = []
    for i, s in enumerate(src_ids):
        ranked = sorted(
            ((-scores[i, j], int(c)) for j, c in enumerate(cand_ids) if (int(s), int(c)) not in exclude),
        )[:k]
        rows += [(int(s), c, r + 1) for r, (_neg, c) in enumerate(ranked)]
    return rows


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(5)
    # coarse values: many equal scores, so the tie order (smaller id first) is exercised
    h = rng.integers(-2, 3, size=(300, 4)).astype(np.float32)
    ids = rng.permutation(10_000)[:300].astype(np.int64)
    return ids, h


@pytest.mark.parametrize("parts", [1, 3, 8])
def test_tiles_merged_equal_brute_force(case, parts):
    ids, h = case
    decoder = build_decoder({"kind": "dot"})
    src_ids, sources = ids[:60], h[:60]
    exclude = {(int(src_ids[i]), int(ids[(7 * i) % 300])) for i in range(60)}
    ex = (np.array([s for s, _ in exclude]), np.array([d for _, d in exclude]))
    partial = []
    for block in np.array_split(np.arange(60), parts):
        for tile in np.array_split(np.random.default_rng(parts).permutation(300), parts):
            partial.append(tile_topk(decoder, src_ids[block], sources[block], ids[tile], h[tile], K, ex))
    src, dst, _score, rank = merge_topk(*(np.concatenate(c) for c in zip(*partial, strict=True)), K)
    expected = _brute_force(sources @ h.T, src_ids, ids, K, exclude)
    assert sorted(zip(src.tolist(), dst.tolist(), rank.tolist(), strict=True)) == sorted(expected)


@pytest.mark.parametrize("tile_scores", [1, 60 * 7, 1 << 20])
def test_table_topk_walks_candidate_tiles_exactly(case, tile_scores):
    """Every candidate in tiles of tile_scores / sources rows (1 row, 7 rows, all at once) with a
    running merge: the brute force's answer, ties by id and known pairs excluded."""
    ids, h = case
    order = np.argsort(ids)
    src_ids, sources = ids[:60], h[:60]
    exclude = {(int(src_ids[i]), int(ids[(11 * i) % 300])) for i in range(60)}
    ex = (np.array([s for s, _ in exclude]), np.array([d for _, d in exclude]))
    src, dst, _score, rank = table_topk(
        build_decoder({"kind": "dot"}), src_ids, sources, ids[order], h[order], K, ex, tile_scores=tile_scores
    )
    expected = _brute_force(sources @ h.T, src_ids, ids, K, exclude)
    assert sorted(zip(src.tolist(), dst.tolist(), rank.tolist(), strict=True)) == sorted(expected)
    with pytest.raises(ValueError, match="tile_scores must be >= 1"):
        table_topk(build_decoder({"kind": "dot"}), src_ids, sources, ids[order], h[order], K, tile_scores=0)


def test_pair_scores_match_the_decoder_row_by_row():
    g = torch.Generator().manual_seed(0)
    s, c = torch.randn(7, 5, generator=g), torch.randn(9, 5, generator=g)
    concat = [{"op": "linear", "in_dim": 10, "out_dim": 4, "bias": True}, {"op": "activation", "name": "relu"}]
    for config in (
        {"kind": "cosine"},
        {"kind": "mlp", "combine": "diff", "head": [], "reduce": "sum"},
        {"kind": "mlp", "combine": "concat", "head": concat, "reduce": "sum"},  # by per-node projections
    ):
        decoder = build_decoder(config)
        with torch.no_grad():
            for p in decoder.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        full = pair_scores(decoder, s.numpy(), c.numpy())
        rows = decoder.raw(s.repeat_interleave(9, 0), c.repeat(7, 1)).reshape(7, 9).numpy()
        assert np.allclose(full, rows, rtol=1e-5, atol=1e-6)


def test_merge_ranks_within_each_source():
    src, dst, score, rank = merge_topk(
        np.array([2, 1, 2, 2, 1]), np.array([5, 3, 4, 9, 8]), np.array([0.5, 1.0, 0.5, 0.9, 1.0]), 2
    )
    assert list(zip(src, dst, rank, strict=True)) == [(1, 3, 1), (1, 8, 2), (2, 9, 1), (2, 4, 2)]


def test_tile_scored_in_row_chunks_equals_brute_force(case, monkeypatch):
    """A tile whose scores exceed TILE_SCORES is scored a few sources at a time; equal scores at the
    k-th place still rank by id."""
    from sparkgnn.linkpred import tiles

    ids, h = case
    monkeypatch.setattr(tiles, "TILE_SCORES", 700)  # 2 sources of 300 candidates per chunk
    decoder = build_decoder({"kind": "dot"})
    best = _brute_force(h[:25] @ h.T, ids[:25], ids, 1)
    exclude = {(s, c) for s, c, _rank in best}  # each source's best: the exclusions change every answer
    ex = (np.array([s for s, _ in exclude]), np.array([d for _, d in exclude]))
    src, dst, _score = tile_topk(decoder, ids[:25], h[:25], ids, h, K, ex)
    _s, _d, _sc, rank = merge_topk(src, dst, _score, K)
    expected = _brute_force(h[:25] @ h.T, ids[:25], ids, K, exclude)
    assert sorted(zip(_s.tolist(), _d.tolist(), rank.tolist(), strict=True)) == sorted(expected)


def _mask_reference(scores: np.ndarray, keep: int, excluded) -> tuple:
    """Every entry at least its row's keep-th best by a full sort, excluded pairs never."""
    scores[excluded[0], excluded[1]] = -np.inf
    kth = -np.sort(-scores, axis=1)[:, keep - 1 : keep]
    rows, cols = np.nonzero((scores >= kth) & (scores > -np.inf))
    return rows, cols, scores[rows, cols]


def test_the_selection_keeps_every_score_at_the_cut():
    """select_kept keeps the same (row, col, score) triples as a full sort's mask: every score at
    least its row's k-th best, equal scores at the cut included (rows whose ties run past keep + 1
    and rows without ties, in one matrix), excluded pairs never, a row whose every candidate is
    excluded empty."""
    rng = np.random.default_rng(3)
    tied = rng.integers(-3, 4, size=(40, 70)).astype(np.float32)  # many ties at the cut
    distinct = rng.standard_normal((40, 70)).astype(np.float32)  # none: the top-k' rows
    mixed = np.where(np.arange(40)[:, None] % 2 == 0, tied, distinct)
    rows_ex = np.r_[rng.integers(0, 40, 50), np.full(70, 7)]  # row 7: every candidate excluded
    cols_ex = np.r_[rng.integers(0, 70, 50), np.arange(70)]
    for scores, keep in itertools.product((tied, distinct, mixed), (1, 5, 69, 70)):
        host = _mask_reference(scores.copy(), keep, (rows_ex, cols_ex))
        dev = tiles.select_kept(torch.from_numpy(scores.copy()), keep, (rows_ex, cols_ex))
        as_set = lambda t: set(zip(t[0].tolist(), t[1].tolist(), t[2].tolist(), strict=True))  # noqa: E731
        assert as_set(dev) == as_set(host)
        assert 7 not in host[0].tolist()
        assert len(host[0]) >= 39 * keep - 50  # the 50 random exclusions may each cost a row one


def test_devices_are_named_and_a_missing_gpu_is_refused():
    assert tiles.check_device("cuda:1") == "cuda:1"
    for bad in ("gpu", "cuda:", "CPU", "cuda:x", None):
        with pytest.raises(ValueError, match="device must be cpu, cuda or cuda:i"):
            tiles.check_device(bad)
    assert tiles.resolve_device(None).type == "cpu"
    assert tiles.tile_budget(torch.device("cpu"), None) == tiles.TILE_SCORES
    assert tiles.tile_budget(torch.device("cuda"), None) == tiles.DEVICE_TILE_SCORES
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="top-k on cuda asked for, but this process sees no CUDA device"):
            tiles.resolve_device("cuda")
        with pytest.raises(ValueError, match="sees no CUDA device"):
            table_topk(build_decoder({"kind": "dot"}), np.arange(2), np.ones((2, 3), np.float32),
                       np.arange(4), np.ones((4, 3), np.float32), 2, device="cuda")  # fmt: skip


@pytest.mark.parametrize("tile_scores", [None, 60 * 7])
def test_the_device_path_run_on_cpu_tensors_equals_the_host_path(case, monkeypatch, tile_scores):
    """The GPU's code path (the decoder moved, by default one whole tile, the candidates given as a
    tensor already on the device as a task passes them) run on CPU tensors: the host path's answer
    exactly."""
    ids, h = case
    order = np.argsort(ids)
    cand_ids, cands = ids[order], h[order]
    ex = (ids[:30], cand_ids[:30])
    decoder = build_decoder({"kind": "dot"})
    host = [table_topk(decoder, ids[i : i + 20], h[i : i + 20], cand_ids, cands, K, ex) for i in (0, 20)]
    monkeypatch.setattr(tiles, "DEVICE_PATH_ON_CPU", True)
    monkeypatch.setattr(tiles, "DEVICE_TILE_SCORES", 50 * 20)  # 20 sources: chunks of 2 sources
    on_device = torch.from_numpy(cands)
    dev = [
        table_topk(decoder, ids[i : i + 20], h[i : i + 20], cand_ids, c, K, ex, tile_scores=tile_scores)
        for i, c in ((0, cands), (20, on_device))
    ]
    for a, b in zip(host, dev, strict=True):
        for x, y in zip(a, b, strict=True):
            assert np.array_equal(x, y)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "config", [{"kind": "dot"}, {"kind": "mlp", "combine": "hadamard", "head": [], "reduce": "sum"}]
)
def test_table_topk_on_cuda_equals_the_cpu(case, config):
    """Small integers: every product is exact in float32 on both devices, so the answers (ties by id,
    exclusions, tiles of 7 rows) must be identical, not merely close."""
    ids, h = case
    order = np.argsort(ids)
    src_ids, sources = ids[:60], h[:60]
    ex = (src_ids[:30], ids[order][:30])
    decoder = build_decoder(config)
    cpu = table_topk(decoder, src_ids, sources, ids[order], h[order], K, ex, tile_scores=60 * 7)
    gpu = table_topk(decoder, src_ids, sources, ids[order], h[order], K, ex, tile_scores=60 * 7, device="cuda")
    for a, b in zip(cpu, gpu, strict=True):
        assert np.array_equal(a, b)
