"""Fixtures: the synthetic corner-case graph and Cora (see tests/torch_fixtures.py). The model
classes of examples/models/ are importable by their script names (gcn_cora, ...), so the tests
convert the examples' own classes instead of copies."""

import os
import sys

from torch_fixtures import _one_torch_thread, cora, graph, synthetic  # noqa: F401

EXAMPLES = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "examples", "models"))
if EXAMPLES not in sys.path:
    sys.path.append(EXAMPLES)  # after the tests' own folders: the scripts import cora_common from it
