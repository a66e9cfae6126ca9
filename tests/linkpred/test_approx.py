"""linkpred/approx.py: the HNSW shard search merged over shards reaches recall@10 >= 0.95 against a
numpy brute force and never returns an excluded pair; spark_jobs/topk.py --approx end to end: the
exact job's schema, recall reported (log + JSON) >= 0.95; a decoder that is not an inner product and
candidates naming unknown ids are refused with one line and nothing written."""

import json
import os

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import topk

from sparkgnn.decoders import build_decoder
from sparkgnn.linkpred.approx import (
    IndexParams,
    ShardIndex,
    check_approx_decoder,
    index_pays,
    search_vectors,
    shard_topk,
)
from sparkgnn.linkpred.tiles import merge_topk

K = 10


def _clustered(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = 3 * rng.standard_normal((40, dim))
    return (centres[rng.integers(0, 40, n)] + rng.standard_normal((n, dim))).astype(np.float32)


@pytest.mark.parametrize("kind", ["dot", "cosine"])
def test_sharded_index_recall_and_exclusion(kind):
    decoder = build_decoder({"kind": kind})
    h = _clustered(4000, 32, seed=1)
    ids = np.random.default_rng(2).permutation(100_000)[:4000].astype(np.int64)
    src = np.arange(0, 4000, 20)  # 200 sources
    vectors = search_vectors(decoder, h)
    exact = vectors[src] @ vectors.T
    banned = {(int(ids[s]), int(ids[np.argmax(exact[i])])) for i, s in enumerate(src)}  # each source's best
    ex = (np.array([s for s, _ in banned]), np.array([d for _, d in banned]))
    partial = []
    for shard in np.array_split(np.arange(4000), 3):
        order = shard[np.argsort(ids[shard])]
        index = ShardIndex(vectors[order], IndexParams())
        partial.append(shard_topk(index, ids[order], vectors[order], ids[src], vectors[src], K, ex))
    got_src, got_dst, _score, _rank = merge_topk(*(np.concatenate(c) for c in zip(*partial, strict=True)), K)
    got = set(zip(got_src.tolist(), got_dst.tolist(), strict=True))
    assert not got & banned
    hits = 0
    for i, s in enumerate(src):
        mask = np.array([(int(ids[s]), int(c)) not in banned for c in ids])
        best = ids[np.flatnonzero(mask)[np.argsort(-exact[i][mask], kind="stable")[:K]]]
        hits += sum((int(ids[s]), int(c)) in got for c in best)
    assert hits / (K * len(src)) >= 0.95


def test_index_pays_only_for_many_sources():
    assert not index_pays(5_000, 200_000, 2)  # the build alone outweighs 5K x 200K exact scores
    assert index_pays(200_000, 200_000, 2)
    assert not index_pays(200_000, 200_000, 2, IndexParams(ef_construction=800))
    with pytest.raises(ValueError, match="index when must be 'auto' or 'always'"):
        IndexParams(when="never")


def test_only_inner_product_decoders_and_sane_params():
    check_approx_decoder(build_decoder({"kind": "dot"}))
    with pytest.raises(ValueError, match="--approx needs a dot or cosine decoder"):
        check_approx_decoder(build_decoder({"kind": "mlp", "combine": "diff", "head": [], "reduce": "sum"}))
    with pytest.raises(ValueError, match="ef_search must be an integer >= 1"):
        IndexParams(ef_search=0)


def test_topk_approx_job(spark, linkpred_case, capsys, caplog):
    root, graph, data, _encoder, models = linkpred_case
    out, report = str(root / "approx"), str(root / "approx.json")
    argv = [
        "--graph",
        graph,
        "--model",
        models["dot"][1],
        "--k",
        str(K),
        "--approx",
        "--exclude-edges",
        "--index",
        "always",
    ]
    with caplog.at_level("INFO", logger="sparkgnn"):
        assert topk.main([*argv, "--out", out, "--partitions", "3", "--report", report, "--recall-sample", "40"]) == 0
    assert "recall@10 of the approximate top-k" in caplog.text
    expected = spark.createDataFrame([], topk_schema()).schema
    assert spark.read.parquet(out).schema == expected
    doc = json.loads(open(report).read())
    assert doc["approx"] and doc["recall_sources"] == 40 and doc["recall@10"] >= 0.95
    table = pq.read_table(out).to_pandas()
    assert table.groupby("src")["rank"].max().max() == K
    known = set(zip(data.edge_src.tolist(), data.edge_dst.tolist(), strict=True))
    assert not known & set(zip(table.src.tolist(), table.dst.tolist(), strict=True))

    never = str(root / "never")
    assert topk.main(["--graph", graph, "--model", models["mlp"][1], "--k", "3", "--approx", "--out", never]) == 2
    assert "--approx needs a dot or cosine decoder" in capsys.readouterr().err
    pd.DataFrame({"id": [int(data.ids.max()) + 5, int(data.ids[0])]}).to_parquet(root / "bad_cands.parquet")
    bad = ["--candidates", str(root / "bad_cands.parquet"), "--out", never]
    assert topk.main(["--graph", graph, "--model", models["dot"][1], "--k", "3", "--approx", *bad]) == 2
    assert "1 id(s) the graph does not have" in capsys.readouterr().err
    assert not os.path.exists(never)


def topk_schema() -> str:
    from sparkgnn.linkpred.topk import TOPK_SCHEMA

    return TOPK_SCHEMA
