"""examples/models/: each script's model class trains one epoch on Cora, converts with
Model.from_pyg, equals PyG's forward (the script's `run` refuses a difference above 1e-5) and
saves a model that loads back, so the examples cannot rot."""

import importlib.util
import os

import pytest
import torch

from sparkgnn.models import Model

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples", "models")
SCRIPTS = ["gcn_cora", "sage_cora", "gat_cora"]


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_every_example_script_is_tested():
    scripts = sorted(f[:-3] for f in os.listdir(EXAMPLES) if f.endswith(".py") and f != "cora_common.py")
    assert scripts == sorted(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_example_converts_and_saves(name, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)  # the scripts import cora_common from their folder
    spec = importlib.util.spec_from_file_location(f"example_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / name
    converted = script.run(script.build, name, ["--model-out", str(out), "--epochs", "1"])
    assert converted.output == "logits"
    assert converted.spec["source"].startswith(f"example_{name}.")  # the script's own class, traced
    assert Model.load(out).describe() == converted.describe()
