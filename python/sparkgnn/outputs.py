"""Writing a job's result without losing anything: refuse, stage, then swap into place.

WHY: Spark's `mode("overwrite")` deletes the target before it writes. Pointed at the graph
directory by a typo it deleted the graph (exit 0); pointed at an earlier result it replaced it
without a word; and a job that failed mid-write left neither the old nor a new result. So:
  1. `check_output` refuses, before any work, an output that is (or lies inside, or contains) one of
     the job's inputs, one that already holds data unless the caller said `overwrite`, and one whose
     parent cannot be written;
  2. the job writes into a staging sibling (`.<name>.sparkgnn-tmp-<uuid>`), which readers of
     `<name>` never see and Spark/Hadoop listings skip (leading dot);
  3. `swap_into_place` moves an existing output aside, moves the staged one in, and only then
     deletes the old one. A failure before step 3 leaves the previous result untouched.
All through pyarrow.fs, so local paths and the remote filesystems pyarrow reaches behave alike.
"""

from __future__ import annotations

import os
import uuid

from sparkgnn import files
from sparkgnn.errors import OutputError

STAGING_MARK = ".sparkgnn-tmp-"
RETIRED_MARK = ".sparkgnn-old-"


def _normal(path) -> str:
    path = str(path)
    if path.startswith("file:") or "://" not in path:
        return os.path.realpath(files.filesystem(path)[1])
    return path.rstrip("/")


def _overlap(out: str, other: str) -> str | None:
    """How `out` collides with an input path, or None."""
    if out == other:
        return "is"
    if other.startswith(out.rstrip("/") + "/"):
        return "contains"
    if out.startswith(other.rstrip("/") + "/"):
        return "is inside"
    return None


def check_output(out, inputs: dict, overwrite: bool = False, flag: str = "--out") -> None:
    """Refuse `out` (see module doc). `inputs`: {flag or name: path or None} of what the job reads
    or keeps (graph, model, ids file, work dir): never written over, even with overwrite."""
    target = _normal(out)
    for name, path in inputs.items():
        if path is None or not isinstance(path, (str, os.PathLike)):
            continue
        how = _overlap(target, _normal(path))
        if how:
            raise OutputError(
                f"{flag} {out} {how} the {name} {path}: writing there would destroy the job's "
                f"input; choose another {flag}"
            )
    where = files.kind(out)
    if where == "file" and not overwrite:
        raise OutputError(f"{flag} {out} is an existing file; pass --overwrite to replace it")
    if where == "dir" and not overwrite:
        fs, inner = files.filesystem(out)
        held = fs.get_file_info(files.pafs.FileSelector(inner, recursive=False))
        if held:
            raise OutputError(
                f"{flag} {out} already holds {len(held)} entries (an earlier result?); pass "
                "--overwrite to replace it, or choose a new directory"
            )
    _check_writable(out, flag)


def _check_writable(out, flag: str) -> None:
    """Local paths: the nearest existing ancestor must be a writable directory."""
    path = str(out)
    if "://" in path and not path.startswith("file:"):
        return
    probe = os.path.dirname(files.filesystem(path)[1].rstrip("/"))
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise OutputError(f"cannot write {flag} {out}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {flag} {out}: {probe} is not writable")


def staging_path(out) -> str:
    """A fresh sibling of `out` to write into (same filesystem, so the swap is a rename)."""
    text = str(out).rstrip("/")
    head, _sep, name = text.rpartition("/")
    return f"{head}/.{name}{STAGING_MARK}{uuid.uuid4().hex}" if head else f".{name}{STAGING_MARK}{uuid.uuid4().hex}"


def _delete_in(fs, inner: str) -> None:
    info = fs.get_file_info(inner)
    if info.type == files.pafs.FileType.Directory:
        fs.delete_dir(inner)
    elif info.type == files.pafs.FileType.File:
        fs.delete_file(inner)


def swap_into_place(staged, out) -> None:
    """Move `staged` to `out`; an existing `out` (the caller was told it may be replaced) is moved
    aside first and deleted last, so at every instant one complete result exists."""
    fs, target = files.filesystem(out)
    _fs, source = files.filesystem(staged)
    fs.create_dir(os.path.dirname(target.rstrip("/")) or "/", recursive=True)
    retired = None
    if fs.get_file_info(target).type != files.pafs.FileType.NotFound:
        head, _sep, name = target.rstrip("/").rpartition("/")
        retired = f"{head}/.{name}{RETIRED_MARK}{uuid.uuid4().hex}"
        fs.move(target, retired)
    try:
        fs.move(source, target)
    except Exception:
        if retired is not None:
            fs.move(retired, target)
        raise
    if retired is not None:
        _delete_in(fs, retired)


def discard(staged) -> None:
    """Remove a staging directory after a failed write (best effort: it is hidden anyway)."""
    try:
        _delete_in(*files.filesystem(staged))
    except OSError:
        pass
