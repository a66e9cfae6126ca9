"""Link prediction on typed graphs (linkpred/typed.py, the typed paths of score_edges.py and
topk.py, HeteroModel's decoder): scores, top-k and per-relation MRR equal PyG's to_hetero encoder
plus the decoder on PyG's embeddings; relations resolve by key, name or index; a relation the
graph lacks, a pair id missing in its type and candidates of a type the graph lacks are refused in
one line with nothing written."""

import os
import sys

import numpy as np
import pandas as pd
import pytest
import score_edges
import topk
import torch
from torch_test_graphs import rel_err

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.graph import write_typed_graph_dir
from sparkgnn.linkpred.typed import resolve_relation
from sparkgnn.models.hetero import HeteroModel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pe"))
from typed_testkit import IDS, authors_and_papers, pyg_data, to_hetero_sage, typed_graph  # noqa: E402

WRITES, WRITTEN_BY = ("author", "writes", "paper"), ("paper", "written_by", "author")


class TypedDistMult(torch.nn.Module):
    """DistMult with one row per edge type, called on the two ends' outputs (PyG's rgcn_link_pred form)."""

    def __init__(self, num_relations: int, width: int):
        super().__init__()
        self.rel_emb = torch.nn.Parameter(torch.randn(num_relations, width, generator=torch.Generator().manual_seed(3)))

    def forward(self, h_src, h_dst, edge_type):
        return torch.sum(h_src * self.rel_emb[edge_type] * h_dst, dim=1)


class Dot(torch.nn.Module):
    def forward(self, h_src, h_dst):
        return (h_src * h_dst).sum(dim=-1)


def test_resolve_relation_by_key_name_and_index():
    edge_types = pyg_data().metadata()[1]
    assert resolve_relation(edge_types, "author__writes__paper") == WRITES
    assert resolve_relation(edge_types, "cites") == ("paper", "cites", "paper")
    assert resolve_relation(edge_types, 1) == WRITTEN_BY
    with pytest.raises(ValueError, match="no relation 'likes'"):
        resolve_relation(edge_types, "likes")
    with pytest.raises(ValueError, match="no relation 'author__cites__paper'"):
        resolve_relation(edge_types, "author__cites__paper")
    with pytest.raises(ValueError, match="out of range"):
        resolve_relation(edge_types, 5)
    twice = [*edge_types, ("author", "cites", "author")]
    with pytest.raises(ValueError, match="'cites' is ambiguous"):
        resolve_relation(twice, "cites")


def test_hetero_model_decoder_rows_name_edge_types(tmp_path):
    d = pyg_data()
    module, _ = to_hetero_sage(d)
    every = HeteroModel.from_pyg(module, d.metadata(), decoder=TypedDistMult(5, 3))
    assert every.decoder.relations == tuple("__".join(e) for e in d.metadata()[1])
    some = HeteroModel.from_pyg(module, d.metadata(), decoder=TypedDistMult(2, 3), relations=["writes", "cites"])
    assert some.decoder.relations == ("author__writes__paper", "paper__cites__paper")
    some.save(tmp_path / "m")
    loaded = HeteroModel.load(tmp_path / "m")
    assert loaded.decoder.relations == some.decoder.relations and loaded.fingerprint() == some.fingerprint()
    assert torch.equal(loaded.decoder.rel_emb, some.decoder.rel_emb)
    with pytest.raises(UnsupportedModelError, match="3 relation rows but the model has 5 edge types"):
        HeteroModel.from_pyg(module, d.metadata(), decoder=TypedDistMult(3, 3))
    with pytest.raises(UnsupportedModelError, match="no relation 'likes'"):
        HeteroModel.from_pyg(module, d.metadata(), decoder=TypedDistMult(1, 3), relations=["likes"])
    with pytest.raises(UnsupportedModelError, match="width 4 but node type 'author'"):
        HeteroModel.from_pyg(module, d.metadata(), decoder=TypedDistMult(1, 4), relations=["writes"])


