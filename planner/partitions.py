"""Number of partitions: total cores, unless memory needs more (Lotan §6 / A.1.2).

Why this rule and not a cost search: Lotan's eq. (3) makes runtime non-linear in P (more
partitions = more parallelism until P exceeds the cores, then only overhead), and the probe of
docs/PLATFORM.md agrees. So P = cores is the sweet spot, and the only reason
to go higher is that one task's working set would not fit in its memory share.

Per-task memory estimate (bytes) for a partition holding e edges and v vertices, taken over the
widest layer (raw widths: the planner may or may not pre-transform, so assume it does not):

    task_bytes = WORKER_RSS_BYTES + MEMORY_MARGIN x ( e x EDGE_TASK_BYTES               local ids, weight, CSR
                                                    + s x 4 x F_src                     source payload rows
                                                    + min(e x 12 x (F_src + F_dst), C)  per-edge messages
                                                    + v x (16 + 4 x (in + out + state + dst)) ) own rows

except for a range-wise layer (Model.plan_info's `range_wise`: a sums-path aggregation whose update
and post ops read one row at a time, layers/rowwise.py), where the DL step makes the state and the
update's temporaries for one destination range at a time (dl/step.py): its own rows cost
v x (16 + 4 x (in + out + dst)) + min(v x 4 x state, VERTEX_CHUNK_BYTES). Counting the whole state
there would overstate the task and raise P, and with it R_f, for nothing (docs/ARCHITECTURE.md,
"Data movement and the planner", has the case). A job that keeps every vertex's
state (PE precompute with states) plans with range_wise off.

With the files exchange and the layers run inside Spark's Python workers (`mapped_payloads`), a
task's remote source payloads are never copied into its memory: the DL step multiplies them where
they lie, in the memory-mapped exchange files (engine.routed_files, dl/csr.py blocks), whose pages
the kernel can drop and read again. Only the own sources' payloads (min(s, v) rows) count then,
and not the own rows' input h either (they arrive in local order from one file, so the step uses
that mapped view as h; the first step, whose x comes from every scan file, copies, but it holds no
edges).
That term is what forces P up on large graphs (a task there receives nearly every vertex as a
source), and a higher P raises R_f, so more bytes go through the exchange.

with e = |E| / P, v = |V| / P, s = the source payload rows that reach the task: the distinct
sources among the task's e in-edges for replicate and combine (a remote source arrives once per
partition), e for edge_join (one payload row per edge). With the graph's out-degree histogram
(n_k vertices of out-degree k; engine.degrees computes it once per graph) the distinct sources are
counted in expectation, s = sum_k n_k (1 - (1 - e/|E|)^k): hash partitioning by destination sends
each edge to a task with chance e/|E| = 1/P, and a vertex with k out-edges is a source there unless
all k landed elsewhere (checked against counted sources in docs/ARCHITECTURE.md). Without it, s =
min(e, |V|), an upper bound that is loose exactly where P is raised for memory: many vertices have
few out-edges, so a task holding 1/P of the edges sees far fewer than all sources, and an overstated
P raises R_f, the bytes shipped per layer, with it. Messages are bounded by C = MESSAGE_CHUNK_BYTES
because the DL step aggregates in destination ranges (dl/chunks.py) and the sparse-product path
materialises none; so edges cost ids, not payloads, and memory does not multiply partitions (and the
replication factor with them) on a graph whose messages are what did not fit. The planner picks P
before the strategy, so the rule counts sources as replicate and combine receive them, and compile
warns when edge_join's per-edge rows do not fit.

Each payload row is counted once: the task places every routed row straight into its final buffer
as Spark's batches stream in (engine.received.Received), the DL step sums own and mirror blocks
without concatenating them (dl/csr.py), updates destination ranges into one output (dl/step.py),
and routed output rows are built in slices, so no row has a second copy alive (Spark's whole
input table, an unpacked buffer, a concatenation) for the estimate to count. MEMORY_MARGIN covers
hash skew between partitions and allocator slack; WORKER_RSS_BYTES is what a worker holds before
any data.
When more partitions than cores are needed, P is rounded up to a multiple of the
cores: tasks run in waves of `cores` (eq. 3: max(P/ML, 1) rounds), so a partial last wave costs
a full wave of time while the extra partitions shrink every task's memory for free.

Concurrent tasks (choose_layout). Before raising P, the rule runs fewer of a step's tasks at once
(each task then serves a run of partitions one after another, engine.exchange.control_rows, and
its DL step gets cores / tasks torch threads): on a graph whose vertices have more out-edges than
there are partitions, R_f grows almost like P, so every extra partition ships nearly a whole copy
of the vertices' payloads more per layer through the disk and the page cache (figures in
docs/ARCHITECTURE.md, "Concurrent tasks"), while one task fewer costs
only the parallelism torch's threads do not win back. Order tried: (P = cores, tasks = cores ..
1), then (2 x cores, cores .. 1), ... The first that fits is taken. A worker's memory then is

    worker_bytes = task_bytes + MEMORY_MARGIN x (kept - 1) x e x KEPT_EDGE_BYTES

where kept = min(partitions it serves per step, CACHED_PARTITIONS): the static layouts and CSRs of
the last partitions a worker served stay cached (engine.static, dl/csr.py), and its resident
memory is what the machine must hold (the heap is kept for reuse, sparkgnn.heap, trimmed down to
this estimate after each partition). Two budgets must hold: tasks x worker_bytes within the Python
workers' share (cores x memory_per_task_bytes) and, with mapped payloads, tasks x mapped_bytes
within the page cache left for them (`mapped_budget_bytes`, engine.session): the exchange files a
step reads in place (remote source payloads, the own rows' input h) are a working set too. The
sparse products read every source row of a task at random, so pages the kernel drops are read
again at once and a step that overcommits the page cache thrashes (the 100M-edge case in
docs/ARCHITECTURE.md, "Concurrent tasks").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkgnn.planner.errors import PlanError
from sparkgnn.planner.inputs import LayerSpec, check_int, parse_layers
from sparkgnn.planner.segments import FLOAT_BYTES, ROW_BYTES

MEMORY_MARGIN = 1.25
# Resident memory of a Python worker before it holds data: interpreter, pyspark, pyarrow, pandas,
# torch (the 8M-edge load step, 0.2 GB of features per task, peaked at 0.59 GiB).
WORKER_RSS_BYTES = 400 << 20
# Per edge in a task: the static layout's local src/dst (int64) and weight (float32), the cached
# CSR blocks' order and col (int64 each), and one int64 copy of the index columns the DL side may
# take (unaligned buffers, self loops added).
EDGE_TASK_BYTES = 8 + 8 + 4 + 8 + 8 + 8 + 8
# Per edge with mapped payloads: the in-edges' sources renumbered to the order the payload files
# arrive in (engine.steps._arrival_sources), cached next to the static layout's own.
RENUMBERED_SOURCE_BYTES = 8
# At most this many bytes of per-edge messages exist at once in a DL step (sparkgnn.dl.chunks
# aggregates a partition's edges in destination ranges of this size).
MESSAGE_CHUNK_BYTES = 256 << 20
# At most this many bytes of vertex-sized temporaries (sums, state, the update's intermediates) exist
# at once in a DL step whose layer is range-wise (dl/step.py runs it on destination ranges).
VERTEX_CHUNK_BYTES = 64 << 20
# A requested partition count above max(MIN_PARTITION_CAP, PARTITIONS_PER_CORE_CAP x cores) is
# refused: every partition is a task per step (tens of ms of scheduling and Python start each), so
# 100,000 partitions on 2 cores is a typo, not a plan. Memory pressure never needs more: the
# memory rule below rounds up to multiples of the cores, and 32 waves already cut a task's share
# 32-fold.
MIN_PARTITION_CAP = 1024
PARTITIONS_PER_CORE_CAP = 32
# How many partitions' edge structures a worker keeps between steps (engine.static LAYOUT_ENTRIES,
# dl/csr.py MAX_ENTRIES, engine.steps ARRIVAL_ENTRIES): a worker serving one partition per step keeps
# it warm for every layer; one serving more keeps the last ones and rebuilds the others.
CACHED_PARTITIONS = 2
# Per edge of a partition a worker keeps cached while it runs another: the static layout's local
# src/dst (int64) and weight (float32), the CSR blocks' order and col (int64 each).
KEPT_EDGE_BYTES = 8 + 8 + 4 + 8 + 8


def partition_cap(cores: int) -> int:
    return max(MIN_PARTITION_CAP, PARTITIONS_PER_CORE_CAP * max(int(cores), 1))


def task_memory_bytes(
    edges: float,
    vertices: float,
    src: int,
    in_dim: int,
    out_dim: int,
    state: int,
    dst: int = 0,
    source_rows: float | None = None,
    range_wise: bool = False,
    mapped_payloads: bool = False,
) -> float:
    """Estimated peak bytes of one task holding `edges` edges and `vertices` vertices, receiving
    `source_rows` source payload rows (default: one per edge, edge_join's case), for a layer that
    runs range-wise or not, with remote payloads in the task's memory or left in memory-mapped
    exchange files (`mapped_payloads`; see the module)."""
    rows = edges if source_rows is None else source_rows
    if mapped_payloads:
        rows = min(rows, vertices)  # only the own sources' payloads are made in the task
    edge_part = edges * (EDGE_TASK_BYTES + (RENUMBERED_SOURCE_BYTES if mapped_payloads else 0))
    payload_part = rows * FLOAT_BYTES * src
    message_part = min(edges * 3 * FLOAT_BYTES * (src + dst), MESSAGE_CHUNK_BYTES)
    state_part = vertices * FLOAT_BYTES * state
    if range_wise:
        state_part = min(state_part, VERTEX_CHUNK_BYTES)
    own_in = 0 if mapped_payloads else in_dim  # own rows arrive in local order: used as mapped too
    vertex_part = vertices * (ROW_BYTES + FLOAT_BYTES * (own_in + out_dim + dst)) + state_part
    return WORKER_RSS_BYTES + MEMORY_MARGIN * (edge_part + payload_part + message_part + vertex_part)


def mapped_input_bytes(vertices: float, source_rows: float, src: int, in_dim: int) -> float:
    """Bytes of memory-mapped exchange files a task's step reads in place (with mapped payloads):
    the remote source payloads (the sources that are not its own vertices) and its own rows'
    input h. They are page cache, not the task's heap, but resident while the step runs (module)."""
    remote = max(float(source_rows) - float(vertices), 0.0)
    return FLOAT_BYTES * (remote * src + vertices * in_dim)


def worker_bytes(task_bytes: float, edges: float, served: int, mapped_payloads: bool = False) -> float:
    """A worker's resident heap while it runs one of the `served` partitions it serves per step: the
    task's own peak plus the cached edge structures of the other partitions it keeps (module)."""
    kept = min(max(int(served), 1), CACHED_PARTITIONS) - 1
    per_edge = KEPT_EDGE_BYTES + (RENUMBERED_SOURCE_BYTES if mapped_payloads else 0)
    return task_bytes + MEMORY_MARGIN * kept * edges * per_edge


def widest_mapped_bytes(
    specs: list[LayerSpec], edges: float, vertices: float, feature_dim: int, source_rows: float
) -> float:
    """mapped_input_bytes of the layer that reads the most (raw widths, like widest_layer_bytes)."""
    return max(
        mapped_input_bytes(
            vertices, min(source_rows, edges), s.src_width.raw, max(s.in_dim, feature_dim if s.index == 0 else 0)
        )
        for s in specs
    )


def widest_layer_bytes(
    specs: list[LayerSpec],
    edges: float,
    vertices: float,
    feature_dim: int = 0,
    source_rows: float | None = None,
    mapped_payloads: bool = False,
) -> float:
    """task_memory_bytes of the most demanding layer (raw widths; layer 0 reads x, which may be
    wider than its in_dim when node-wise ops precede the first conv)."""
    return max(
        task_memory_bytes(
            edges,
            vertices,
            s.src_width.raw,
            max(s.in_dim, feature_dim if s.index == 0 else 0),
            s.out_dim,
            s.state_width.raw,
            s.dst_width,
            source_rows,
            s.range_wise,
            mapped_payloads,
        )
        for s in specs
    )


def choose_partitions(*args: Any, **kwargs: Any) -> int:
    """The partition count of choose_layout (same arguments), for callers that run every task at
    once (Spark routes the rows: a task serves exactly one partition)."""
    return choose_layout(*args, **kwargs)[0]


def choose_layout(
    layers: Any,
    num_vertices: int,
    num_edges: int,
    feature_dim: int,
    cores: int,
    memory_per_task_bytes: int,
    requested: int | None = None,
    out_degrees: dict[int, int] | None = None,
    mapped_payloads: bool = False,
    mapped_budget_bytes: int | None = None,
    serial_partitions: bool = False,
) -> tuple[int, int]:
    """(partitions, concurrent tasks): the requested partition count if given (validated >= 1 and
    <= partition_cap(cores)), else `cores`, raised to the smallest multiple of `cores` at which some
    number of concurrent tasks fits the memory (module: concurrent tasks), preferring all cores at
    once; sources per task from `out_degrees`, the out-degree histogram, when given. With mapped
    payloads, `mapped_budget_bytes` bounds the exchange pages all concurrent tasks read in place
    (None: unchecked). Fewer tasks than min(cores, P) only where a task can serve several partitions
    in turn (`serial_partitions`: the files exchange's control rows); else P alone fits the memory."""
    specs = parse_layers(layers)
    num_vertices = check_int(num_vertices, "num_vertices", 1)
    num_edges = check_int(num_edges, "num_edges")
    feature_dim = check_int(feature_dim, "feature_dim", 1)
    cores = check_int(cores, "cores", 1)
    memory = check_int(memory_per_task_bytes, "memory_per_task_bytes", 1)
    mapped_budget = None if mapped_budget_bytes is None else check_int(mapped_budget_bytes, "mapped_budget_bytes", 1)
    sizing = Sizing(
        specs,
        num_vertices,
        num_edges,
        cores,
        memory,
        feature_dim,
        out_degrees,
        mapped_payloads,
        mapped_budget,
        serial_partitions,
    )
    if requested is not None:
        requested = check_int(requested, "requested partitions", 1)
        cap = partition_cap(cores)
        if requested > cap:
            raise PlanError(
                f"{requested} partitions requested, over the cap of {cap} for {cores} cores "
                f"(max({MIN_PARTITION_CAP}, {PARTITIONS_PER_CORE_CAP} x cores)): each partition "
                "is a task per step; leave the count to the planner or ask for fewer"
            )
        return requested, sizing.tasks_that_fit(requested) or (1 if serial_partitions else min(cores, requested))
    return sizing.layout()


def expected_sources(out_degrees: dict[int, int] | None, num_edges: int, num_vertices: int, edges: float) -> float:
    """Expected distinct sources of a task holding `edges` of the graph's `num_edges` edges, each
    edge there with chance edges / num_edges (see the module); min(edges, num_vertices) without a
    histogram. `out_degrees` maps an out-degree k > 0 to the number of vertices that have it."""
    if not out_degrees or num_edges <= 0:
        return min(edges, num_vertices)
    keep = 1.0 - min(edges / num_edges, 1.0)  # chance that one given edge lands elsewhere
    total = 0.0
    for degree, count in out_degrees.items():
        k = int(degree)
        if k > 0:
            total += int(count) * (1.0 - keep**k)
    return min(total, edges, num_vertices)


@dataclass(frozen=True)
class Sizing:
    """What the memory rule sizes a layout for (checked inputs; the rule is in the module)."""

    specs: list[LayerSpec]
    num_vertices: int
    num_edges: int
    cores: int
    memory_per_task_bytes: int
    feature_dim: int = 0
    out_degrees: dict[int, int] | None = None
    mapped_payloads: bool = False
    mapped_budget_bytes: int | None = None
    serial_partitions: bool = False

    def tasks_that_fit(self, partitions: int) -> int:
        """The most tasks (<= cores, <= P) that can run at once on P partitions within both budgets,
        0 when not even one fits; without serial_partitions only min(cores, P) is tried."""
        edges, vertices = self.num_edges / partitions, self.num_vertices / partitions
        sources = expected_sources(self.out_degrees, self.num_edges, self.num_vertices, edges)
        task = widest_layer_bytes(self.specs, edges, vertices, self.feature_dim, sources, self.mapped_payloads)
        mapped = (
            widest_mapped_bytes(self.specs, edges, vertices, self.feature_dim, sources) if self.mapped_payloads else 0.0
        )
        pool = self.cores * self.memory_per_task_bytes
        most = min(self.cores, partitions)
        fewest = 1 if self.serial_partitions else most
        for tasks in range(most, fewest - 1, -1):
            served = -(-partitions // tasks)
            if tasks * worker_bytes(task, edges, served, self.mapped_payloads) > pool:
                continue
            if self.mapped_budget_bytes is not None and tasks * mapped > self.mapped_budget_bytes:
                continue
            return tasks
        return 0

    def layout(self) -> tuple[int, int]:
        """(P, tasks at once): the smallest P in whole waves of `cores` at which some number of
        concurrent tasks fits (source rows per task shrink more slowly than the edges, so this is
        not a plain division), all cores preferred."""
        for waves in range(1, partition_cap(self.cores) // self.cores + 1):
            p = waves * self.cores
            tasks = self.tasks_that_fit(p)
            if tasks:
                return p, tasks
        return (partition_cap(self.cores) // self.cores) * self.cores, self.cores
