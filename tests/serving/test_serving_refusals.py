"""Every bad input and misuse of the serving API gets a clear refusal, and nothing is lost:
a QueryEngine refuses a PE store computed for another model or graph (StalePEStore naming both
short fingerprints and what differs); Request() refuses ragged features, ids beyond int64 and
non-integer ids naming the field and the first rows; NaN features are a named request problem;
unreadable request files are refused naming the file; unknown ids in a request are named by
QueryEngine.answer (with validation on or off)."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from serving_testkit import pyg_model

from sparkgnn.errors import SparkGNNError, StalePEStore
from sparkgnn.models import Model
from sparkgnn.pe import PEStore
from sparkgnn.pe.local import precompute_local
from sparkgnn.serving import QueryEngine
from sparkgnn.serving.engine import EngineSetupError
from sparkgnn.serving.request import Request, RequestError, read_requests, write_requests
from sparkgnn.serving.workload import remove_vertices


def tree(root) -> dict:
    """{relative path: (size, mtime_ns)} of every file under root: 'nothing was touched'."""
    out = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            st = os.stat(path)
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def stores(skewed_workload, tmp_path_factory):
    """Model A with its store on G, model B (same architecture, other weights), a 3-layer model C,
    and a store for A on another graph G' (G minus one vertex)."""
    G = skewed_workload.graph_G
    model_a = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=1))
    model_b = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=2))
    model_c = Model.from_pyg(pyg_model("sage", G.feature_dim, 3, seed=3))
    root = str(tmp_path_factory.mktemp("refusal_stores"))
    store_a = precompute_local(G, model_a, os.path.join(root, "a"))
    other_graph = remove_vertices(G, np.array([0]))
    store_other = precompute_local(other_graph, model_a, os.path.join(root, "other"))
    return dict(
        G=G,
        a=model_a,
        b=model_b,
        c=model_c,
        store_a=store_a,
        store_other=store_other,
        other_graph=other_graph,
        root=root,
    )


def _short(fp: str) -> str:
    return fp[:12]


def test_engine_refuses_a_store_of_other_weights_naming_both_fingerprints(stores, skewed_workload):
    before = tree(stores["root"])
    for mode in ("he", "exact", "full"):  # full ignores the store, but must not accept it either
        with pytest.raises(StalePEStore) as err:
            QueryEngine(stores["G"], stores["b"], mode=mode, store=stores["store_a"])
        text = str(err.value)
        assert "model weights differ" in text, text
        assert _short(stores["a"].fingerprint()) in text and _short(stores["b"].fingerprint()) in text
    with pytest.raises(StalePEStore, match="layer count differs: store has 2 layers, model 3"):
        QueryEngine(stores["G"], stores["c"], mode="he", store=stores["store_a"])
    # the store of A still serves A, with FULL's answers
    full = QueryEngine(stores["G"], stores["a"], mode="full")
    exact = QueryEngine(stores["G"], stores["a"], mode="exact", store=stores["store_a"], context=full.context)
    r = skewed_workload.requests[0]
    np.testing.assert_allclose(exact.answer(r).h, full.answer(r).h, rtol=1e-5, atol=1e-5)
    assert tree(stores["root"]) == before  # refusals touched nothing


def test_engine_refuses_a_store_of_another_graph(stores):
    G, other = stores["G"], stores["other_graph"]
    with pytest.raises(StalePEStore) as err:
        QueryEngine(G, stores["a"], mode="he", store=stores["store_other"])
    text = str(err.value)
    assert "graph fingerprint differs" in text
    assert _short(G.fingerprint) in text and _short(other.fingerprint) in text
    # opened for the engine's own graph, PEStore.open already refuses it
    with pytest.raises(StalePEStore, match="graph"):
        PEStore.open(stores["store_other"].base, model=stores["a"], graph=G)


def test_engine_refuses_a_store_without_manifest_and_a_graph_its_context_does_not_serve(stores):
    class NotAStore:
        base = "/nowhere"

    with pytest.raises(StalePEStore, match="no manifest.*PEStore.open"):
        QueryEngine(stores["G"], stores["a"], mode="he", store=NotAStore())
    full = QueryEngine(stores["G"], stores["a"], mode="full")
    with pytest.raises(EngineSetupError, match="shared context serves graph"):
        QueryEngine(stores["other_graph"], stores["a"], mode="full", context=full.context)


# -- Request() ---------------------------------------------------------------------------------


def _req(**kw):
    base = dict(request_id="r", qid=[100, 101, 102], x=np.ones((3, 2)), src=[100], dst=[101])
    base.update(kw)
    return Request(**base)


