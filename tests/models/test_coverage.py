"""The README's conv coverage table is the one models/coverage.py generates from the conversion
registries, and its rows say what Model.from_pyg really does with each PyG conv class."""

from __future__ import annotations

import pathlib

import pytest
import torch_geometric.nn.conv as pyg_convs_module

from sparkgnn.models import coverage
from sparkgnn.models.pyg_common import class_name
from sparkgnn.models.pyg_convs import CONV_CONVERTERS, REJECTED

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_table_is_the_generated_one():
    assert coverage.section(README.read_text()) == coverage.markdown_table(), (
        "README's conv coverage table is stale: run python -m sparkgnn.models.coverage --write"
    )


def test_every_pyg_conv_has_one_row_read_from_the_registries():
    rows = coverage.coverage_rows()
    names = [name for name, _, _ in rows]
    assert names == [n for n in pyg_convs_module.__all__ if n != "MessagePassing"]
    for name, status, details in rows:
        key = class_name(getattr(pyg_convs_module, name))
        if key in CONV_CONVERTERS:
            assert status == "native", name
        elif key in REJECTED:
            assert (status, details) == ("refused", " ".join(REJECTED[key].split())), name
        else:  # what the generic fallback made of it, when built from coverage.PROBE_ARGUMENTS
            assert status in ("generic", "refused"), name
            assert details.startswith("the module itself") == (status == "generic"), name
    status = {name: s for name, s, _ in rows}
    for name in ("GCNConv", "SAGEConv", "GINConv", "GATConv", "GraphConv", "LGConv", "SGConv"):
        assert status[name] == "native", name
    for name in ("ClusterGCNConv", "FeaStConv", "MFConv", "FiLMConv", "GeneralConv"):
        assert status[name] == "generic", name
    assert status["EGConv"] == "refused"  # symmetric normalisation reads the sources' degrees: not local


def test_write_and_check_on_a_readme(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\n{coverage.START}\nold table\n{coverage.END}\n\nafter\n")
    assert coverage.main(["--check", "--readme", str(readme)]) == 1
    assert coverage.main(["--write", "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# title\n\n") and text.endswith("\n\nafter\n")
    assert coverage.section(text) == coverage.markdown_table()
    assert coverage.main(["--check", "--readme", str(readme)]) == 0


def test_a_readme_without_the_markers_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="conv-coverage:start"):
        coverage.replace_section("no markers here", "table")
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    with pytest.raises(SystemExit) as info:
        coverage.main(["--write", "--readme", str(readme)])
    assert info.value.code == 2
    assert "must hold one <!-- conv-coverage:start -->" in capsys.readouterr().err
