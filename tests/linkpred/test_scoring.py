"""spark_jobs/score_edges.py + linkpred/scoring.py, end to end on a small graph: scores equal the
PyG decoder on PyG's embeddings; pairs naming unknown ids are refused and nothing is written."""

import os

import numpy as np
import pandas as pd
import score_edges
import torch
from linkpred_helpers import RELATIONS, pyg_embeddings
from torch_test_graphs import rel_err


def test_score_edges_equals_pyg_and_refuses_unknown_ids(spark, linkpred_case, capsys):
    root, graph, data, encoder, models = linkpred_case
    decoder, model = models["mlp"]
    rng = np.random.default_rng(1)
    pairs = pd.DataFrame({"src": rng.choice(data.ids, 40), "dst": rng.choice(data.ids, 40)})
    pairs.to_parquet(root / "pairs.parquet")
    out = str(root / "scores")
    assert (
        score_edges.main(["--graph", graph, "--model", model, "--pairs", str(root / "pairs.parquet"), "--out", out])
        == 0
    )
    got = pd.read_parquet(out).sort_values(["src", "dst"]).reset_index(drop=True)
    z = pyg_embeddings(data, encoder)
    index = {int(v): i for i, v in enumerate(data.ids)}
    with torch.no_grad():
        expected = decoder(z[[index[s] for s in got.src]], z[[index[d] for d in got.dst]])
    assert len(got) == 40
    assert rel_err(torch.tensor(got.score.to_numpy()), expected) < 1e-5

    bad = pd.DataFrame({"src": [int(data.ids[0])], "dst": [int(data.ids.max()) + 17]})
    bad.to_parquet(root / "bad.parquet")
    fresh = str(root / "never")
    argv = ["--graph", graph, "--model", model, "--pairs", str(root / "bad.parquet"), "--out", fresh]
    assert score_edges.main(argv) == 2
    assert "1 id(s) the graph does not have" in capsys.readouterr().err
    assert not os.path.exists(fresh)


def test_score_edges_per_relation_equals_pyg_distmult(spark, linkpred_case, capsys):
    root, graph, data, encoder, models = linkpred_case
    decoder, model = models["distmult"]
    rng = np.random.default_rng(3)
    names = rng.choice(RELATIONS, 30)
    pairs = pd.DataFrame({"src": rng.choice(data.ids, 30), "dst": rng.choice(data.ids, 30), "relation": names})
    pairs.to_parquet(root / "rel_pairs.parquet")
    out = str(root / "rel_scores")
    argv = ["--graph", graph, "--model", model, "--pairs", str(root / "rel_pairs.parquet"), "--out", out]
    assert score_edges.main(argv) == 0
    got = pd.read_parquet(out).sort_values(["src", "dst", "relation"]).reset_index(drop=True)
    assert list(got.columns) == ["src", "dst", "relation", "score"] and len(got) == 30
    z = pyg_embeddings(data, encoder)
    index = {int(v): i for i, v in enumerate(data.ids)}
    edge_index = torch.tensor([[index[s] for s in got.src], [index[d] for d in got.dst]])
    edge_type = torch.tensor([RELATIONS.index(r) for r in got.relation])
    with torch.no_grad():
        expected = decoder(z, edge_index, edge_type)
    assert rel_err(torch.tensor(got.score.to_numpy()), expected) < 1e-5

    pairs.assign(relation=["hates"] + list(names[1:])).to_parquet(root / "bad_rel.parquet")
    fresh = str(root / "never_rel")
    argv = ["--graph", graph, "--model", model, "--pairs", str(root / "bad_rel.parquet"), "--out", fresh]
    assert score_edges.main(argv) == 2
    assert "unknown relation 'hates'" in capsys.readouterr().err
    assert not os.path.exists(fresh)
