"""The graph-engine side of one fused layer step, run inside a Spark Python task (mapInArrow).

Collect: the task receives every row routed to its partition (own vertices' h, mirrors' payloads,
partial states, ...), maps ids to the partition's local order with the static indexes, hands the
DL engine one set of tables through the transport (one Pipe round trip per partition per step),
and Scatters the results as routed rows for the next step (or as output rows after the last layer).
numpy + pyarrow only: with a messenger transport, Spark tasks never import torch.

Registries, not flags: INPUTS maps how a layer's input arrived to a table builder; OUTPUTS
(engine.step_outputs) maps what the next layer needs to a row builder.
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkgnn.arrowvec import pack_binary, to_fixed_list, to_numpy_matrix
from sparkgnn.engine import exchange, static
from sparkgnn.engine.received import Placement, Received, vector_column
from sparkgnn.engine.routing import DST, EDGE, OWN, PE_STATE, SRC, STATE, make_rows, split_batches
from sparkgnn.engine.static import EDGE_ATTR_COLUMN
from sparkgnn.engine.step_outputs import OUTPUT_STAGE, OUTPUTS, write_pe_part
from sparkgnn.errors import USER_ERRORS, SparkGNNError
from sparkgnn.heap import release_retained_memory, retain_freed_memory
from sparkgnn.planner.partitions import CACHED_PARTITIONS


class StepFailed(SparkGNNError, RuntimeError):
    """A layer step failed inside a Spark task; the message names partition, layer and cause."""


@dataclass(frozen=True)
class StepConfig:
    prep_dir: str
    partitions: int
    keys: tuple
    model: str  # model fingerprint
    layer: int  # conv whose aggregation this step finishes (-1: first step)
    num_layers: int
    inputs: str  # key of INPUTS
    outputs: str  # key of OUTPUTS
    pre_transform: bool = False
    next_pre_transform: bool = False
    transport: dict = field(default_factory=dict)
    with_pred: bool = False
    with_state: bool = False  # also emit each own vertex's merged state (PE store)
    # the statistic columns own tables carry (sparkgnn.stat_keys keys of the model's convs; each a
    # column of static.STAT_COLUMNS)
    stats: tuple = ()
    out_dir: str | None = None  # outputs "final_files": where each task writes its Parquet part
    # PE precompute: the store's attempt folder where each task writes its partition's rows of the
    # layer this step completes (id, h[, state]; step_outputs.write_pe_part) instead of routing them
    pe_dir: str | None = None
    exchange_in: str | None = None  # files exchange: the previous step's directory (engine.exchange)
    exchange_out: str | None = None  # files exchange: where this step writes its routed rows
    # a worker keeps freed memory for reuse up to this many resident bytes (None: no bound); more is
    # handed back after each partition (sparkgnn.heap.release_retained_memory)
    retain_bytes: int | None = None
    # False: at the end of each task the worker drops its per-partition caches and hands its whole
    # free heap back (planner.compile: idle workers would sit on them while another one runs)
    keep_between_steps: bool = True

    @property
    def dl_aggregate(self) -> str:
        return INPUT_STAGE[self.inputs]

    @property
    def dl_emit(self) -> str:
        return OUTPUT_STAGE[self.outputs]


def _vectors(rows: pa.Table) -> np.ndarray:
    return to_numpy_matrix(rows.column(vector_column(rows)))


def _own_placement(cfg, part) -> Placement:
    return Placement(
        static.owned(cfg.prep_dir, part).ids,
        "own",
        f"partition {part} owns {{expected}} vertices but received {{received}} own rows "
        "(a vertex is missing or duplicated upstream)",
    )


def _payload_placement(sorted_ids: np.ndarray, what: str) -> Placement:
    return Placement(sorted_ids, what, f"expected {{expected}} {what} rows, received {{received}}")


def _own_table(cfg: StepConfig, received: Received, part: int) -> pa.Table:
    """Own rows of partition `part`: h and the statistic columns the model's convs read (cfg.stats,
    by stat key; static.stat_columns: the out-edge ones from their on-demand pieces)."""
    columns = {"h": to_fixed_list(received.vectors(OWN))}
    columns.update(
        {key: pa.array(values) for key, values in static.stat_columns(cfg.prep_dir, part, cfg.stats).items()}
    )
    return pa.table(columns)


@dataclass(frozen=True)
class InputKind:
    """How a layer's input arrives: which kinds are placed by id as they stream in (`placed`:
    kind -> Placement for a partition), which are kept as rows, and how the DL tables are built."""

    placed: Callable[[StepConfig, int], dict[int, Placement]]
    build: Callable[[StepConfig, Received, int], dict]
    kept: tuple[int, ...] = ()
    # placed kinds the DL step can use where they arrived, as blocks of the exchange's memory-mapped
    # files (files exchange only: Spark's batches are the task's own memory either way)
    mapped: tuple[int, ...] = (OWN,)


def _own_only(cfg, part):
    return {OWN: _own_placement(cfg, part)}


def build_first(cfg, received, part):
    return {"own": _own_table(cfg, received, part)}


def _own_and_mirrors(cfg, part):
    return {
        OWN: _own_placement(cfg, part),
        SRC: _payload_placement(static.in_edges(cfg.prep_dir, part).mirror_ids, "mirror payload"),
    }


def build_edges_static(cfg, received, part):
    edges = static.in_edges(cfg.prep_dir, part)
    own = _own_table(cfg, received, part)
    if received.mapped(SRC):
        blocks = received.mapped_blocks(SRC)
        n_own = len(static.owned(cfg.prep_dir, part).ids)
        src = _arrival_sources((cfg.prep_dir, part), edges.src, n_own, [pos for pos, _ in blocks])
        chunks = [to_fixed_list(values) for _, values in blocks]
        mirror = pa.chunked_array(chunks) if chunks else pa.chunked_array([], pa.list_(pa.float32(), 1))
    else:
        src, vectors = edges.src, received.vectors(SRC)
        mirror = to_fixed_list(vectors) if len(vectors) else pa.array([], pa.list_(pa.float32(), 1))
    edge_columns = {"src": src, "dst": edges.dst, "weight": edges.w}
    if edges.attr is not None and len(edges.attr):
        edge_columns["attr"] = to_fixed_list(edges.attr)
    return {"own": own, "mirror": pa.table({"p": mirror}), "edges": pa.table(edge_columns)}


# (prepared dir, partition) -> (arrival order of its mirrors, the in-edges' sources renumbered to
# it): the files exchange delivers the mirrors in the same order every step, so the renumbering is
# made once per partition a worker serves (at most ARRIVAL_ENTRIES, least recently used out).
_ARRIVAL_SOURCES: OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = OrderedDict()
ARRIVAL_ENTRIES = CACHED_PARTITIONS


def _arrival_sources(key: tuple, src: np.ndarray, n_own: int, positions: list[np.ndarray]) -> np.ndarray:
    """The in-edges' sources with mirror rows numbered in arrival order (n_own + i for the i-th row
    that arrived) instead of the static layout's sorted order, so the DL step can read each source
    file's block where it lies. Own sources (< n_own) keep their numbers."""
    order = np.concatenate(positions) if positions else np.zeros(0, np.int64)
    cached = _ARRIVAL_SOURCES.get(key)
    if cached is not None and np.array_equal(cached[0], order):
        _ARRIVAL_SOURCES.move_to_end(key)
        return cached[1]
    arrival = np.empty(len(order), dtype=np.int64)
    arrival[order] = np.arange(len(order), dtype=np.int64)
    renumbered = np.array(src, dtype=np.int64, copy=True)
    remote = renumbered >= n_own
    renumbered[remote] = n_own + arrival[renumbered[remote] - n_own]
    _ARRIVAL_SOURCES[key] = (order, renumbered)
    while len(_ARRIVAL_SOURCES) > ARRIVAL_ENTRIES:
        _ARRIVAL_SOURCES.popitem(last=False)
    return renumbered


