"""Shared fixtures for the serving tests: Cora and a small skewed synthetic graph, workloads on
both, PyG models of each kind converted to sparkgnn Models, one torch thread per test."""

import pytest
from serving_testkit import pyg_model, skewed_graph
from torch_fixtures import _one_torch_thread  # noqa: F401  (autouse: one torch thread per test)

from sparkgnn.datasets import load_cora
from sparkgnn.serving.workload import make_workload


@pytest.fixture(scope="session")
def cora():
    return load_cora()


@pytest.fixture(scope="session")
def skewed():
    return skewed_graph()


@pytest.fixture(scope="session")
def cora_workload(cora):
    return make_workload(cora, (64, 128), 2, seed=5)


@pytest.fixture(scope="session")
def skewed_workload(skewed):
    return make_workload(skewed, (8, 16), 2, seed=1)


@pytest.fixture(scope="session")
def reuse_setup(tmp_path_factory):
    """(G, pyg module, Model, PEStore, FULL engine) per (workload fixture name, kind, layers),
    built once: a single-machine PE store (sparkgnn.pe.local) with states."""
    from sparkgnn.models import Model
    from sparkgnn.pe.local import precompute_local
    from sparkgnn.serving import QueryEngine

    cache = {}

    def get(request, which: str, kind: str, layers: int):
        key = (which, kind, layers)
        if key not in cache:
            wl = request.getfixturevalue(f"{which}_workload")
            G = wl.graph_G
            pyg = pyg_model(kind, G.feature_dim, layers, seed=layers)
            model = Model.from_pyg(pyg)
            store = precompute_local(G, model, str(tmp_path_factory.mktemp("pe")))
            cache[key] = (wl, pyg, model, store, QueryEngine(G, model, mode="full"))
        return cache[key]

    return get