class ConcatMLP(torch.nn.Module):
    def __init__(self, width: int, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.lin1, self.lin2 = torch.nn.Linear(2 * width, 4), torch.nn.Linear(4, 1)

    def forward(self, h_src, h_dst):
        return self.lin2(self.lin1(torch.cat([h_src, h_dst], dim=-1)).relu()).squeeze(-1)


def _per_relation() -> torch.nn.ModuleDict:
    """One PyG decoder module per edge type of authors_and_papers (to_hetero's ModuleDict keys)."""
    return torch.nn.ModuleDict({"author__writes__paper": ConcatMLP(3, 1), "paper__written_by__author": ConcatMLP(3, 2)})


def test_hetero_model_per_relation_decoders_equal_pyg_and_save(tmp_path):
    from sparkgnn.linkpred.typed import relation_decoder

    d = authors_and_papers()
    module, _ = to_hetero_sage(d, layers=1)
    with torch.no_grad():
        z = module(d.x_dict, d.edge_index_dict)
    pyg = _per_relation()
    model = HeteroModel.from_pyg(module, d.metadata(), decoder=pyg)
    assert model.spec["decoder"]["kind"] == "per_relation"
    model.save(tmp_path / "m")
    loaded = HeteroModel.load(tmp_path / "m")
    assert loaded.fingerprint() == model.fingerprint()
    for key, member in pyg.items():
        s, _, t = key.split("__")
        with torch.no_grad():
            expected = member(z[s][:6], z[t][:6])
        for m in (model, loaded):
            assert rel_err(relation_decoder(m, tuple(key.split("__")))(z[s][:6], z[t][:6]), expected) < 1e-5
    # keyed by relation name / edge type: stored by key; the weights are part of the fingerprint
    by_name = HeteroModel.from_pyg(
        module, d.metadata(), decoder={"writes": ConcatMLP(3, 1), WRITTEN_BY: ConcatMLP(3, 5)}
    )
    assert by_name.decoder.relations == ("author__writes__paper", "paper__written_by__author")
    assert by_name.fingerprint() != model.fingerprint()
    only = HeteroModel.from_pyg(module, d.metadata(), decoder={"writes": Dot()})
    with pytest.raises(ValueError, match="no member for relation paper__written_by__author"):
        relation_decoder(only, WRITTEN_BY)
    with pytest.raises(UnsupportedModelError, match="member 'cites': the graph has no relation 'cites'"):
        HeteroModel.from_pyg(module, d.metadata(), decoder={"cites": Dot()})
    with pytest.raises(UnsupportedModelError, match="width 4 but node type 'author'"):
        HeteroModel.from_pyg(module, d.metadata(), decoder={"writes": ConcatMLP(4, 1)})
    with pytest.raises(UnsupportedModelError, match="members name edge type author__writes__paper twice"):
        HeteroModel.from_pyg(module, d.metadata(), decoder={"writes": Dot(), WRITES: Dot()})
    from torch_geometric.nn import GraphSAGE

    from sparkgnn.models.model import Model

    with pytest.raises(UnsupportedModelError, match="per_relation decoder .* is for typed models"):
        Model.from_pyg(GraphSAGE(3, 4, num_layers=1), output="embedding", decoder={"writes": Dot()})


@pytest.fixture(scope="module")
def typed_case(tmp_path_factory):
    """(root, graph dir, PyG embeddings {type: [N, 3]}, {name: (PyG decoder, model dir)}) on the
    authors-and-papers graph (two relations, non-dense paper ids), a one-round SAGE encoder."""
    root = tmp_path_factory.mktemp("typed_linkpred")
    d = authors_and_papers()
    write_typed_graph_dir(typed_graph(d), str(root / "graph"))
    module, _ = to_hetero_sage(d, layers=1)  # one round: two relation jobs per typed inference
    with torch.no_grad():
        z = module(d.x_dict, d.edge_index_dict)
    models = {}
    for name, decoder in (("distmult", TypedDistMult(2, 3)), ("dot", Dot()), ("per_relation", _per_relation())):
        path = str(root / f"model_{name}")
        HeteroModel.from_pyg(module, d.metadata(), decoder=decoder).save(path)
        models[name] = (decoder, path)
    return root, str(root / "graph"), z, models


def _rows(node_type, ids):
    index = {int(v): i for i, v in enumerate(IDS[node_type])}
    return [index[int(v)] for v in ids]


def test_score_edges_typed_equals_pyg_and_refuses_bad_pairs(spark, typed_case, capsys):
    root, graph, z, models = typed_case
    decoder, model = models["distmult"]
    rng = np.random.default_rng(2)
    writes = pd.DataFrame({"src": rng.choice(IDS["author"], 12), "dst": rng.choice(IDS["paper"], 12)})
    back = pd.DataFrame({"src": rng.choice(IDS["paper"], 8), "dst": rng.choice(IDS["author"], 8)})
    writes["relation"] = ["writes"] * 6 + ["author__writes__paper"] * 6  # a name and a key
    back["relation"] = "paper__written_by__author"
    pairs = pd.concat([writes, back], ignore_index=True)
    pairs.to_parquet(root / "pairs.parquet")
    out = str(root / "scores")
    argv = ["--graph", graph, "--model", model, "--pairs", str(root / "pairs.parquet"), "--out", out]
    assert score_edges.main(argv) == 0
    got = pd.read_parquet(out)
    assert list(got.columns) == ["src", "dst", "relation", "score"] and len(got) == 20
    for relation, (s, _, t), row in (("writes", WRITES, 0), ("paper__written_by__author", WRITTEN_BY, 1)):
        part = got[got.relation.str.contains(relation)].sort_values(["src", "dst", "relation"])
        with torch.no_grad():
            expected = decoder(
                z[s][_rows(s, part.src)], z[t][_rows(t, part.dst)], torch.full((len(part),), row, dtype=torch.long)
            )
        assert rel_err(torch.tensor(part.score.to_numpy()), expected) < 1e-5

    for bad, message in (
        (pd.DataFrame({"src": [0], "dst": [3], "relation": ["cites"]}), "the graph has no relation 'cites'"),
        (pd.DataFrame({"src": [99], "dst": [3], "relation": ["writes"]}), "1 src id(s) of relation author__writes"),
        (pd.DataFrame({"src": [0], "dst": [4], "relation": ["writes"]}), "are not vertices of type 'paper'"),
    ):
        bad.to_parquet(root / "bad.parquet")
        fresh = str(root / "never")
        argv = ["--graph", graph, "--model", model, "--pairs", str(root / "bad.parquet"), "--out", fresh]
        assert score_edges.main(argv) == 2
        assert message in capsys.readouterr().err
        assert not os.path.exists(fresh)


def test_score_edges_typed_per_relation_decoders_equal_each_pyg_module(spark, typed_case):
    root, graph, z, models = typed_case
    pyg, model = models["per_relation"]
    rng = np.random.default_rng(5)
    writes = pd.DataFrame(
        {"src": rng.choice(IDS["author"], 7), "dst": rng.choice(IDS["paper"], 7), "relation": "writes"}
    )
    back = pd.DataFrame({"src": rng.choice(IDS["paper"], 5), "dst": rng.choice(IDS["author"], 5)})
    back["relation"] = "paper__written_by__author"
    pd.concat([writes, back], ignore_index=True).to_parquet(root / "pairs_per_relation.parquet")
    out = str(root / "scores_per_relation")
    argv = ["--graph", graph, "--model", model, "--pairs", str(root / "pairs_per_relation.parquet"), "--out", out]
    assert score_edges.main(argv) == 0
    got = pd.read_parquet(out)
    assert len(got) == 12
    for relation, edge_type in (("writes", WRITES), ("paper__written_by__author", WRITTEN_BY)):
        s, _, t = edge_type
        part = got[got.relation == relation]
        with torch.no_grad():
            expected = pyg["__".join(edge_type)](z[s][_rows(s, part.src)], z[t][_rows(t, part.dst)])
        assert len(part) and rel_err(torch.tensor(part.score.to_numpy()), expected) < 1e-5


def _brute_topk(z_src, z_dst, src_ids, dst_ids, k, known):
    """{src: [(dst, score)...]}: every candidate by dot product, a higher score first, the smaller id among equals."""
    scores = (z_src @ z_dst.T).numpy()
    out = {}
    for i, s in enumerate(src_ids):
        ranked = sorted(
            ((float(scores[i, j]), int(t)) for j, t in enumerate(dst_ids) if (int(s), int(t)) not in known),
            key=lambda p: (-p[0], p[1]),
        )
        out[int(s)] = [(t, sc) for sc, t in ranked[:k]]
    return out


def test_topk_and_eval_per_relation_on_a_typed_graph(spark, typed_case, capsys):
    root, graph, z, models = typed_case
    _, model = models["dot"]
    d = authors_and_papers()
    ei = d[WRITES].edge_index.numpy()
    known = {(int(IDS["author"][a]), int(IDS["paper"][p])) for a, p in zip(*ei, strict=True)}
    out = str(root / "topk")
    argv = ["--graph", graph, "--model", model, "--k", "3", "--relation", "writes", "--candidates", "paper"]
    assert topk.main([*argv, "--exclude-edges", "--out", out]) == 0
    got = pd.read_parquet(out).sort_values(["src", "rank"])
    assert list(got.columns) == ["src", "relation", "dst", "score", "rank"]
    assert set(got.relation) == {"author__writes__paper"}
    expected = _brute_topk(z["author"], z["paper"], IDS["author"], IDS["paper"], 3, known)
    assert sorted(got.src.unique()) == sorted(expected)
    for src, group in got.groupby("src"):
        assert list(group.dst) == [t for t, _ in expected[src]]
        assert np.allclose(group.score, [s for _, s in expected[src]], rtol=1e-5, atol=1e-6)

    fresh = str(root / "never")
    for options, message in (
        (["--relation", "writes", "--candidates", "venue"], "--candidates venue is neither a node type"),
        (["--relation", "writes", "--candidates", "author"], "author__writes__paper rank candidates of another type"),
        (["--relation", "cites"], "the graph has no relation 'cites'"),
    ):
        assert topk.main(["--graph", graph, "--model", model, "--k", "3", *options, "--out", fresh]) == 2
        assert message in capsys.readouterr().err
        assert not os.path.exists(fresh)

    held = pd.DataFrame({"src": [0, 1, 4, 3], "dst": [3, 8, 28, 18], "relation": ["writes"] * 4})
    held.to_parquet(root / "held.parquet")
    metrics_out = str(root / "eval")
    argv = ["--graph", graph, "--model", model, "--eval", str(root / "held.parquet"), "--out", metrics_out]
    assert topk.main(argv) == 0
    row = pd.read_parquet(metrics_out).iloc[0]
    assert list(pd.read_parquet(metrics_out).columns[:3]) == ["relation", "negatives", "positives"]
    assert row.relation == "author__writes__paper" and row.positives == 4
    scores = (z["author"] @ z["paper"].T).numpy()
    ranks = []
    for s, t in zip(held.src, held.dst, strict=True):
        i, j = _rows("author", [s])[0], _rows("paper", [t])[0]
        negs = np.delete(scores[i], j)
        ranks.append(1 + 0.5 * ((negs > scores[i, j]).sum() + (negs >= scores[i, j]).sum()))
    ranks = np.asarray(ranks)
    assert row.mrr == pytest.approx(np.mean(1 / ranks), rel=1e-6)
    assert row["hits@1"] == pytest.approx(np.mean(ranks <= 1))


def test_relation_topk_within_one_type_keeps_ties_and_exclusions(spark):
    """A relation from a type into itself: both sides are the type's rows (mapped apart), equal
    scores rank the smaller id first and known edges are left out."""
    from sparkgnn.decoders import DotDecoder
    from sparkgnn.linkpred.typed import relation_topk_frame

    rng = np.random.default_rng(4)
    paper_ids = IDS["paper"]
    h = rng.standard_normal((len(paper_ids), 4)).astype(np.float32)
    h[5] = h[2]  # papers 13 and 28 tie for every source
    frame = spark.createDataFrame([(int(i), [float(v) for v in row]) for i, row in zip(paper_ids, h, strict=True)],
                                  "id long, h array<float>")  # fmt: skip
    edges = spark.createDataFrame([(3, 8), (3, 13), (18, 28)], "src long, dst long")
    cites = ("paper", "cites", "paper")
    got = relation_topk_frame({"paper": frame}, cites, DotDecoder(), 3, exclude=edges, partitions=3).toPandas()
    assert set(got.relation) == {"paper__cites__paper"}
    expected = _brute_topk(
        torch.from_numpy(h), torch.from_numpy(h), paper_ids, paper_ids, 3, {(3, 8), (3, 13), (18, 28)}
    )
    for src, group in got.sort_values(["src", "rank"]).groupby("src"):
        assert list(group.dst) == [t for t, _ in expected[src]]
        assert np.allclose(group.score, [s for _, s in expected[src]], rtol=1e-5, atol=1e-6)
    assert sorted(got.src.unique()) == sorted(int(i) for i in paper_ids)
