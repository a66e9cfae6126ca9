"""The refresh follower's checkpoint on disk: a small document plus an append-only batch journal.

    <state>/checkpoint.json          synced: base graph, store root, counts, committed, pending, seq
    <state>/checkpoint.pending.json  the same as of the latest batch started since (not synced)
    <state>/batches.jsonl            one line per done batch: its files, those applied, those
                                     dead-lettered, the graph fingerprint after it

WHY a journal: the checkpoint is written once per batch. Holding every batch in the document made
each write (and the JSON encoding before it) grow with the follower's age, so a follower running
for days paid more per batch than the refresh of a small batch. Each write now appends the batches
done since the last one and rewrites a document of constant size.

Consistency: a document names how many journal lines it covers (`batches_done`). Lines are
appended before the document that counts them is written, and fsynced before a synced document.
On load the newer document is taken when the journal holds every line it counts, else the synced
one (a machine crash can lose the unsynced tail of both); lines past the chosen document's count
(batches whose document never landed) are cut off, since those batches are redone from the update
folder. A document of the first format (batches inside it) is read too and its batches journaled
on the next write.
"""

from __future__ import annotations

import json
import os

from sparkgnn import files
from sparkgnn.pe.follow_state import FollowError

CHECKPOINT_FILE = "checkpoint.json"
PENDING_FILE = "checkpoint.pending.json"  # the checkpoint as of the batch in flight, not synced
JOURNAL_FILE = "batches.jsonl"
FORMAT = 2
_IN_JOURNAL = ("batches", "dead")  # the checkpoint's lists, kept in the journal, not in the document


def _document(path: str) -> dict | None:
    try:
        return files.read_json(path)
    except FileNotFoundError:
        return None


def _journal(path: str) -> tuple[list[dict], list[int]]:
    """The journal's whole lines and the byte offset after each (a torn or unparsable line ends it)."""
    entries: list[dict] = []
    ends: list[int] = []
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return entries, ends
    at = 0
    while at < len(data):
        end = data.find(b"\n", at)
        if end < 0:
            break
        try:
            entries.append(json.loads(data[at:end]))
        except ValueError:
            break
        at = end + 1
        ends.append(at)
    return entries, ends


def read_checkpoint(state: str) -> dict | None:
    """The latest consistent checkpoint of the state folder `state`, its `batches` and `dead`
    lists filled in from the journal (module doc); None when there is none."""
    return _load(state)[0]


def _load(state: str) -> tuple[dict | None, int]:
    """read_checkpoint's document and the journal bytes it covers."""
    synced = _document(os.path.join(state, CHECKPOINT_FILE))
    try:
        pending = _document(os.path.join(state, PENDING_FILE))
    except ValueError:  # torn by a machine crash: the synced one holds
        pending = None
    entries, ends = _journal(os.path.join(state, JOURNAL_FILE))
    chosen = synced
    if pending is not None and (synced is None or int(pending.get("seq", 0)) > int(synced.get("seq", 0))):
        if int(pending.get("batches_done", 0)) <= len(entries):
            chosen = pending
    if chosen is None:
        return None, 0
    if chosen.get("format") != FORMAT:
        raise FollowError(
            f"state folder {state}: checkpoint format {chosen.get('format')!r}, this sparkgnn reads {FORMAT} "
            "(written by another version): start a new state folder"
        )
    doc = dict(chosen)
    n = int(doc["batches_done"])
    if n > len(entries):
        raise FollowError(
            f"state folder {state}: {CHECKPOINT_FILE} counts {n} batches but {JOURNAL_FILE} holds {len(entries)}; "
            "the folder was changed by hand or lost synced data: start a new state folder"
        )
    doc["batches"] = entries[:n]
    doc["dead"] = [name for entry in doc["batches"] for name in entry.get("dead", [])]
    return doc, ends[n - 1] if n else 0


class CheckpointFiles:
    """Writes a follower's checkpoint (the dict RefreshFollower keeps, `batches` and `dead`
    included) as the journal and document of the module doc."""

    def __init__(self, state: str, journaled_bytes: int, journaled: int):
        self.state = state
        self.journaled = journaled  # batches already in the journal
        self.journal = os.path.join(state, JOURNAL_FILE)
        with open(self.journal, "ab") as fh:  # cut off lines no chosen document counts (module doc)
            fh.truncate(journaled_bytes)

    @classmethod
    def load(cls, state: str) -> tuple[dict | None, CheckpointFiles]:
        """The state folder's checkpoint (read_checkpoint) and the writer that continues it."""
        doc, length = _load(state)
        return doc, cls(state, length, 0 if doc is None else len(doc["batches"]))

    def write(self, checkpoint: dict) -> None:
        """Append the batches done since the last write to the journal, then write the document:
        with a batch pending to the pending file without an fsync (renamed into place: a killed
        process leaves the old or the new one whole), otherwise synced, to checkpoint.json.
        WHY no fsync per batch: it cost more than the refresh of a small batch; a pending write
        lost to a machine crash leaves an older checkpoint whose later files are still in the
        update folder (the follower never removes them), unconsumed, and are applied again from
        there -- none twice, since the rows held in memory went with the crash. Commits (what the
        store holds) stay synced."""
        checkpoint["seq"] = int(checkpoint.get("seq", 0)) + 1
        batches = checkpoint["batches"]
        synced = checkpoint["pending"] is None
        if self.journaled < len(batches) or synced:
            with open(self.journal, "ab") as fh:
                # compact lines: json's C encoder runs only without `indent`
                fh.write(b"".join(json.dumps(entry).encode() + b"\n" for entry in batches[self.journaled :]))
                fh.flush()
                if synced:
                    os.fsync(fh.fileno())
            self.journaled = len(batches)
        doc = {key: value for key, value in checkpoint.items() if key not in _IN_JOURNAL}
        doc.update(format=FORMAT, batches_done=len(batches), dead_letters=len(checkpoint["dead"]))
        data = json.dumps(doc).encode()
        if synced:
            files.write_bytes_atomic(os.path.join(self.state, CHECKPOINT_FILE), data)
            return
        path = os.path.join(self.state, PENDING_FILE)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "wb") as fh:
            fh.write(data)
        os.replace(temporary, path)
