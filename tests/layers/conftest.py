"""Fixtures: the synthetic corner-case graph and Cora (from sparkgnn.datasets.load_cora)."""
import importlib.util
import sys
from pathlib import Path

import pytest


def _load_graphs():
    name = "_sparkgnn_test_graphs"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("_graphs.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


graphs = _load_graphs()


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
