"""linkpred/evaluate.py: OGB's ranks (ties counted half) and MRR / hits@K equal a hand computation;
the tile-wise full-ranking counts and the sampled-negative counts equal it too; spark_jobs/topk.py
--eval end to end equals a numpy computation on PyG's embeddings, and the sampled path's counts
equal a numpy computation over the negatives it drew."""

import numpy as np
import pandas as pd
import pytest
import topk
from linkpred_helpers import pyg_embeddings

from sparkgnn.decoders import build_decoder
from sparkgnn.linkpred.evaluate import (
    ogb_rank,
    rank_metrics,
    sample_negatives,
    sampled_batch,
    sampled_counts,
    table_counts,
    tile_counts,
)

# node id -> output; dot scores from 10: 10:2 20:1 30:1 40:3 50:1; from 50: 10:1 20:0 30:0 40:1 50:1
H = {10: [1, 1], 20: [1, 0], 30: [1, 0], 40: [2, 1], 50: [0, 1]}
POS_SRC, POS_DST = np.array([10, 10, 50]), np.array([20, 40, 30])
# (10, 20): others score 2, 1, 3, 1 vs 1 -> 2 above, 4 at least, rank 4; (10, 40): rank 1;
# (50, 30): others 1, 0, 1, 1 vs 0 -> 3 above, 4 at least, rank 4.5
GREATER, AT_LEAST, RANKS = [2, 0, 3], [4, 0, 4], [4.0, 1.0, 4.5]
# filtered by the known edge (10, 40): (10, 20) -> 1 above, 3 at least, rank 3
FILTERED_RANKS = [3.0, 1.0, 4.5]


def _h(node_ids) -> np.ndarray:
    return np.array([H[int(i)] for i in node_ids], dtype=np.float32)


def test_ogb_ranks_and_metrics_by_hand():
    assert ogb_rank(np.array(GREATER), np.array(AT_LEAST)).tolist() == RANKS
    got = rank_metrics(np.array(RANKS))
    assert got["mrr"] == pytest.approx((1 / 4 + 1 + 1 / 4.5) / 3)
    assert (got["hits@1"], got["hits@10"], got["hits@50"]) == (pytest.approx(1 / 3), 1.0, 1.0)
    with pytest.raises(ValueError, match="no held-out positives"):
        rank_metrics(np.array([]))


@pytest.mark.parametrize("excluded", [False, True])
def test_tile_counts_summed_over_tiles_equal_hand(excluded):
    decoder = build_decoder({"kind": "dot"})
    src_ids = np.array([50, 10])
    exclude = (np.array([10]), np.array([40])) if excluded else None
    greater, at_least = np.zeros(3, np.int64), np.zeros(3, np.int64)
    for tile in ([30, 10, 50], [40, 20]):
        tile = np.array(tile)
        g, a = tile_counts(decoder, src_ids, _h(src_ids), tile, _h(tile), POS_SRC, POS_DST, _h(POS_DST), exclude)
        greater, at_least = greater + g, at_least + a
    assert ogb_rank(greater, at_least).tolist() == (FILTERED_RANKS if excluded else RANKS)


@pytest.mark.parametrize("excluded", [False, True])
@pytest.mark.parametrize("tile_scores", [1, 4, 1 << 20])
def test_table_counts_walk_every_candidate_tile_by_hand(excluded, tile_scores):
    """Counted whole against every candidate (ascending ids), in tiles of 1, a few or all rows."""
    decoder = build_decoder({"kind": "dot"})
    src_ids, cand_ids = np.array([50, 10]), np.array(sorted(H))
    exclude = (np.array([10]), np.array([40])) if excluded else None
    args = (decoder, src_ids, _h(src_ids), cand_ids, _h(cand_ids), POS_SRC, POS_DST, _h(POS_DST), exclude)
    greater, at_least = table_counts(*args, tile_scores=tile_scores)
    assert ogb_rank(greater, at_least).tolist() == (FILTERED_RANKS if excluded else RANKS)
    with pytest.raises(ValueError, match="tile_scores must be >= 1"):
        table_counts(*args, tile_scores=0)


def test_sampled_batch_by_hand():
    decoder = build_decoder({"kind": "dot"})
    negatives = np.array([[40, 30, 20], [20, 30, 50]])  # a draw may be the positive itself (unfiltered)
    greater, at_least = sampled_batch(decoder, _h(POS_SRC[:2]), _h(POS_DST[:2]), _h(negatives.ravel()).reshape(2, 3, 2))
    assert greater.tolist() == [1, 0] and at_least.tolist() == [3, 0]


