"""Fixtures: the synthetic corner-case graph and Cora (from sparkgnn.datasets.load_cora)."""
import importlib.util
import sys
from pathlib import Path

import pytest


def _load_graphs():
    name = "_sparkgnn_test_graphs"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "layers" / "_graphs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


graphs = _load_graphs()


@pytest.fixture(scope="session")
def synthetic():
    return graphs.synthetic_graph()


@pytest.fixture(scope="session")
def cora():
    try:
        return graphs.cora_graph()
    except ImportError as e:  # sparkgnn.datasets lands in parallel; say so instead of erroring
        pytest.skip(f"sparkgnn.datasets.load_cora unavailable: {e}")


@pytest.fixture(scope="session", params=["synthetic", "cora"])
def graph(request):
    return request.getfixturevalue(request.param)
