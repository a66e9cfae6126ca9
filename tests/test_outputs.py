"""sparkgnn.outputs: an output never lands on an input, never replaces data unasked, and a failed
write leaves the previous result."""

import os

import pytest

from sparkgnn.errors import OutputError
from sparkgnn.outputs import OUTPUT_MARKER, check_output, discard, staging_path, swap_into_place


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
    (root / "out" / OUTPUT_MARKER).write_text('{"written_by": "sparkgnn"}')
    with pytest.raises(OutputError, match="already holds 2 entries.*--overwrite"):
        check_output(str(root / "out"), inputs)
    check_output(str(root / "out"), inputs, overwrite=True)
    check_output(str(root / "fresh"), inputs)
    (root / "empty").mkdir()
    check_output(str(root / "empty"), inputs)


def test_overwrite_refuses_a_directory_sparkgnn_did_not_write_and_deletes_nothing(layout):
    root, inputs = layout
    mine = root / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_bytes(b"years of work")
    with pytest.raises(OutputError, match=f"no {OUTPUT_MARKER}.*will not delete it"):
        check_output(str(mine), inputs, overwrite=True)
    assert _tree(mine) == {"thesis.tex": b"years of work"}
    check_output(str(mine), inputs, holds_others=True)  # a folder results go into is never replaced


def test_home_root_and_mount_points_are_refused_even_with_overwrite(layout, monkeypatch):
    root, inputs = layout
    home = root / "home"
    home.mkdir()
    (home / OUTPUT_MARKER).write_text("{}")  # even a marker does not make the home directory an output
    monkeypatch.setenv("HOME", str(home))
    for out, what in [("~", "the home directory"), ("/", "the filesystem root"), ("/proc", "a mount point")]:
        with pytest.raises(OutputError, match=f"is {what}: sparkgnn never writes an output there") as caught:
            check_output(os.path.expanduser(out), inputs, overwrite=True)
        assert len(str(caught.value).splitlines()) == 1
    assert _tree(home) == {OUTPUT_MARKER: b"{}"}


def test_a_swapped_in_output_carries_the_marker_and_can_be_replaced(layout):
    root, inputs = layout
    out = str(root / "out")
    for content in (b"first", b"second"):
        check_output(out, inputs, overwrite=True)
        staged = staging_path(out)
        os.makedirs(staged)
        open(os.path.join(staged, "part-0.parquet"), "wb").write(content)
        swap_into_place(staged, out, job="test")
        tree = _tree(out)
        assert tree["part-0.parquet"] == content and b'"job": "test"' in tree[OUTPUT_MARKER]


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
    (out / OUTPUT_MARKER).write_text("{}")
    swap_into_place(staged, str(out))
    assert _tree(out) == {"b": b"new", OUTPUT_MARKER: b'{"written_by": "sparkgnn"}'}
    assert sorted(os.listdir(tmp_path)) == ["out"]
