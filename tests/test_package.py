"""The package layout and the design's dependency rule (planner/messenger stay torch/Spark free)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_packages_import():
    import sparkgnn
    import sparkgnn.messenger
    import sparkgnn.planner

    assert sparkgnn.planner.__file__.startswith(str(ROOT / "planner"))
    assert sparkgnn.messenger.__file__.startswith(str(ROOT / "messenger"))


def test_planner_and_messenger_import_neither_torch_nor_pyspark():
    pattern = re.compile(r"^\s*(import|from)\s+(torch|pyspark)\b", re.M)
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("planner", "messenger")
        for path in (ROOT / folder).rglob("*.py")
        if pattern.search(path.read_text())
    ]
    assert offenders == []


def test_layers_and_models_do_not_import_pyspark():
    pattern = re.compile(r"^\s*(import|from)\s+pyspark\b", re.M)
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("python/sparkgnn/layers", "python/sparkgnn/models")
        for path in (ROOT / folder).rglob("*.py")
        if pattern.search(path.read_text())
    ]
    assert offenders == []


def test_torch_has_a_floor_where_weights_only_loading_is_safe():
    """Models are loaded with torch.load(weights_only=True) from stores others may write; below
    2.6 a crafted file runs code through it, so the package may not install such a torch."""
    line = re.search(r"^dependencies = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    deps = [d.strip().strip('"') for d in line.group(1).split(",")]
    assert [d for d in deps if re.match(r"torch\b", d)] == ["torch>=2.6"]
    assert "torch==2.13.0" in (ROOT / "requirements.txt").read_text().splitlines()
