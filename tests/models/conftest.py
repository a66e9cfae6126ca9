"""Fixtures: the synthetic corner-case graph and Cora (see tests/torch_fixtures.py)."""

from torch_fixtures import _one_torch_thread, cora, graph, synthetic  # noqa: F401
