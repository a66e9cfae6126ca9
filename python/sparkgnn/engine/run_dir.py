"""Where a run's completed steps are kept so that they survive a lost executor and let a rerun
resume: `<work>/runs/<key>/`.

WHY: `localCheckpoint`'s blocks live in the executors that computed them and have no lineage to
recompute. On a multi-process cluster, one executor SIGKILLed after layer 1 fails the whole job
(`checkpointRDDBlockIdNotFoundError`), and a rerun starts from nothing. Kept in the work dir (a
shared filesystem on a cluster), a finished step stays readable whichever executor dies, and a
rerun of the same job finds it.

Layout of one run (the exchanges write the data, this module only names and commits it):
    <work>/runs/<key>/step=<i>/...                 the step's rows (exchange-specific files)
    <work>/runs/<key>/step=<i>/_COMMITTED.json     written last, once every partition finished
A step counts as complete only through its marker; the marker names what the step wrote (the
shuffle path's attempt directory), so files of a failed or concurrent attempt beside it are never
read. Each marker is one small object written in one piece, which is atomic on an object store
as well as (temp + rename) on a local disk.

`key` hashes everything that decides a step's rows (graph and model fingerprints, the partition
count and routing keys, every step's strategy wiring, the outputs asked for): a rerun with another
model, graph or plan gets another directory and never reads these rows. A run that succeeds
deletes its directory; one that fails keeps it when it holds a committed step (the error says so,
with its size), so nothing is left behind that no rerun could use.
"""

from __future__ import annotations

import hashlib
import json
import uuid

import pyarrow.fs as pafs

from sparkgnn.files import filesystem, join

RUNS_DIR = "runs"
COMMIT_NAME = "_COMMITTED.json"
FORMAT = 1  # bump when the rows a step writes change meaning: old runs are then never resumed


def run_key(facts: dict) -> str:
    """A short stable hash of the facts that decide a run's step outputs."""
    text = json.dumps({"format": FORMAT, **facts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class RunDir:
    """The directory of one run's kept steps (see the module doc)."""

    def __init__(self, work_dir: str, key: str):
        self.key = key
        self.path = join(work_dir, RUNS_DIR, key)
        self._fs, self._inner = filesystem(self.path)

    def step_dir(self, index: int) -> str:
        return join(self.path, f"step={index}")

    def make_step(self, index: int) -> str:
        """Create step `index`'s directory (empty of any earlier attempt's marker) and return it."""
        directory = self.step_dir(index)
        fs, inner = filesystem(directory)
        fs.create_dir(inner, recursive=True)
        self._delete_file(join(inner, COMMIT_NAME))
        return directory

    @staticmethod
    def new_attempt() -> str:
        """A unique name for one attempt's data (the shuffle path's Parquet directory)."""
        return f"attempt={uuid.uuid4().hex}"

    def commit(self, index: int, doc: dict) -> None:
        """Mark step `index` complete: its marker, written last, in one piece."""
        data = json.dumps({"key": self.key, "step": index, **doc}, sort_keys=True).encode()
        fs, inner = filesystem(join(self.step_dir(index), COMMIT_NAME))
        if isinstance(fs, pafs.LocalFileSystem):
            temporary = f"{inner}.tmp-{uuid.uuid4().hex}"
            with fs.open_output_stream(temporary) as sink:
                sink.write(data)
            fs.move(temporary, inner)
        else:  # one PUT: an object appears whole or not at all
            with fs.open_output_stream(inner) as sink:
                sink.write(data)

    def marker(self, index: int) -> dict | None:
        """Step `index`'s commit marker, or None when the step is not (validly) committed."""
        fs, inner = filesystem(join(self.step_dir(index), COMMIT_NAME))
        try:
            with fs.open_input_stream(inner) as stream:
                doc = json.loads(stream.read().decode())
        except (FileNotFoundError, OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("key") != self.key or doc.get("step") != index:
            return None
        return doc

    def _step_indices(self) -> list[int]:
        """The indices of the step directories the run holds (one listing, not one probe each)."""
        try:
            infos = self._fs.get_file_info(pafs.FileSelector(self._inner, allow_not_found=True))
        except OSError:
            return []
        found = []
        for info in infos:
            name, _sep, number = info.base_name.partition("=")
            if name == "step" and number.lstrip("-").isdigit():
                found.append(int(number))
        return sorted(found)

    def last_committed(self, below: int | None = None) -> int | None:
        """The highest committed step index < `below` (the step count; any when None), or None."""
        for index in reversed(self._step_indices()):
            if (below is None or index < below) and self.marker(index) is not None:
                return index
        return None

    def drop_step(self, index: int) -> None:
        """Delete a step's rows once the next step has committed (they are no longer needed)."""
        self._delete_dir(self._step_inner(index))

    def _step_inner(self, index: int) -> str:
        return filesystem(self.step_dir(index))[1]

    def size_bytes(self) -> int:
        try:
            infos = self._fs.get_file_info(pafs.FileSelector(self._inner, recursive=True, allow_not_found=True))
        except OSError:
            return 0
        return sum(int(info.size or 0) for info in infos if info.type == pafs.FileType.File)

    def has_committed_step(self) -> bool:
        return self.last_committed() is not None

    def close(self, keep: bool) -> bool:
        """Delete the run's directory unless `keep` and it holds a committed step; returns whether
        it was kept."""
        if keep and self.has_committed_step():
            return True
        self._delete_dir(self._inner)
        return False

    def _delete_dir(self, inner: str) -> None:
        try:
            self._fs.delete_dir(inner)
        except FileNotFoundError:
            pass

    def _delete_file(self, inner: str) -> None:
        try:
            self._fs.delete_file(inner)
        except FileNotFoundError:
            pass
