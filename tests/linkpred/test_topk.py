"""spark_jobs/topk.py + linkpred/topk.py end to end on a small graph: the exact top-k (known edges
excluded, P = 3 source blocks x 3 candidate tiles) equals a numpy brute force on PyG's embeddings;
k <= 0 is refused."""

import os

import numpy as np
import pandas as pd
import pytest
import topk
import torch
from linkpred_helpers import RELATIONS, pyg_embeddings

from sparkgnn.linkpred.topk import check_k

K = 5


def test_topk_job_equals_brute_force(spark, linkpred_case):
    root, graph, data, encoder, models = linkpred_case
    _decoder, model = models["dot"]
    sources = np.sort(np.random.default_rng(2).choice(data.ids, 30, replace=False))
    pd.DataFrame({"id": sources}).to_parquet(root / "sources.parquet")
    out = str(root / "topk")
    argv = ["--graph", graph, "--model", model, "--k", str(K), "--out", out, "--sources", str(root / "sources.parquet")]
    assert topk.main([*argv, "--exclude-edges", "--partitions", "3"]) == 0
    got = pd.read_parquet(out).sort_values(["src", "rank"])
    z = pyg_embeddings(data, encoder).numpy()
    index = {int(v): i for i, v in enumerate(data.ids)}
    known = set(zip(data.edge_src.tolist(), data.edge_dst.tolist(), strict=True))
    for s in sources:
        scores = z @ z[index[int(s)]]
        ranked = sorted((-scores[i], int(c)) for i, c in enumerate(data.ids) if (int(s), int(c)) not in known)[:K]
        rows = got[got.src == s]
        assert rows.dst.tolist() == [c for _, c in ranked]
        assert rows["rank"].tolist() == list(range(1, K + 1))
        assert np.allclose(rows.score.to_numpy(), [-v for v, _ in ranked], rtol=1e-5, atol=1e-6)


def test_k_must_be_positive(capsys):
    for bad in (0, -3):
        with pytest.raises(ValueError, match="k must be an integer >= 1"):
            check_k(bad)
    with pytest.raises(SystemExit):
        topk.parse_args(["--graph", ".", "--model", ".", "--k", "0", "--out", "x"])
    assert "--k: must be >= 1" in capsys.readouterr().err


