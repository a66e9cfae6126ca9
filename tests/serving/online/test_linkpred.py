"""serving/online/linkpred.py through the HTTP front: /v1/score and /v1/topk of a DistMult decoder
equal the PyG decoder on PyG's embeddings (vertices) and on the HE answer (query nodes); the top-k
equals a numpy brute force; bodies over the caps are 413, bad relations and unknown ids are 400."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch
from serving_testkit import pyg_model

from sparkgnn.graph import write_graph_dir
from sparkgnn.models import Model
from sparkgnn.pe.local import precompute_local
from sparkgnn.serving import QueryEngine
from sparkgnn.serving.online import linkpred
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.server import Server

RELATIONS = ["likes", "follows"]


class DistMult(torch.nn.Module):  # PyG's examples/rgcn_link_pred.py DistMultDecoder
    def __init__(self, width: int):
        super().__init__()
        self.rel_emb = torch.nn.Parameter(
            torch.randn(len(RELATIONS), width, generator=torch.Generator().manual_seed(2))
        )

    def forward(self, z, edge_index, edge_type):
        z_src, z_dst = z[edge_index[0]], z[edge_index[1]]
        return torch.sum(z_src * self.rel_emb[edge_type] * z_dst, dim=1)


@pytest.fixture(scope="module")
def served(skewed_workload, tmp_path_factory):
    d = tmp_path_factory.mktemp("linkpred_serve")
    G = skewed_workload.graph_G
    encoder = pyg_model("sage", G.feature_dim, 2, seed=3).eval()
    decoder = DistMult(5)
    model = Model.from_pyg(encoder, output="embedding", decoder=decoder, relations=RELATIONS)
    model.save(str(d / "model.pt"))
    write_graph_dir(G, str(d / "g"))
    store = precompute_local(G, model, str(d / "store"))
    with torch.no_grad():
        z = encoder(torch.as_tensor(G.x, dtype=torch.float32), G.edge_index_torch()).numpy()
    request = next(r for r in skewed_workload.requests if r.num_edges)
    query_h = QueryEngine(G, model, mode="he", store=store).answer(request).h
    config = ServeConfig(graph=str(d / "g"), model=str(d / "model.pt"), store=str(d / "store"), max_edges=10_000)
    with Server(config) as server:
        yield server, G, z, decoder, request, np.asarray(query_h, np.float32)


def post(url: str, path: str, body: dict):
    req = urllib.request.Request(
        url + path, json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _query_body(request) -> dict:
    return {
        "mode": "he",
        "nodes": [{"id": int(q), "x": row.tolist()} for q, row in zip(request.qid, request.x, strict=True)],
        "edges": [[int(s), int(t)] for s, t in zip(request.src, request.dst, strict=True)],
    }


def test_score_equals_pyg_for_vertices_and_query_nodes(served):
    server, G, z, decoder, request, query_h = served
    rng = np.random.default_rng(0)
    vertices = rng.choice(G.ids, 12)
    query = int(request.qid[0])
    pairs = [[int(a), int(b)] for a, b in zip(vertices[:6], vertices[6:], strict=True)] + [[query, int(vertices[0])]]
    relations = ["likes", "follows", 1, 0, "likes", "follows", "follows"]
    status, reply = post(server.http_url, "/v1/score", {"pairs": pairs, "relations": relations, **_query_body(request)})
    assert status == 200, reply
    rows = {int(v): z[i] for i, v in enumerate(G.ids)} | {query: query_h[0]}
    rel = torch.tensor([RELATIONS.index(r) if isinstance(r, str) else r for r in relations])
    h = torch.tensor(np.stack([rows[p[0]] for p in pairs] + [rows[p[1]] for p in pairs]))
    with torch.no_grad():
        expected = decoder(h, torch.arange(2 * len(pairs)).view(2, -1), rel).numpy()
    got = np.asarray([s["score"] for s in reply["scores"]], np.float32)
    assert [[s["src"], s["dst"]] for s in reply["scores"]] == pairs
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_topk_equals_brute_force(served):
    server, G, z, decoder, _request, _query_h = served
    sources = [int(v) for v in G.ids[:3]]
    status, reply = post(server.http_url, "/v1/topk", {"sources": sources, "k": 4, "relation": "follows"})
    assert status == 200, reply
    rel = decoder.rel_emb.detach().numpy()[1]
    index = {int(v): i for i, v in enumerate(G.ids)}
    for entry, s in zip(reply["topk"], sources, strict=True):
        scores = (z * rel) @ z[index[s]]
        ranked = sorted((-float(scores[i]), int(c)) for i, c in enumerate(G.ids))[:4]
        assert entry["src"] == s
        assert [c["dst"] for c in entry["candidates"]] == [c for _, c in ranked]
        np.testing.assert_allclose([c["score"] for c in entry["candidates"]], [-v for v, _ in ranked], rtol=1e-5)


def test_bad_bodies_are_refused_in_one_line(served, monkeypatch):
    server, G, *_ = served
    url, v = server.http_url, int(G.ids[0])
    monkeypatch.setattr(linkpred, "MAX_PAIRS", 2)
    cases = [
        ("/v1/score", {"pairs": [[v, v]] * 3, "relations": [0] * 3}, 413, "over the cap of 2"),
        ("/v1/score", {"pairs": [[v, v]], "relations": ["hates"]}, 400, "unknown relation 'hates'"),
        ("/v1/score", {"pairs": [[v, v]]}, 400, "give relations, one per pair"),
        ("/v1/score", {"pairs": [[v, int(G.ids.max()) + 9]], "relations": [0]}, 400, "neither query nodes nor"),
        ("/v1/score", {"pair": [[v, v]]}, 400, "unknown key 'pair'"),
        ("/v1/topk", {"sources": [v], "k": 0, "relation": 0}, 400, "k must be an integer >= 1"),
        ("/v1/topk", {"sources": [v], "k": linkpred.MAX_K + 1, "relation": 0}, 413, "over the cap"),
    ]
    for path, body, status, words in cases:
        got, reply = post(url, path, body)
        assert got == status and words in reply["error"] and "\n" not in reply["error"], (path, body, reply)
