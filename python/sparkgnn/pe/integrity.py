"""The files of each committed PE store directory, recorded at commit and checked before use.

WHY: the manifest is the commit record, but a record is only as good as the files it vouches for.
A layer directory deleted, a file truncated by a full disk, a column dropped by a hand-edit: with
only the manifest, the precompute job said "store complete" and `PEStore.open` succeeded, and the
first lookup died with a raw pyarrow error (or, worse, read different numbers). So each commit
records every data file's relative path, size and CRC-32 under `manifest["files"][<dir>]`, and
readers compare:
  - `verify="checksums"` (default): sizes and CRC-32 (cheap next to reading the store, which a
    serving process does anyway; docs/ARCHITECTURE.md, "PE store");
  - `verify="sizes"`: the file list and sizes only (one listing call; catches deleted, truncated
    and added files, not same-size corruption), for very large stores opened often.
Stores committed before file records existed are checked at footer level (readable Parquet with
the expected columns), the best that can be done without a record.
"""

from __future__ import annotations

from sparkgnn import files

FILES_KEY = "files"
MAX_EXAMPLES = 5
VERIFY_LEVELS = ("checksums", "sizes")


def record(directory: str, known: dict[str, str] | None = None) -> list[dict]:
    """[{file, bytes, crc32}] of every data file under `directory` (called right after a commit).
    `known`: file -> CRC-32 of files whose bytes the caller computed it from as it wrote them
    (pe/parts.py), which are not read back."""
    known = known or {}
    return [
        {"file": f.rel, "bytes": f.size, "crc32": known.get(f.rel) or files.crc32(files.join(directory, f.rel))}
        for f in files.data_files(directory)
    ]


def _check_level(verify: str) -> None:
    if verify not in VERIFY_LEVELS:
        raise ValueError(f"verify must be one of {', '.join(VERIFY_LEVELS)}, got {verify!r}")


def problems(directory: str, recorded: list[dict] | None, verify: str = "checksums", columns: tuple = ()) -> list[str]:
    """Why the files under `directory` are not the ones recorded at commit ([] when they are)."""
    _check_level(verify)
    if files.kind(directory) != "dir":
        return ["directory missing"]
    present = {f.rel: f for f in files.data_files(directory)}
    if recorded is None:
        return _unrecorded_problems(directory, present, columns)
    expected = {r["file"]: r for r in recorded}
    found = []
    missing = sorted(set(expected) - set(present))
    if missing:
        found.append(_listed(f"{len(missing)} file(s) missing", missing))
    added = sorted(set(present) - set(expected))
    if added:
        found.append(_listed(f"{len(added)} file(s) not written by the commit", added))
    resized = [
        f"{rel} ({present[rel].size} bytes, committed {expected[rel]['bytes']})"
        for rel in sorted(set(expected) & set(present))
        if present[rel].size != expected[rel]["bytes"]
    ]
    if resized:
        found.append(_listed(f"{len(resized)} file(s) changed size", resized))
    if verify == "checksums" and not found:
        changed = [rel for rel in sorted(expected) if files.crc32(files.join(directory, rel)) != expected[rel]["crc32"]]
        if changed:
            found.append(_listed(f"{len(changed)} file(s) changed content (CRC-32 differs)", changed))
    return found


def _unrecorded_problems(directory: str, present: dict, columns: tuple) -> list[str]:
    """Footer-level check for stores committed before file records existed."""
    if not present:
        return ["no data files"]
    bad = [f"{rel}: {why}" for rel in present if (why := files.parquet_problem(files.join(directory, rel)))]
    if bad:
        return [_listed(f"{len(bad)} unreadable file(s)", bad)]
    lacking = [c for c in columns if c not in files.parquet_columns(files.join(directory, next(iter(present))))]
    return [f"column(s) {', '.join(lacking)} missing"] if lacking else []


def _listed(what: str, items: list[str]) -> str:
    shown = ", ".join(items[:MAX_EXAMPLES]) + (", ..." if len(items) > MAX_EXAMPLES else "")
    return f"{what}: {shown}"
