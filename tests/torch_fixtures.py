"""Fixtures shared by the torch-level tests (layers, models, serving, streaming; imported by their
conftests): the synthetic corner-case graph, Cora, and one torch thread per test."""

import pytest
import torch_test_graphs as graphs


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """These tests run small tensors on a shared 2-core machine; intra-op threads only spin
    against other processes there (measured: 18 s with 1 thread vs 2 min with 2 under load).
    Scoped to this directory and restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def synthetic():
    return graphs.synthetic_graph()


@pytest.fixture(scope="session")
def cora():
    return graphs.cora_graph()


@pytest.fixture(scope="session", params=["synthetic", "cora"])
def graph(request):
    return request.getfixturevalue(request.param)