def test_device_flag_is_checked_before_anything_runs(spark, linkpred_case, capsys):
    """--device: a name topk can use, the exact path only, and (local session) a GPU this machine
    has; each refusal is one line, exit 2, and nothing written."""
    root, graph, _data, _encoder, models = linkpred_case
    argv = ["--graph", graph, "--model", models["dot"][1], "--k", "3", "--out", str(root / "dev_out")]
    with pytest.raises(SystemExit):
        topk.parse_args([*argv, "--device", "gpu"])
    assert "--device: must be cpu, cuda or cuda:i, got 'gpu'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        topk.parse_args([*argv, "--device", "cuda", "--approx"])
    assert "--device cuda scores the exact top-k; --approx and --eval run on the CPU" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert topk.main([*argv, "--device", "cuda:0"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--device cuda:0: top-k on cuda:0 asked for, but this process sees no CUDA" in err[0]
        assert not os.path.exists(root / "dev_out")


def test_topk_per_relation_equals_brute_force(spark, linkpred_case):
    root, graph, data, encoder, models = linkpred_case
    decoder, model = models["distmult"]
    sources = np.sort(np.random.default_rng(5).choice(data.ids, 8, replace=False))
    pd.DataFrame({"id": sources}).to_parquet(root / "rel_sources.parquet")
    out = str(root / "rel_topk")
    argv = ["--graph", graph, "--model", model, "--k", str(K), "--out", out]
    argv += ["--sources", str(root / "rel_sources.parquet"), "--relation", "follows", "--relation", "blocks"]
    assert topk.main([*argv, "--partitions", "2"]) == 0
    got = pd.read_parquet(out).sort_values(["src", "relation", "rank"])
    assert list(got.columns) == ["src", "relation", "dst", "score", "rank"]
    z = pyg_embeddings(data, encoder).numpy()
    rel = decoder.rel_emb.detach().numpy()
    index = {int(v): i for i, v in enumerate(data.ids)}
    for name in ("follows", "blocks"):
        for s in sources:
            scores = (z * rel[RELATIONS.index(name)]) @ z[index[int(s)]]
            ranked = sorted((-scores[i], int(c)) for i, c in enumerate(data.ids))[:K]
            rows = got[(got.src == s) & (got.relation == name)]
            assert rows.dst.tolist() == [c for _, c in ranked]
            assert np.allclose(rows.score.to_numpy(), [-v for v, _ in ranked], rtol=1e-5, atol=1e-5)
    assert set(got.relation) == {"follows", "blocks"}


def test_online_answers_equal_the_batch_jobs(spark, linkpred_case, tmp_path):
    """POST /v1/score and /v1/topk of a service over a PE store of the graph answer a query as
    score_edges.py and topk.py (no --exclude-edges: the service ranks every vertex) answer it."""
    import json
    import urllib.request

    import score_edges

    from sparkgnn.models import Model
    from sparkgnn.pe.local import precompute_local
    from sparkgnn.serving.online.config import ServeConfig
    from sparkgnn.serving.online.server import Server

    root, graph, data, _encoder, models = linkpred_case
    _decoder, model = models["mlp"]
    rng = np.random.default_rng(11)
    pairs = pd.DataFrame({"src": rng.choice(data.ids, 12), "dst": rng.choice(data.ids, 12)})
    pairs.to_parquet(tmp_path / "pairs.parquet")
    sources = np.sort(rng.choice(data.ids, 3, replace=False))
    pd.DataFrame({"id": sources}).to_parquet(tmp_path / "sources.parquet")
    argv = ["--graph", graph, "--model", model, "--partitions", "2"]
    assert score_edges.main([*argv, "--pairs", str(tmp_path / "pairs.parquet"), "--out", str(tmp_path / "s")]) == 0
    topk_argv = ["--k", str(K), "--sources", str(tmp_path / "sources.parquet"), "--out", str(tmp_path / "t")]
    assert topk.main([*argv, *topk_argv]) == 0
    scored = pd.read_parquet(tmp_path / "s")
    ranked = pd.read_parquet(tmp_path / "t").sort_values(["src", "rank"])

    precompute_local(data, Model.load(model), str(tmp_path / "store"))
    config = ServeConfig(graph=graph, model=model, store=str(tmp_path / "store"))

    def post(url: str, path: str, body: dict) -> dict:
        req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as response:
            return json.loads(response.read())

    with Server(config) as server:
        score_reply = post(server.http_url, "/v1/score", {"pairs": pairs.to_numpy().tolist()})
        topk_reply = post(server.http_url, "/v1/topk", {"sources": sources.tolist(), "k": K})
    online = pd.DataFrame(score_reply["scores"])
    both = pairs.drop_duplicates().merge(scored, on=["src", "dst"]).merge(online, on=["src", "dst"])
    assert len(both) == len(pairs.drop_duplicates())
    np.testing.assert_allclose(both.score_x, both.score_y, rtol=1e-5, atol=1e-6)
    for entry in topk_reply["topk"]:
        batch = ranked[ranked.src == entry["src"]]
        assert [c["dst"] for c in entry["candidates"]] == batch.dst.tolist()
        assert [c["rank"] for c in entry["candidates"]] == batch["rank"].tolist()
        np.testing.assert_allclose([c["score"] for c in entry["candidates"]], batch.score, rtol=1e-5, atol=1e-6)
    assert sorted(e["src"] for e in topk_reply["topk"]) == sources.tolist()


def test_topk_frame_cuts_blocks_by_bytes_and_stays_exact(spark):
    """A block budget far below the outputs' bytes cuts sources and candidates into many blocks (so
    no row outgrows it) and the answer, known edges excluded, still equals the brute force."""
    from sparkgnn.decoders import build_decoder
    from sparkgnn.linkpred.topk import block_count, topk_frame

    rng = np.random.default_rng(11)
    h = rng.integers(-2, 3, size=(120, 4)).astype(np.float32)  # coarse: many ties, ordered by id
    node_ids = rng.permutation(5_000)[:120].astype(np.int64)
    nodes = spark.createDataFrame(
        pd.DataFrame({"id": node_ids, "h": [row.tolist() for row in h]}), "id long, h array<float>"
    )
    pairs = {(int(node_ids[i]), int(node_ids[j])) for i, j in rng.integers(0, 120, size=(200, 2))}
    exclude = spark.createDataFrame(pd.DataFrame(sorted(pairs), columns=["src", "dst"]), "src long, dst long")
    budget = 120 * (8 + 4 * 4) // 4  # a quarter of the outputs per block: 4 x 4 (source, candidate) blocks
    assert block_count(nodes, 2, block_bytes=budget) == 4
    assert block_count(nodes, 16, block_bytes=budget) == 16
    got = (
        topk_frame(
            nodes,
            build_decoder({"kind": "dot"}),
            K,
            exclude=exclude,
            partitions=2,
            block_bytes=budget,
            broadcast_bytes=0,
        )
        .toPandas()
        .sort_values(["src", "rank"])
    )
    scores = h @ h.T
    for i, s in enumerate(node_ids):
        ranked = sorted((-scores[i, j], int(c)) for j, c in enumerate(node_ids) if (int(s), int(c)) not in pairs)[:K]
        rows = got[got.src == s]
        assert rows.dst.tolist() == [c for _, c in ranked]
        assert rows["rank"].tolist() == list(range(1, K + 1))
        assert np.allclose(rows.score.to_numpy(), [-v for v, _ in ranked])
    with pytest.raises(ValueError, match="partitions must be an integer >= 1"):
        block_count(nodes, 0)


def test_broadcasts_made_inside_a_scope_are_destroyed_when_it_exits(spark):
    """The candidates' broadcast of the top-k path lives as long as the caller needs its frames:
    inside broadcast_scope the frame is answered from it; when the block exits it is destroyed
    (outside any scope it is left to the session)."""
    from sparkgnn.decoders import build_decoder
    from sparkgnn.linkpred.topk import broadcast_scope, share_outputs, topk_frame

    h = np.arange(24, dtype=np.float32).reshape(6, 4)
    nodes = spark.createDataFrame(
        pd.DataFrame({"id": np.arange(6, dtype=np.int64), "h": [row.tolist() for row in h]}), "id long, h array<float>"
    )
    with broadcast_scope():
        shared = share_outputs(nodes, (6, 4))
        got = topk_frame(nodes, build_decoder({"kind": "dot"}), 2, partitions=2).toPandas()
        assert shared._jbroadcast.isValid()
    assert len(got) == 12 and not shared._jbroadcast.isValid()
    outside = share_outputs(nodes, (6, 4))
    assert outside._jbroadcast.isValid()
    outside.destroy()
