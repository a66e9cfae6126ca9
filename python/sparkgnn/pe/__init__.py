"""The PE store: per-layer embeddings (and partial aggregation states) precomputed once per
(graph, model), plus Quiver's workload metrics, for serving to reuse.

    layout     directory layout, manifest read/write (atomic), local-path handling
    identity   model / graph fingerprints and per-layer widths (from objects or paths)
    writer     PEWriter: atomic per-layer commits, resume after a crash, force
    store      PEStore: open with verification (StalePEStore), lookups, Spark frames
    lookup     vectorised id -> row lookup over Arrow vector columns
    rowfile    row-addressable layers: Arrow IPC row files by id, memory-mapped (a refresh reads rows)
    refresh    incremental refresh on one machine; follow: the follower over a folder of updates
    sizes      size report vs OMEGA's (L-1) x H x 4 bytes/node
    metrics    degrees, PSGS, FAP with Spark joins
    typed      the typed store: per round and node type h, one sub-store per type (TypedPEStore)

No pyspark or torch import at package import time.
"""

from sparkgnn.pe.lookup import UnknownIds
from sparkgnn.pe.store import PEStore
from sparkgnn.pe.writer import PEWriter

__all__ = ["PEStore", "PEWriter", "UnknownIds"]