@pytest.mark.parametrize(
    "kw, words",
    [
        (
            dict(x=[[1.0, 2.0], [1.0], [1.0, 2.0, 3.0]]),
            [
                "x has rows of different widths",
                "row 0 has 2 values",
                "2 rows differ",
                "row 1 has 1 value,",
                "row 2 has 3 values",
            ],
        ),
        (dict(x=[[1.0, 2.0], 5.0, [1.0, 2.0]]), ["x has rows of different widths", "row 1 has a single number"]),
        (dict(x=[["a", "b"], [1, 2], [1, 2]]), ["x must be a [B, F] matrix of numbers", "'a'"]),
        (
            dict(qid=[100, 2**63, 102]),
            ["qid: 1 value(s) are not integer ids in the int64 range", "row 1: 9223372036854775808"],
        ),
        (dict(qid=np.array([100, 2**63, 2**64 - 1], np.uint64)), ["qid: 2 value(s)", "row 1: 9223372036854775808"]),
        (dict(qid=[-1, 2**63, 3]), ["qid: 1 value(s)", "row 1: 9223372036854775808"]),
        (dict(src=[2**70], dst=[101]), ["src: 1 value(s)", "row 0: 1180591620717411303424"]),
        (dict(dst=[1.5]), ["dst: 1 value(s) are not integer ids", "row 0: 1.5"]),
        (dict(qid=["a", "b", "c"]), ["qid must hold int64 ids", "first: a, b, c"]),
        (dict(src=[[1, 2], [3]], dst=[101, 101]), ["src must be a flat list of int64 ids"]),
    ],
)
def test_request_refuses_malformed_fields_naming_field_and_rows(kw, words):
    with pytest.raises(RequestError) as err:
        _req(**kw)
    assert isinstance(err.value, SparkGNNError) and isinstance(err.value, ValueError)
    text = str(err.value)
    assert text.startswith("request 'r': ")
    for w in words:
        assert w in text, (w, text)


def test_integral_floats_and_empty_edges_are_accepted():
    r = _req(qid=np.array([100.0, 101.0, 102.0]), src=[], dst=np.empty(0))
    assert r.qid.dtype == np.int64 and r.qid.tolist() == [100, 101, 102] and r.num_edges == 0


def test_nan_features_are_a_problem_naming_field_queries_and_rows(small_graph_for_requests):
    x = np.ones((3, 2))
    x[1, 0] = np.nan
    x[2, 1] = np.inf
    r = _req(x=x, src=[100, 10], dst=[20, 101])
    (problem,) = r.problems(small_graph_for_requests)
    assert problem.startswith("x: 2 query nodes have NaN/Inf features") and "101, 102" in problem
    assert "(rows 1, 2)" in problem


@pytest.fixture(scope="module")
def small_graph_for_requests():
    from sparkgnn.graph import GraphData

    return GraphData(np.array([10, 20, 30]), np.zeros((3, 2), np.float32), [0, 1], [1, 2])


# -- request files -----------------------------------------------------------------------------


def _valid_file(path):
    return write_requests(str(path), [_req()])


