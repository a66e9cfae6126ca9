"""A deployment is checked as a whole when it starts and when it swaps: every mode it serves must
be answerable by its store (a store for HE; states for SRPE, EXACT and auto; a "fap" metrics
table for the fap hot cache). A service whose store cannot serve a served mode does not start
(the reason names the mode); a swap to such a store is refused and the old version keeps
serving; `mode="auto"` is served, and requests naming no mode get it."""

from __future__ import annotations

import numpy as np
import pytest
from serving_testkit import pyg_model

from sparkgnn.graph import write_graph_dir
from sparkgnn.models import Model
from sparkgnn.pe.local import precompute_local
from sparkgnn.pe.store import PEStore
from sparkgnn.serving import QueryEngine
from sparkgnn.serving.online.client import Client
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.deployments import deployment_problems
from sparkgnn.serving.online.pools import ServeError
from sparkgnn.serving.online.server import Server, SwapRefused


@pytest.fixture(scope="module")
def stores(skewed_workload, tmp_path_factory):
    """Paths of the skewed graph, a 2-layer SAGE and two stores of it: with and without states."""
    d = tmp_path_factory.mktemp("deployments")
    G = skewed_workload.graph_G
    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=3))
    model.save(str(d / "model.pt"))
    write_graph_dir(G, str(d / "g"))
    with_states = precompute_local(G, model, str(d / "states"))
    precompute_local(G, model, str(d / "plain"), states=False)
    return {
        "graph": str(d / "g"),
        "model": str(d / "model.pt"),
        "states": str(d / "states"),
        "plain": str(d / "plain"),
        "G": G,
        "loaded": model,
        "store": with_states,
        "requests": skewed_workload.requests,
    }


def opened(stores, which: str) -> PEStore:
    return PEStore.open(stores[which], model=stores["loaded"], graph=stores["graph"], verify="sizes")


def test_problems_name_each_mode_the_store_cannot_serve(stores):
    plain = opened(stores, "plain")
    problems = deployment_problems(["full", "ns", "he", "srpe", "exact", "auto"], {}, {}, plain)
    for mode in ("srpe", "exact", "auto"):
        assert f"mode {mode!r} recomputes from stored aggregation states" in problems
    assert "'he'" not in problems and "'full'" not in problems
    assert deployment_problems(["full", "ns", "he"], {}, {}, plain) is None
    assert deployment_problems(["full", "ns"], {}, {}, None) is None
    assert "no PE store is given" in deployment_problems(["he"], {}, {}, None)
    # auto's candidates decide what it needs, but it never chooses without a store
    assert deployment_problems(["auto"], {"auto": {"candidates": ["full"]}}, {}, plain) is None
    assert deployment_problems(["full", "auto", "exact", "srpe"], {}, {}, opened(stores, "states")) is None


def test_the_fap_hot_cache_needs_the_fap_metrics_table(stores):
    states = opened(stores, "states")
    problems = deployment_problems(["he"], {}, {"policy": "fap", "bytes": 1 << 20}, states)
    assert "'fap' metrics table" in problems and "precompute the store with workload metrics" in problems
    assert deployment_problems(["he"], {}, {"policy": "fap", "bytes": 0}, states) is None  # no cache at all
    assert deployment_problems(["he"], {}, {"policy": "degree", "bytes": 1 << 20}, states) is None


def test_a_store_without_states_does_not_start_a_service_serving_exact(stores):
    config = ServeConfig(
        graph=stores["graph"], model=stores["model"], store=stores["plain"], modes=["he", "srpe", "exact"], http=None
    )
    with pytest.raises(ServeError) as info:
        Server(config, start_pools=False)
    message = str(info.value)
    assert "mode 'exact'" in message and "mode 'srpe'" in message and "\n" not in message
    # the same store serves the modes that read no states
    modes = ["full", "ns", "he"]
    Server(ServeConfig(**{**config.__dict__, "modes": modes}), start_pools=False)


def test_auto_mode_is_served_and_requests_naming_no_mode_get_it(stores):
    config = ServeConfig(graph=stores["graph"], model=stores["model"], store=stores["states"], mode="auto", http=None)
    G, model = stores["G"], stores["loaded"]
    full = QueryEngine(G, model, mode="full")
    with Server(config) as server:
        assert "auto" in server.config.modes
        with Client(server.zmq_endpoint) as client:
            for r in stores["requests"][:2]:
                got = client.answer(r)  # no mode: the deployment's, auto
                want = full.answer(r).h  # auto answers exactly (EXACT or FULL)
                np.testing.assert_allclose(got.h, want, rtol=1e-4, atol=1e-5)


def test_sparkgnn_serve_mode_auto_queues_requests_naming_no_mode(stores):
    """`sparkgnn-serve serve --mode auto` (the flags, as the command line reads them): auto is
    served, so a request naming no mode is queued, not refused."""
    from sparkgnn.serving.online.cli import build_parser, config_from

    flags = ["serve", "--graph", stores["graph"], "--model", stores["model"], "--store", stores["states"]]
    config = config_from(build_parser().parse_args([*flags, "--mode", "auto", "--http", "127.0.0.1:0"]))
    server = Server(config, start_pools=False)  # nothing drains the queue
    try:
        assert "auto" in server.config.modes
        queued = server.submit(stores["requests"][0])
        assert not queued.done() and len(server.scheduler) == 1
    finally:
        server.stop()
    assert queued.result(timeout=5).kind == "stopping"


def test_a_swap_that_would_break_a_served_mode_is_refused_and_the_old_version_serves(stores):
    config = ServeConfig(graph=stores["graph"], model=stores["model"], store=stores["states"], mode="exact", http=None)
    request = stores["requests"][0]
    want = QueryEngine(stores["G"], stores["loaded"], mode="exact", store=stores["store"]).answer(request).h
    with Server(config) as server:
        with pytest.raises(SwapRefused) as info:
            server.swap(stores["graph"], stores["plain"])
        message = str(info.value)
        assert "mode 'exact' recomputes from stored aggregation states" in message
        assert "still serving version 1" in message
        assert server.stats["swaps_refused"] == 1 and server.version_info()["store"] == stores["states"]
        with Client(server.zmq_endpoint) as client:
            np.testing.assert_allclose(client.answer(request, "exact").h, want, rtol=1e-4, atol=1e-5)
        with pytest.raises(ServeError, match="timeout_s"):
            server.swap(stores["graph"], stores["states"], timeout_s=float("inf"))