def build_edges_rows(cfg, received, part):
    owned = static.owned(cfg.prep_dir, part)
    edge_rows = received.rows(EDGE)
    src_ids = edge_rows.column("id").to_numpy()
    dst_ids = edge_rows.column("aux").to_numpy()
    dst = static.positions(owned.ids, dst_ids, "edge dst")
    src = len(owned.ids) + np.arange(len(src_ids), dtype=np.int64)
    loops = src_ids == dst_ids  # a self loop's source is the own vertex itself (self-loop policies rely on it)
    src[loops] = dst[loops]
    edge_columns = {"src": src, "dst": dst.astype(np.int64), "weight": edge_rows.column("w").to_numpy()}
    if EDGE_ATTR_COLUMN in edge_rows.column_names and edge_rows.num_rows:  # edge_join of a graph with edge_attr
        edge_columns["attr"] = to_fixed_list(to_numpy_matrix(edge_rows.column(EDGE_ATTR_COLUMN)))
    tables = {"own": _own_table(cfg, received, part), "edges": pa.table(edge_columns)}
    if edge_rows.num_rows:
        tables["mirror"] = pa.table({"p": to_fixed_list(_vectors(edge_rows))})
    return tables


def build_states(cfg, received, part):
    owned = static.owned(cfg.prep_dir, part)
    state_rows = received.rows(STATE)
    seg = static.positions(owned.ids, state_rows.column("id").to_numpy(), "partial-state dst")
    table = {"seg": pa.array(seg.astype(np.int64))}
    table["s"] = to_fixed_list(_vectors(state_rows)) if state_rows.num_rows else pa.array([], pa.list_(pa.float32(), 1))
    return {"own": _own_table(cfg, received, part), "states": pa.table(table)}


