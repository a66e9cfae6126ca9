"""Fixtures of the streaming tests: one Cora serving set-up on disk per session (G, models, PE
store, requests), one torch thread per test (the job under test is run with --torch-threads 1,
so answers compare bit for bit)."""

import pytest
from streaming_helpers import build_setup
from torch_fixtures import _one_torch_thread  # noqa: F401  (autouse: one torch thread per test)


@pytest.fixture(scope="session")
def setup(tmp_path_factory):
    return build_setup(str(tmp_path_factory.mktemp("stream_setup")))


@pytest.fixture(scope="session")
def engine(setup):
    from sparkgnn.models import Model
    from sparkgnn.pe import PEStore
    from sparkgnn.serving import QueryEngine

    model = Model.load(setup.model_path)
    store = PEStore.open(setup.store, model=model, graph=setup.graph)
    return QueryEngine(setup.graph, model, mode="exact", store=store)
