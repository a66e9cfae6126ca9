"""sparkgnn.outputs: an output never lands on an input, never replaces data unasked, and a failed
write leaves the previous result."""

import os

import pytest

from sparkgnn.errors import OutputError
from sparkgnn.outputs import check_output, discard, staging_path, swap_into_place


def _tree(root) -> dict:
    return {
        os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
        for d, _dirs, files in os.walk(root)
        for f in files
    }


@pytest.fixture
def layout(tmp_path):
    graph = tmp_path / "graph"
    (graph / "edges").mkdir(parents=True)
    (graph / "edges" / "part-0.parquet").write_bytes(b"edges")
    model = tmp_path / "model"
    model.mkdir()
    return tmp_path, {"graph directory": str(graph), "model": str(model), "work dir": None}


@pytest.mark.parametrize(
    "where, how",
    [
        ("graph", "is the graph directory"),
        ("graph/edges", "is inside the graph directory"),
        (".", "contains the graph directory"),
    ],
)
def test_output_on_an_input_is_refused_even_with_overwrite(layout, where, how):
    root, inputs = layout
    before = _tree(root)
    with pytest.raises(OutputError, match=how):
        check_output(str(root / where), inputs, overwrite=True)
    assert _tree(root) == before


def test_non_empty_output_needs_overwrite(layout):
    root, inputs = layout
    (root / "out").mkdir()
    (root / "out" / "part-0.parquet").write_bytes(b"old")
    with pytest.raises(OutputError, match="already holds 1 entries.*--overwrite"):
        check_output(str(root / "out"), inputs)
    check_output(str(root / "out"), inputs, overwrite=True)
    check_output(str(root / "fresh"), inputs)
    (root / "empty").mkdir()
    check_output(str(root / "empty"), inputs)


def test_existing_file_needs_overwrite(layout):
    root, inputs = layout
    (root / "result.parquet").write_bytes(b"x")
    with pytest.raises(OutputError, match="is an existing file"):
        check_output(str(root / "result.parquet"), inputs)


def test_unwritable_parent_is_refused(layout):
    root, inputs = layout
    (root / "afile").write_bytes(b"x")
    with pytest.raises(OutputError, match="is not a directory"):
        check_output(str(root / "afile" / "out"), inputs)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_read_only_parent_is_refused(layout):
    root, inputs = layout
    ro = root / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(OutputError, match="is not writable"):
            check_output(str(ro / "out"), inputs)
    finally:
        ro.chmod(0o755)


def test_swap_replaces_and_a_failed_write_keeps_the_old_result(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a").write_bytes(b"old")
    staged = staging_path(str(out))
    assert os.path.basename(staged).startswith(".out.sparkgnn-tmp-")
    os.makedirs(staged)
    (tmp_path / os.path.basename(staged) / "b").write_bytes(b"new")
    discard(staged)  # the job failed: old result untouched
    assert _tree(out) == {"a": b"old"} and sorted(os.listdir(tmp_path)) == ["out"]
    staged = staging_path(str(out))
    os.makedirs(staged)
    open(os.path.join(staged, "b"), "wb").write(b"new")
    swap_into_place(staged, str(out))
    assert _tree(out) == {"b": b"new"} and sorted(os.listdir(tmp_path)) == ["out"]