def _own_and_foreign(cfg, part):
    foreign = static.out_edges(cfg.prep_dir, part).foreign_ids
    return {OWN: _own_placement(cfg, part), DST: _payload_placement(foreign, "foreign destination payload")}


def build_given(cfg, received, part):
    """Second step of a combine layer with attention: own rows carry h^(l); DST rows carry the
    destination payloads of foreign destinations of this partition's out-edges."""
    foreign = received.vectors(DST)
    tables = {"own": _own_table(cfg, received, part)}
    if len(foreign):
        tables["foreign_dst"] = pa.table({"d": to_fixed_list(foreign)})
    return tables


INPUTS = {
    "first": InputKind(_own_only, build_first),
    "resume": InputKind(_own_only, build_first),
    "edges_static": InputKind(_own_and_mirrors, build_edges_static, mapped=(OWN, SRC)),
    "edges_rows": InputKind(_own_only, build_edges_rows, kept=(EDGE,)),
    "states": InputKind(_own_only, build_states, kept=(STATE,)),
    # pushdown: one state per destination, aggregated by Spark (engine.pushdown)
    "spark_states": InputKind(_own_only, build_states, kept=(STATE,)),
    "given": InputKind(_own_and_foreign, build_given),
}
INPUT_STAGE = {
    "first": "none",
    "resume": "given",
    "edges_static": "edges",
    "edges_rows": "edges",
    "states": "states",
    "spark_states": "states",
    "given": "given",
}


