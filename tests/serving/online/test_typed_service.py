"""The online service on a typed graph (serving/online/typed_service.py): `open_service` starts a
TypedServer for a typed graph directory, whose HTTP answers in FULL and EXACT equal
TypedQueryEngine's FULL answer and PyG's forward of the to_hetero model on G plus the queries;
bad requests are 400 (413 over the caps) with one line each, the service answering afterwards;
deployments a typed service cannot serve are refused at start in one line."""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch
from serving_testkit import pyg_model

from sparkgnn.graph.typed_io import write_typed_graph_dir
from sparkgnn.models import Model
from sparkgnn.pe.local import precompute_local
from sparkgnn.serving.online.bodies import HOMOGENEOUS_BODY_TO_TYPED, typed_request_json
from sparkgnn.serving.online.client import Client
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.pools import ServeError
from sparkgnn.serving.online.server import open_service
from sparkgnn.serving.online.typed_service import TypedServer
from sparkgnn.serving.typed import TYPED_MODES, TypedQueryEngine, TypedRequest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "pe"))
from typed_testkit import IDS, pyg_data, to_hetero_sage, typed_graph  # noqa: E402

P = IDS["paper"]
WRITES, CITES = ("author", "writes", "paper"), ("paper", "cites", "paper")
TOPIC, TOPIC_OF = ("paper", "has_topic", "field"), ("field", "topic_of", "paper")


def typed_request():
    """(TypedRequest, PyG's union HeteroData, first query row per type): papers 1000 and 1001,
    author 100 and field 9 (a type without features) as queries, edges of four relations, G's
    papers 13 and 18 among their ends (so EXACT recomputes vertices of G)."""
    g = torch.Generator().manual_seed(11)
    x_paper, x_author = torch.randn(2, 6, generator=g), torch.randn(1, 4, generator=g)
    edges = {  # (ids in the request, union rows for PyG: queries after G's rows)
        WRITES: (([100, 2], [1000, 1001]), ([6, 2], [8, 9])),
        CITES: (([1000, P[3]], [P[2], 1001]), ([8, 3], [2, 9])),
        TOPIC: (([1001], [9]), ([9], [4])),
        TOPIC_OF: (([9], [1000]), ([4], [8])),
    }
    request = TypedRequest(
        nodes={"paper": ([1000, 1001], x_paper.numpy()), "author": ([100], x_author.numpy()), "field": ([9], None)},
        edges={et: ids for et, (ids, _) in edges.items()},
        request_id="typed-1",
    )
    union = pyg_data()
    union["paper"].x = torch.cat([union["paper"].x, x_paper])
    union["author"].x = torch.cat([union["author"].x, x_author])
    union["field"].x = torch.ones(5, 1)
    for et, (_, rows) in edges.items():
        union[et].edge_index = torch.cat([union[et].edge_index, torch.tensor(rows)], 1)
    return request, union, {"paper": 8, "author": 6, "field": 4}


@pytest.fixture(scope="module")
def typed_service(tmp_path_factory):
    d = tmp_path_factory.mktemp("typed-serve")
    data = pyg_data()
    graph = typed_graph(data)
    module, model = to_hetero_sage(data, layers=2, aggr="mean")
    write_typed_graph_dir(graph, str(d / "g"))
    model.save(str(d / "model"))
    precompute_local(graph, model, str(d / "store"))
    config = ServeConfig(
        graph=str(d / "g"),
        model=str(d / "model"),
        store=str(d / "store"),
        mode="exact",
        modes=["full", "exact"],
        max_queries=8,
    )
    server = open_service(config)
    assert isinstance(server, TypedServer)
    with server:
        yield server, graph, model, module, d


