"""One batch in a dealer (MessengerTransport, dealer.py): what it sends, which attempt it is on,
and how it ended. The transitions are the dealer's; the states a batch goes through:

    WAITING  this attempt asks the broker for a worker (LEASE sent, no ASSIGN yet)
    SENT     the TASK went straight to the assigned worker; its RESULT or ERROR is awaited
    DONE     a valid result arrived (delivered exactly once; later ones are duplicates)
    FAILED   given up: `error` says why (raised to the caller in request order)

A retry (timeout, requeue after a worker died, undecodable result) is a new attempt of the same
batch: a new token, WAITING again, the same encoded payload re-sent (payload_route.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkgnn.messenger.shm import Segment

WAITING, SENT, DONE, FAILED = "waiting", "sent", "done", "failed"


@dataclass
class Batch:
    seq: int
    header: dict  # the caller's header + kind/batch/job (unstamped)
    tables: dict | None  # the request tables (kept until done: a retry may re-encode)
    nbytes: int  # total size of the Arrow IPC streams
    ids: str | None  # digest of the request's id column, or None
    framed: tuple | None = None  # (stamped header, payload Buffers) for the frames route
    segment: Segment | None = None  # holds the streams, for the shm route
    shm_header: dict | None = None
    replies: dict = field(default_factory=dict)  # lease -> shm.Segment offered for the result
    state: str = WAITING
    tries: int = 0
    token: str = ""
    lease: object = None
    worker: str | None = None
    deadline: float = 0.0
    retry_lease_at: float = 0.0
    asking_since: float = 0.0  # when this attempt started asking the broker for a worker
    reason: str = ""
    result: tuple[dict, dict] | None = None  # (header, tables), set with DONE
    error: Exception | None = None  # set with FAILED
    history: list = field(default_factory=list)