def collect_files(cfg: StepConfig, part: int, files, spent: dict, task: dict) -> tuple[int, dict]:
    """collect for the files exchange: the routed-rows files addressed to `part` (engine.routed_files).
    A file holding one mapped kind of one width is placed as one block, its vectors left in the
    memory-mapped file (Received's mapped kinds); anything else goes batch by batch like Spark's rows."""
    kind = INPUTS[cfg.inputs]
    task["partition"] = part
    received = Received(part, kind.placed(cfg, part), kind.kept, kind.mapped)
    clock = time.perf_counter()
    for routed in files:
        if not routed.num_rows:
            continue
        pts, kinds = routed.column("pt"), routed.column("kind")
        if (pts != part).any():
            raise StepFailed(
                f"{routed.path} holds rows for partition {int(pts[pts != part][0])}, read by partition {part}"
            )
        only = int(kinds[0]) if (kinds == kinds[0]).all() else None
        if only is not None and received.mapped(only):
            matrix = routed.matrix()
            if matrix is not None:
                received.place(only, routed.column("id"), matrix)
                continue
        for batch in routed.batches():
            received.add(batch)
    tables = kind.build(cfg, received, part)
    spent["collect_s"] = spent.get("collect_s", 0.0) + time.perf_counter() - clock
    return part, tables


def collect(cfg: StepConfig, batches, spent: dict | None = None, task: dict | None = None) -> tuple[int, dict] | None:
    """Take one task's routed batches as they arrive and build the DL tables: (partition, tables),
    or None when the task received nothing. `spent` (optional) sums rows_in_s (waiting for Spark's
    next batch) and collect_s (placing rows, building tables); `task["partition"]` is set as soon
    as the first batch names it (so an error raised later can say which partition failed)."""
    spent = {} if spent is None else spent
    task = {} if task is None else task
    kind = INPUTS[cfg.inputs]
    received = None
    batches = iter(batches)
    while True:
        clock = time.perf_counter()
        batch = next(batches, None)
        spent["rows_in_s"] = spent.get("rows_in_s", 0.0) + time.perf_counter() - clock
        if batch is None:
            break
        if not batch.num_rows:
            continue
        clock = time.perf_counter()
        part = _partition_of(batch)
        if received is None:
            task["partition"] = part
            received = Received(part, kind.placed(cfg, part), kind.kept)
        elif part != received.part:
            raise StepFailed(
                f"rows of partitions {received.part} and {part} reached one task; is adaptive coalescing on?"
            )
        received.add(batch)
        spent["collect_s"] = spent.get("collect_s", 0.0) + time.perf_counter() - clock
    if received is None:
        return None
    clock = time.perf_counter()
    tables = kind.build(cfg, received, received.part)
    spent["collect_s"] = spent.get("collect_s", 0.0) + time.perf_counter() - clock
    return received.part, tables


# ---- the mapInArrow function ----------------------------------------------------------------------


def _partition_of(batch: pa.RecordBatch) -> int:
    bounds = pc.min_max(batch.column("pt"))
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low != high:
        raise StepFailed(f"rows of several partitions ({low} .. {high}) reached one task; is adaptive coalescing on?")
    return int(low)


TIMERS = ("rows_in_s", "collect_s", "dl_s", "scatter_s")
# A max-accumulator (engine.metrics.MaxParam): the largest peak RSS of a Python worker after a task.
PEAK_RSS = "peak_rss_bytes"


def _peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB). The Python worker is reused
    across tasks, so it bounds the peak of every task it ran, this one included."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def run_step(cfg: StepConfig, batches, timers: dict | None = None):
    """The mapInArrow function of a step: run_partition over the rows Spark routed here, or with
    the files exchange (engine.exchange) over the previous step's files for each partition this
    task serves (one, or a run of them when the plan runs fewer tasks than partitions at once),
    writing the routed output to files and handing Spark one summary row per partition."""
    if cfg.exchange_in is None and cfg.exchange_out is None:
        yield from run_partition(cfg, functools.partial(collect, cfg, batches), timers)
        return
    if cfg.exchange_in is None:
        assert cfg.exchange_out is not None  # Spark's rows in, files out
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise exchange.ExchangeError("a step that writes exchange files must run inside a Spark task")
        part = context.partitionId()  # routed shuffle partition i is partition i (routing.py)
        output = run_partition(cfg, functools.partial(collect, cfg, batches), timers)
        yield from exchange.write_routed(cfg.exchange_out, part, cfg.partitions, output)
        return
    for part in exchange.control_partitions(batches):
        files = exchange.routed_files(cfg.exchange_in, part, cfg.partitions)
        output = run_partition(cfg, functools.partial(collect_files, cfg, part, files), timers)
        if cfg.exchange_out is None:
            yield from output
        else:
            yield from exchange.write_routed(cfg.exchange_out, part, cfg.partitions, output)
        # what this partition alone needed goes back to the OS before the next one (sparkgnn.heap)
        release_retained_memory(cfg.retain_bytes)
    if not cfg.keep_between_steps:
        drop_partition_caches()
        release_retained_memory(0)