def test_eval_job_and_sampled_negatives(spark, linkpred_case, caplog):
    root, graph, data, encoder, models = linkpred_case
    rng = np.random.default_rng(7)
    held = pd.DataFrame({"src": rng.choice(data.ids, 25), "dst": rng.choice(data.ids, 25)}).drop_duplicates()
    held.to_parquet(root / "held.parquet")
    out = str(root / "eval")
    argv = ["--graph", graph, "--model", models["dot"][1], "--eval", str(root / "held.parquet"), "--out", out]
    with caplog.at_level("INFO", logger="sparkgnn"):
        assert topk.main([*argv, "--exclude-edges", "--partitions", "3"]) == 0
    assert "eval of" in caplog.text
    got = pd.read_parquet(out).iloc[0]
    z = pyg_embeddings(data, encoder).numpy()
    index = {int(v): i for i, v in enumerate(data.ids)}
    known = set(zip(data.edge_src.tolist(), data.edge_dst.tolist(), strict=True))
    ranks = []
    for s, d in zip(held.src, held.dst, strict=True):
        scores = z @ z[index[int(s)]]
        pos = scores[index[int(d)]]
        neg = np.array([scores[i] for i, c in enumerate(data.ids) if int(c) != d and (int(s), int(c)) not in known])
        ranks.append(1 + 0.5 * ((neg > pos).sum() + (neg >= pos).sum()))
    expected = rank_metrics(np.array(ranks))
    assert got["positives"] == len(held)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-9), name

    nodes = spark.createDataFrame([(i, [float(v) for v in h]) for i, h in H.items()], "id long, h array<float>")
    positives = spark.createDataFrame(list(zip(POS_SRC.tolist(), POS_DST.tolist(), strict=True)), "src long, dst long")
    drawn = sample_negatives(positives, nodes.select("id"), 6, seed=3).toPandas()
    again = sample_negatives(positives, nodes.select("id"), 6, seed=3).toPandas()
    assert len(drawn) == 18 and set(drawn.neg) <= set(H)
    key = ["src", "dst", "neg"]
    assert drawn.sort_values(key).reset_index(drop=True).equals(again.sort_values(key).reset_index(drop=True))
    counts = sampled_counts(nodes, positives, build_decoder({"kind": "dot"}), nodes.select("id"), 6, seed=3).toPandas()
    for row in counts.itertuples():
        negs = drawn[(drawn.src == row.src) & (drawn.dst == row.dst)].neg
        pos = float(np.dot(H[row.src], H[row.dst]))
        neg = np.array([np.dot(H[row.src], H[int(c)]) for c in negs])
        assert (row.greater, row.at_least) == ((neg > pos).sum(), (neg >= pos).sum())
    assert len(counts) == 3


def test_full_counts_broadcast_and_tile_paths_equal_hand(spark, caplog):
    """Both full-ranking paths (candidates broadcast, P = 1; or forced onto source blocks x candidate
    tiles by a zero broadcast budget, P = 3) equal a numpy count: coarse integer outputs (many ties),
    known edges excluded, a positive's own dst never a negative, duplicates counted once. The
    broadcast path at P = 3 is test_eval_job_and_sampled_negatives' (the job's --eval)."""
    from sparkgnn.linkpred.evaluate import full_counts

    rng = np.random.default_rng(3)
    node_ids = rng.permutation(1_000)[:40].astype(np.int64)
    h = rng.integers(-2, 3, size=(40, 3)).astype(np.float32)
    nodes = spark.createDataFrame(
        pd.DataFrame({"id": node_ids, "h": [row.tolist() for row in h]}), "id long, h array<float>"
    )
    pos = [(int(node_ids[i]), int(node_ids[j])) for i, j in rng.integers(0, 40, size=(30, 2))]
    known = {(int(node_ids[i]), int(node_ids[j])) for i, j in rng.integers(0, 40, size=(120, 2))} | set(pos[:5])
    positives = spark.createDataFrame(pos + pos[:3], "src long, dst long")
    exclude = spark.createDataFrame(sorted(known), "src long, dst long")
    row = {int(v): i for i, v in enumerate(node_ids)}
    expected = {}
    for s, d in set(pos):
        scores = h @ h[row[s]]
        neg = np.array([scores[i] for i, c in enumerate(node_ids) if c != d and (s, int(c)) not in known])
        expected[(s, d)] = (int((neg > scores[row[d]]).sum()), int((neg >= scores[row[d]]).sum()))
    decoder = build_decoder({"kind": "dot"})
    cases = [({}, 1, "collected and broadcast"), ({"broadcast_bytes": 0}, 3, "exceed the broadcast budget")]
    for options, partitions, said in cases:
        caplog.clear()
        with caplog.at_level("INFO", logger="sparkgnn"):
            rows = full_counts(nodes, positives, decoder, exclude=exclude, partitions=partitions, **options).toPandas()
        assert said in caplog.text, (options, partitions)
        assert len(rows) == len(expected), (options, partitions)
        counts = {(r.src, r.dst): (r.greater, r.at_least) for r in rows.itertuples()}
        assert counts == expected, (options, partitions)
