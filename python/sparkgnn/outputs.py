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
`overwrite` replaces only what sparkgnn wrote: every swapped-in output carries a commit marker
(`_SPARKGNN_OUTPUT.json`, a side file Spark and pyarrow readers skip), and an existing non-empty
directory without it is refused even with `overwrite` (`--out ~ --overwrite` would otherwise delete
the home directory). Spark's own `_SUCCESS` is not accepted instead: any Spark job leaves it, so it
does not say the folder is sparkgnn's to delete. `/`, the home directory and mount points are
refused as outputs always.
All through pyarrow.fs, so local paths and the remote filesystems pyarrow reaches behave alike.

On an object store (s3://, gs://) there is no rename: a "move" of a directory is a copy of every
object and a delete (pyarrow's own move refuses directories there). Steps 1 and 2 are unchanged;
step 3 copies, so it is NOT atomic: it takes time proportional to the output, a reader listing
`<name>` meanwhile can see part of the new result, and a crash in the middle leaves a partial one
(the old result is then still whole under its `.<name>.sparkgnn-old-<uuid>` sibling, and the new
one under the staging sibling). Side files (`_SUCCESS`) are copied last, so a result carrying
`_SUCCESS` was copied whole. Readers that need atomicity on object stores read through a manifest
instead (as the PE store does, sparkgnn.pe.layout).
"""

from __future__ import annotations

import functools
import json
import os
import uuid

from sparkgnn import files
from sparkgnn.errors import OutputError

STAGING_MARK = ".sparkgnn-tmp-"
RETIRED_MARK = ".sparkgnn-old-"
OUTPUT_MARKER = "_SPARKGNN_OUTPUT.json"


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


def protected_reason(path) -> str | None:
    """What makes the local directory `path` unfit to be written into or replaced as a whole (the
    filesystem root, the user's home directory, a mount point), or None. Remote paths: None."""
    text = str(path)
    if "://" in text and not text.startswith("file:"):
        return None
    target = _normal(text)
    if target == "/":
        return "the filesystem root"
    if target == os.path.realpath(os.path.expanduser("~")):
        return "the home directory"
    if os.path.ismount(target):
        return "a mount point"
    return None


def refuse_protected(path, flag: str = "--out") -> None:
    """Raise OutputError (one line) when `path` is `/`, the home directory or a mount point."""
    reason = protected_reason(path)
    if reason:
        raise OutputError(
            f"{flag} {path} is {reason}: sparkgnn never writes an output there; choose a folder inside it"
        )


def is_sparkgnn_output(path) -> bool:
    """Whether the directory `path` carries the commit marker swap_into_place leaves."""
    fs, inner = files.filesystem(path)
    return fs.get_file_info(f"{inner.rstrip('/')}/{OUTPUT_MARKER}").type == files.pafs.FileType.File


def check_output(
    out, inputs: dict, overwrite: bool = False, flag: str = "--out", *, holds_others: bool = False
) -> None:
    """Refuse `out` (see module doc). `inputs`: {flag or name: path or None} of what the job reads
    or keeps (graph, model, ids file, work dir): never written over, even with overwrite.
    `holds_others`: `out` is the folder the results go into, never replaced itself, so whatever it
    already holds is left alone and not checked (`overwrite` is then irrelevant)."""
    if files.is_object_store(out) and "/" not in str(out).partition("://")[2].strip("/"):
        raise OutputError(f"cannot write {flag} {out}: name a folder inside the bucket, not the bucket itself")
    refuse_protected(out, flag)
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
    if where == "dir" and not holds_others:
        fs, inner = files.filesystem(out)
        held = fs.get_file_info(files.pafs.FileSelector(inner, recursive=False))
        if held and not overwrite:
            raise OutputError(
                f"{flag} {out} already holds {len(held)} entries (an earlier result?); pass "
                "--overwrite to replace it, or choose a new directory"
            )
        if held and not is_sparkgnn_output(out):
            raise OutputError(
                f"{flag} {out} holds {len(held)} entries but no {OUTPUT_MARKER}, so sparkgnn did not write "
                "it and --overwrite will not delete it; remove it yourself or choose a new directory"
            )
    _check_writable(out, flag)


def _check_writable(out, flag: str) -> None:
    """Local paths: the nearest existing ancestor must be a writable directory. (An object-store
    output must be a folder inside a bucket, where its staging and retired siblings can live:
    check_output refuses the bucket itself first.)"""
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


def _copy_move(fs, source: str, target: str) -> None:
    """A move on an object store: copy every object (side files such as _SUCCESS last), then
    delete the source. Not atomic (module doc)."""
    if fs.get_file_info(source).type == files.pafs.FileType.File:
        fs.copy_file(source, target)
        fs.delete_file(source)
        return
    prefix = source.rstrip("/") + "/"
    infos = fs.get_file_info(files.pafs.FileSelector(source, recursive=True))
    rels = [i.path[len(prefix) :] for i in infos if i.type == files.pafs.FileType.File and i.path.startswith(prefix)]
    for rel in sorted(rels, key=lambda r: (not files.is_data_name(r), r)):
        fs.copy_file(prefix + rel, f"{target.rstrip('/')}/{rel}")
    fs.delete_dir(source)


def mark_output(staged, job: str | None = None) -> None:
    """Leave the commit marker (OUTPUT_MARKER, naming the writing `job`) in the staged directory,
    so a later `overwrite` knows the folder is sparkgnn's to replace."""
    doc = {"written_by": "sparkgnn", **({"job": job} if job else {})}
    files.write_bytes_atomic(f"{str(staged).rstrip('/')}/{OUTPUT_MARKER}", json.dumps(doc).encode())


def swap_into_place(staged, out, *, job: str | None = None) -> None:
    """Move `staged` to `out`; an existing `out` (the caller was told it may be replaced) is moved
    aside first and deleted last, so at every instant one complete result exists (on a local disk
    and HDFS, where a move is a rename; on an object store a move is a copy: see the module doc).
    A staged directory gets the commit marker first (mark_output; `job` names the writer)."""
    fs, target = files.filesystem(out)
    _fs, source = files.filesystem(staged)
    if fs.get_file_info(source).type == files.pafs.FileType.Directory:
        mark_output(staged, job)
    if files.is_object_store(out):
        move = functools.partial(_copy_move, fs)
    else:
        fs.create_dir(os.path.dirname(target.rstrip("/")) or "/", recursive=True)
        move = fs.move
    retired = None
    if fs.get_file_info(target).type != files.pafs.FileType.NotFound:
        head, _sep, name = target.rstrip("/").rpartition("/")
        retired = f"{head}/.{name}{RETIRED_MARK}{uuid.uuid4().hex}"
        move(target, retired)
    try:
        move(source, target)
    except Exception:
        if retired is not None:
            if files.is_object_store(out):
                _delete_in(fs, target)  # a partial copy
            move(retired, target)
        raise
    if retired is not None:
        _delete_in(fs, retired)


def discard(staged) -> None:
    """Remove a staging directory after a failed write (best effort: it is hidden anyway)."""
    try:
        _delete_in(*files.filesystem(staged))
    except OSError:
        pass


def write_parquet_staged(frame, out) -> None:
    """Write the Spark DataFrame `frame` as Parquet into a staging sibling of `out`, then swap it in:
    a failed write is discarded and leaves any earlier result whole (the caller checked `out`)."""
    staged = staging_path(out)
    try:
        frame.write.parquet(staged)
    except BaseException:
        discard(staged)
        raise
    swap_into_place(staged, out)