def drop_partition_caches() -> None:
    """Forget the per-partition structures this worker keeps between steps: the static edge
    arrays, the arrival renumbering and, where the DL step runs in this process, the CSR entries.
    Nothing is lost: each is rebuilt from the prepared layout when a partition is served again."""
    import sys

    static.in_edges.cache_clear()
    static.out_edges.cache_clear()
    _ARRIVAL_SOURCES.clear()
    csr = sys.modules.get("sparkgnn.dl.csr")  # only loaded where layers run in-process
    if csr is not None:
        csr.clear()


def run_partition(cfg: StepConfig, collector, timers: dict | None = None):
    """Collect one partition's rows (collector(spent, task): collect or collect_files with their
    input bound), run the DL step through the transport, scatter the results.
    `timers` (Spark accumulators, optional) sum task seconds spent receiving rows from Spark,
    building the DL tables, in the DL engine, and building the output rows: where the time goes."""
    from sparkgnn.runners import get_transport

    retain_freed_memory()  # the worker is reused: later steps reuse this step's buffers (sparkgnn.heap)
    spent: dict = {}
    task: dict = {}
    try:
        collected = collector(spent, task)
        if collected is None:
            return
        part, tables = collected
        clock = time.perf_counter()
        if cfg.dl_emit == "partials":
            out = static.out_edges(cfg.prep_dir, part)
            tables["out_edges"] = pa.table({"src": out.src, "dst": out.dst, "weight": out.w})
        header = {
            "op": "layer_step",
            "model": cfg.model,
            "layer": cfg.layer,
            "partition": part,
            "aggregate": cfg.dl_aggregate,
            "emit": cfg.dl_emit,
            "pre_transform": cfg.pre_transform,
            "next_pre_transform": cfg.next_pre_transform,
            "with_state": cfg.with_state,
            "num_foreign": len(static.out_edges(cfg.prep_dir, part).foreign_ids) if cfg.dl_emit == "partials" else 0,
        }
        spent["collect_s"] += time.perf_counter() - clock
        clock = time.perf_counter()
        _, result = get_transport(cfg.transport).call(header, tables)
        spent["dl_s"] = time.perf_counter() - clock
    except USER_ERRORS + (ValueError,) as exc:  # a messenger TransportError too
        raise StepFailed(
            f"layer step {cfg.layer + 1}/{cfg.num_layers} ({cfg.inputs} -> {cfg.outputs}) "
            f"failed in partition {task.get('partition', '?')}: {exc}"
        ) from exc
    clock = time.perf_counter()
    for batch in OUTPUTS[cfg.outputs](cfg, result, part, header):
        yield from split_batches(batch)
    if cfg.pe_dir is not None:
        write_pe_part(cfg.pe_dir, static.owned(cfg.prep_dir, part).ids, result, part)
    elif "state" in result:
        owned = static.owned(cfg.prep_dir, part)
        state = to_numpy_matrix(result["state"].column("s"))
        yield from split_batches(
            make_rows(np.asarray(cfg.keys), np.full(len(owned.ids), part), PE_STATE, owned.ids, pack_binary(state))
        )
    spent["scatter_s"] = time.perf_counter() - clock
    for name, value in spent.items():
        if timers and name in timers:
            timers[name].add(value)
    if timers and PEAK_RSS in timers:
        timers[PEAK_RSS].add(_peak_rss_bytes())
