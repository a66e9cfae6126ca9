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