def post(url: str, body, path: str = "/v1/answer"):
    """(status, JSON reply) of a POST of `body` as JSON."""
    req = urllib.request.Request(
        url + path, json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_typed_answers_over_http_equal_the_engine_and_pyg_in_full_and_exact(typed_service):
    server, graph, model, module, _ = typed_service
    request, union, first = typed_request()
    reference = TypedQueryEngine(graph, model, mode="full").answer(request)
    with torch.no_grad():
        pyg = module(union.x_dict, union.edge_index_dict)
    assert server.zmq_endpoint is None and server.http_url
    with Client(server.http_url) as client:
        for mode in ("full", "exact"):
            reply = client.answer_typed(request, mode)
            assert reply.mode == mode and reply.request_id == "typed-1"
            assert list(reply.h) == list(reference.h) == [t for t in request.nodes if t in model.outputs]
            assert reply.pred is not None and reference.pred is not None
            for t, h in reply.h.items():
                np.testing.assert_array_equal(reply.nodes[t], request.nodes[t][0])
                np.testing.assert_allclose(h, reference.h[t].numpy(), rtol=1e-5, atol=1e-5)
                np.testing.assert_allclose(h, pyg[t][first[t] :].numpy(), rtol=1e-5, atol=1e-5)
                np.testing.assert_array_equal(reply.pred[t], reference.pred[t].numpy())
    # a request naming no mode gets the deployment's (exact)
    status, reply = post(server.http_url, typed_request_json(request))
    assert status == 200 and reply["mode"] == "exact"
    assert [(a["type"], a["node"]) for a in reply["answers"]][:2] == [("paper", 1000), ("paper", 1001)]


def test_bad_typed_requests_are_400_or_413_in_one_line_and_the_service_goes_on(typed_service):
    server, *_ = typed_service
    url = server.http_url
    x6 = [0.5] * 6
    paper = {"type": "paper", "id": 1000, "x": x6}
    served = f"served: full, exact; typed serving modes: {', '.join(TYPED_MODES)}"
    cases = [
        (
            {"nodes": [{"id": 1000, "x": x6}], "edges": [[1000, 3]]},
            "/v1/answer",
            400,
            re.escape(HOMOGENEOUS_BODY_TO_TYPED),
        ),
        ({"nodes": [paper], "mode": "ns"}, "/v1/answer", 400, rf"mode 'ns' is not served here \({re.escape(served)}\)"),
        ({"nodes": [{"type": "venue", "id": 1}]}, "/v1/answer", 400, r"node type 'venue' is unknown \(node types: "),
        (
            {"nodes": [paper], "edges": [{"relation": ["paper", "likes", "paper"], "src": 1000, "dst": 3}]},
            "/v1/answer",
            400,
            r"relation \('paper', 'likes', 'paper'\) is unknown",
        ),
        ({"nodes": [{**paper, "x": [0.5] * 5}]}, "/v1/answer", 400, r"x has shape \(1, 5\), expected \[1, 6\]"),
        ({"nodes": [{**paper, "id": int(P[1])}]}, "/v1/answer", 400, r"query ids \[8\] name vertices of G"),
        ({"nodes": [{**paper, "id": 1000 + i} for i in range(9)]}, "/v1/answer", 413, "9 query nodes; .* at most 8"),
        ({"pairs": [[1, 2]]}, "/v1/score", 400, r"/v1/score is not served on a typed graph yet"),
    ]
    for body, path, status, message in cases:
        got, reply = post(url, body, path)
        assert got == status, (body, reply)
        assert re.search(message, reply["error"]) and "\n" not in reply["error"], reply["error"]
        assert "answers" not in reply
    got, reply = post(url, {"nodes": [paper]})
    assert got == 200 and [a["node"] for a in reply["answers"]] == [1000]


def test_deployments_a_typed_service_cannot_serve_are_refused_at_start(typed_service, tmp_path):
    _, graph, _, _, d = typed_service
    typed = {"graph": str(d / "g"), "model": str(d / "model"), "store": str(d / "store")}
    workers = [{"name": "w", "kind": "workers", "width": 2}]
    for settings, message in (
        ({"mode": "ns", "modes": ["ns"]}, r"modes \['ns'\] are not typed serving modes; a typed graph is served in "),
        ({"mode": "full", "modes": ["full"], "pools": workers}, r"pool 'w' is of kind 'workers'"),
        ({"mode": "exact", "modes": ["exact"], "store": None}, "mode 'exact' reads a typed PE store, but no store"),
    ):
        with pytest.raises(ServeError, match=message) as info:
            open_service(ServeConfig(**{**typed, **settings}))
        assert "\n" not in str(info.value)
    Model.from_pyg(pyg_model("sage", 6, 2)).save(str(tmp_path / "homogeneous"))
    with pytest.raises(ServeError, match="is typed but model .* is not a typed model"):
        open_service(ServeConfig(**{**typed, "model": str(tmp_path / "homogeneous"), "mode": "full"}))
    with pytest.raises(ServeError, match="is a typed model .* but graph .* is homogeneous"):
        open_service(ServeConfig(graph=str(tmp_path), model=str(d / "model"), mode="full"))
