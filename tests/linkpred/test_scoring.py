"""spark_jobs/score_edges.py + linkpred/scoring.py, end to end on a small graph: scores equal the
PyG decoder on PyG's embeddings; pairs naming unknown ids are refused and nothing is written."""

import os

import numpy as np
import pandas as pd
import pytest
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


def test_score_gathered_gathers_by_position_and_leaves_out_null_or_unknown_ids():
    import pyarrow as pa

    from sparkgnn.decoders import DotDecoder
    from sparkgnn.linkpred.scoring import NodeTable, score_gathered

    rng = np.random.default_rng(5)
    node_ids = np.array([40, 7, 19, 3, 88], dtype=np.int64)
    h = rng.standard_normal((5, 4)).astype(np.float32)
    table = NodeTable.from_arrow(pa.table({"id": node_ids, "h": pa.array(list(h), pa.list_(pa.float32()))}))
    assert table.ids.tolist() == [3, 7, 19, 40, 88]
    batch = pa.record_batch(
        {
            "src": pa.array([40, 3, 5, None, 88], pa.int64()),
            "dst": pa.array([7, 88, 7, 19, 1000], pa.int64()),
        }
    )
    got = score_gathered(DotDecoder(), table, batch)
    assert got.column("src").to_pylist() == [40, 3]  # 5 and 1000 are unknown, None is null
    assert got.column("dst").to_pylist() == [7, 88]
    row = {int(v): h[i] for i, v in enumerate(node_ids)}
    expected = [float(row[40] @ row[7]), float(row[3] @ row[88])]
    assert np.allclose(got.column("score").to_numpy(), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="twice"):
        NodeTable.from_arrow(pa.table({"id": [1, 1], "h": pa.array([[0.0], [1.0]], pa.list_(pa.float32()))}))


def test_score_edges_whole_graph_by_joins_equals_pyg_and_broadcast_refuses_unknown_ids(
    spark, linkpred_case, capsys, monkeypatch
):
    """Pairs naming most vertices: no frontier, every vertex computed. Scored through the joins
    (broadcast cap 0) equal to PyG; an unknown id among them is found by the broadcast scoring
    pass's row count and refused with nothing written."""
    from sparkgnn.linkpred import scoring

    root, graph, data, encoder, models = linkpred_case
    decoder, model = models["dot"]
    rng = np.random.default_rng(2)
    pairs = pd.DataFrame({"src": rng.choice(data.ids, 300), "dst": rng.choice(data.ids, 300)})
    pairs.to_parquet(root / "many.parquet")
    out = str(root / "many_scores")
    monkeypatch.setattr(scoring, "BROADCAST_BYTES", 0)
    argv = ["--graph", graph, "--model", model, "--pairs", str(root / "many.parquet"), "--out", out]
    assert score_edges.main(argv) == 0
    logged = capsys.readouterr()
    assert "every vertex is computed" in logged.out + logged.err
    assert "node outputs joined onto the pairs" in logged.out + logged.err
    got = pd.read_parquet(out)
    assert len(got) == 300
    z = pyg_embeddings(data, encoder)
    index = {int(v): i for i, v in enumerate(data.ids)}
    with torch.no_grad():
        expected = decoder(z[[index[s] for s in got.src]], z[[index[d] for d in got.dst]])
    assert rel_err(torch.tensor(got.score.to_numpy()), expected) < 1e-5

    monkeypatch.undo()
    pairs.loc[7, "dst"] = int(data.ids.max()) + 5
    pairs.to_parquet(root / "many_bad.parquet")
    fresh = str(root / "never_many")
    argv = ["--graph", graph, "--model", model, "--pairs", str(root / "many_bad.parquet"), "--out", fresh]
    assert score_edges.main(argv) == 2
    logged = capsys.readouterr()
    assert "broadcast" in logged.out + logged.err
    assert "1 id(s) the graph does not have" in logged.err
    assert not os.path.exists(fresh)