def test_unreadable_request_files_are_refused_naming_the_file(tmp_path):
    good = _valid_file(tmp_path / "good.parquet")
    data = open(good, "rb").read()
    cases = {
        "empty.parquet": (b"", "empty file (0 bytes)"),
        "truncated.parquet": (data[: len(data) // 2], "not a readable Parquet file, truncated"),
        "text.parquet": (b"hello, not parquet", "not a readable Parquet file"),
    }
    for name, (content, words) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(RequestError) as err:
            read_requests(str(tmp_path / name))
        assert str(err.value).startswith(str(tmp_path / name) + ": ") and words in str(err.value)
        assert (tmp_path / name).read_bytes() == content  # left as it was
    pq.write_table(
        pa.table(
            {
                "request_id": ["r"],
                "kind": ["node"],
                "node": ["x"],
                "x": [[1.0]],
                "src": pa.array([None], pa.int64()),
                "dst": pa.array([None], pa.int64()),
            }
        ),
        tmp_path / "types.parquet",
    )
    with pytest.raises(RequestError, match=r"types\.parquet: column types .* do not fit"):
        read_requests(str(tmp_path / "types.parquet"))
    # a folder: the first unreadable file is named
    folder = tmp_path / "folder"
    folder.mkdir()
    _valid_file(folder / "a.parquet")
    (folder / "b.parquet").write_bytes(b"")
    with pytest.raises(RequestError, match=r"folder/b\.parquet: empty file"):
        read_requests(str(folder))
    with pytest.raises(FileNotFoundError, match="no such request file") as err:
        read_requests(str(tmp_path / "missing.parquet"))
    assert err.value.filename == str(tmp_path / "missing.parquet")


def test_malformed_rows_in_a_file_name_the_file(tmp_path):
    from sparkgnn.serving.request import SCHEMA

    pq.write_table(
        pa.table(
            {
                "request_id": ["r", "r"],
                "kind": ["node", "node"],
                "node": [1, 2],
                "x": pa.array([[1.0, 2.0], [1.0]], pa.list_(pa.float32())),
                "src": pa.array([None, None], pa.int64()),
                "dst": pa.array([None, None], pa.int64()),
            },
            schema=SCHEMA,
        ),
        tmp_path / "ragged.parquet",
    )
    with pytest.raises(RequestError, match=r"ragged\.parquet: request 'r': feature vectors of different lengths"):
        read_requests(str(tmp_path / "ragged.parquet"))


# -- unknown ids through the Python API --------------------------------------------------------


def test_answer_names_unknown_ids_with_and_without_validation(stores, skewed_workload):
    G = stores["G"]
    r0 = skewed_workload.requests[0]
    unknown = [10**12 + i for i in range(7)]
    bad = Request(
        "bad", r0.qid, r0.x, np.concatenate([r0.src, unknown]), np.concatenate([r0.dst, np.full(7, r0.qid[0])])
    )
    engine = QueryEngine(G, stores["a"], mode="full")
    with pytest.raises(RequestError) as err:
        engine.answer(bad)
    text = str(err.value)
    assert "7 edges name an id that is neither a query nor a vertex of the graph" in text
    assert "7 unknown ids; first: 1000000000000, 1000000000001" in text and ", ..." in text
    trusting = QueryEngine(G, stores["a"], mode="exact", store=stores["store_a"], validate=False)
    with pytest.raises(
        RequestError,
        match=r"'bad': 7 edge endpoint ids are neither a query nor a vertex "
        r"of the graph; first: 1000000000000, .*\.\.\.",
    ):
        trusting.answer(bad)


class _WeightsThenAttributes(torch.nn.Module):
    """GCN reading edge weights, then GINE reading edge attributes."""

    def __init__(self):
        import torch_geometric.nn as gnn

        super().__init__()
        self.conv1 = gnn.GCNConv(2, 4)
        self.conv2 = gnn.GINEConv(torch.nn.Linear(4, 3), edge_dim=3)

    def forward(self, x, edge_index, edge_attr, edge_weight):
        x = self.conv1(x, edge_index, edge_weight).relu()
        return self.conv2(x, edge_index, edge_attr)


def test_models_that_read_edge_features_need_them_in_g_and_one_value_per_edge(small_graph_for_requests, tmp_path):
    import dataclasses

    import torch_geometric.nn as gnn

    from sparkgnn.errors import UnsupportedModelError
    from sparkgnn.pe.refresh import refresh_local

    model = Model.from_pyg(gnn.GATConv(2, 4, edge_dim=3).eval())
    none = r"read edge features \(edge_attr, width 3\) but graph .* has none"
    with pytest.raises(ValueError, match=none):
        QueryEngine(small_graph_for_requests, model)
    with pytest.raises(ValueError, match=none):
        precompute_local(small_graph_for_requests, model, str(tmp_path / "store"))
    with pytest.raises(ValueError, match=none):
        refresh_local(small_graph_for_requests, None, model, str(tmp_path / "store"))
    assert not (tmp_path / "store").exists()
    # a layer reading G's weights next to one reading attributes: one value per edge is carried
    torch.manual_seed(0)
    net = _WeightsThenAttributes().eval()
    mixed = Model.from_pyg(net)
    g = dataclasses.replace(small_graph_for_requests, edge_attr=np.ones((2, 3), np.float32))
    with pytest.raises(UnsupportedModelError, match="serving carries one value per edge: .* its gcn layers G's edge"):
        QueryEngine(dataclasses.replace(g, weight=np.ones(2, np.float32)), mixed)
    # without weights the GCN reads none and the GINE the attributes, as PyG's forward does
    attr = np.array([[1.0, 2.0, 3.0], [0.5, 0.0, -1.0]], np.float32)
    engine = QueryEngine(g, mixed)
    answer = engine.answer(Request("r", [100], [[1.0, 2.0]], [10, 100], [100, 20], attr))
    with pytest.raises(EngineSetupError, match="the shared context carries edge attributes of width 3, this engine"):
        QueryEngine(g, Model.from_pyg(pyg_model("gcn", 2, 2)), context=engine.context)
    with torch.no_grad():
        want = net(
            torch.from_numpy(np.concatenate([g.x, [[1.0, 2.0]]]).astype(np.float32)),
            torch.tensor([[0, 1, 0, 3], [1, 2, 3, 1]]),
            torch.from_numpy(np.concatenate([g.edge_attr, attr])),
            None,
        )[3:]
    np.testing.assert_allclose(answer.h, want.numpy(), rtol=1e-5, atol=1e-6)
