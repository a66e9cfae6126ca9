"""The graph-engine side of one fused layer step, run inside a Spark Python task (mapInArrow).

Collect: the task receives every row routed to its partition (own vertices' h, mirrors' payloads,
partial states, ...), maps ids to the partition's local order with the static indexes, hands the
DL engine one set of tables through the transport (one Pipe round trip per partition per step),
and Scatters the results as routed rows for the next step (or as output rows after the last layer).
numpy + pyarrow only: with a messenger transport, Spark tasks never import torch.

Registries, not flags: INPUTS maps how a layer's input arrived to a table builder; OUTPUTS maps
what the next layer needs to a row builder.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkgnn.arrowvec import aligned_empty, pack_binary, to_fixed_list, to_list, to_numpy_matrix
from sparkgnn.engine import static
from sparkgnn.engine.routing import DST, EDGE, OWN, PE_STATE, SRC, STATE, make_rows, split_batches
from sparkgnn.errors import USER_ERRORS, SparkGNNError
from sparkgnn.heap import retain_freed_memory


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
    out_dir: str | None = None  # outputs "final_files": where each task writes its Parquet part

    @property
    def dl_aggregate(self) -> str:
        return INPUT_STAGE[self.inputs]

    @property
    def dl_emit(self) -> str:
        return OUTPUT_STAGE[self.outputs]


def _rows_of(table: pa.Table, kind: int) -> pa.Table:
    return table.filter(pc.equal(table.column("kind"), kind))


def _vectors(rows: pa.Table) -> np.ndarray:
    return to_numpy_matrix(rows.column("v" if "v" in rows.column_names else "x"))


def _ordered_vectors(rows: pa.Table, kind: int, sorted_ids: np.ndarray, what: str, count_error: str) -> np.ndarray:
    """The vectors of the rows of `kind`, each at its id's position in `sorted_ids`. One copy per
    row, straight out of Spark's Arrow batches: no filtered table, no combined chunks (at 8M edges
    those were two more copies of every payload, and fresh memory costs ~2 s/GiB to touch here).
    Every id must be known and arrive exactly once (`count_error` names a count mismatch)."""
    column = "v" if "v" in rows.column_names else "x"
    picked = []
    for batch in rows.to_batches():
        mask = batch.column("kind").to_numpy() == kind
        if mask.any():
            picked.append((batch, mask))
    received = sum(int(mask.sum()) for _, mask in picked)
    if received != len(sorted_ids):
        raise ValueError(count_error.format(expected=len(sorted_ids), received=received))
    if not received:
        return np.zeros((0, 0), np.float32)
    out = None
    seen = np.zeros(len(sorted_ids), dtype=bool)
    for batch, mask in picked:
        # Rows of other kinds in the same batch may be of another width: unpack only this kind's
        # (a batch-sized temporary, reused by the allocator batch after batch).
        vectors = batch.column(column) if mask.all() else batch.column(column).filter(pa.array(mask))
        values = to_numpy_matrix(vectors)
        if out is None:
            out = aligned_empty((len(sorted_ids), values.shape[1]), np.float32)
        elif values.shape[1] != out.shape[1]:
            raise ValueError(f"{what} vectors differ in width ({out.shape[1]} and {values.shape[1]})")
        pos = static.positions(sorted_ids, batch.column("id").to_numpy()[mask], what)
        out[pos] = values
        seen[pos] = True
    if out is None or not seen.all():  # as many rows as ids, so one arrived twice and another never
        raise ValueError(f"received duplicate {what} rows for some vertices")
    return out


def _own_table(rows: pa.Table, owned: static.Owned, part: int) -> pa.Table:
    h = _ordered_vectors(
        rows,
        OWN,
        owned.ids,
        "own",
        f"partition {part} owns {{expected}} vertices but received {{received}} own rows "
        "(a vertex is missing or duplicated upstream)",
    )
    columns = {"h": to_fixed_list(h)}
    columns.update({name: pa.array(values) for name, values in owned.stats.items()})
    return pa.table(columns)


def _payloads_in_order(rows: pa.Table, kind: int, sorted_ids: np.ndarray, what: str) -> np.ndarray:
    return _ordered_vectors(rows, kind, sorted_ids, what, f"expected {{expected}} {what} rows, received {{received}}")


# ---- inputs: routed rows -> DL tables ------------------------------------------------------------


def inputs_first(cfg, rows, part):
    return {"own": _own_table(rows, static.owned(cfg.prep_dir, part), part)}


def inputs_edges_static(cfg, rows, part):
    edges = static.in_edges(cfg.prep_dir, part)
    mirror = _payloads_in_order(rows, SRC, edges.mirror_ids, "mirror payload")
    return {
        "own": _own_table(rows, static.owned(cfg.prep_dir, part), part),
        "mirror": pa.table({"p": to_fixed_list(mirror) if len(mirror) else pa.array([], pa.list_(pa.float32(), 1))}),
        "edges": pa.table({"src": edges.src, "dst": edges.dst, "weight": edges.w}),
    }


def inputs_edges_rows(cfg, rows, part):
    owned = static.owned(cfg.prep_dir, part)
    edge_rows = _rows_of(rows, EDGE)
    src_ids = edge_rows.column("id").to_numpy()
    dst_ids = edge_rows.column("aux").to_numpy()
    dst = static.positions(owned.ids, dst_ids, "edge dst")
    src = len(owned.ids) + np.arange(len(src_ids), dtype=np.int64)
    loops = src_ids == dst_ids  # a self loop's source is the own vertex itself (self-loop policies rely on it)
    src[loops] = dst[loops]
    mirror = _vectors(edge_rows) if edge_rows.num_rows else None
    tables = {
        "own": _own_table(rows, owned, part),
        "edges": pa.table({"src": src, "dst": dst.astype(np.int64), "weight": edge_rows.column("w").to_numpy()}),
    }
    if mirror is not None:
        tables["mirror"] = pa.table({"p": to_fixed_list(mirror)})
    return tables


def inputs_states(cfg, rows, part):
    owned = static.owned(cfg.prep_dir, part)
    state_rows = _rows_of(rows, STATE)
    seg = static.positions(owned.ids, state_rows.column("id").to_numpy(), "partial-state dst")
    states = _vectors(state_rows) if state_rows.num_rows else None
    table = {"seg": pa.array(seg.astype(np.int64))}
    if states is not None:
        table["s"] = to_fixed_list(states)
    else:
        table["s"] = pa.array([], pa.list_(pa.float32(), 1))
    return {"own": _own_table(rows, owned, part), "states": pa.table(table)}


def inputs_given(cfg, rows, part):
    """Second step of a combine layer with attention: own rows carry h^(l); DST rows carry the
    destination payloads of foreign destinations of this partition's out-edges."""
    out = static.out_edges(cfg.prep_dir, part)
    foreign = _payloads_in_order(rows, DST, out.foreign_ids, "foreign destination payload")
    tables = {"own": _own_table(rows, static.owned(cfg.prep_dir, part), part)}
    if len(foreign):
        tables["foreign_dst"] = pa.table({"d": to_fixed_list(foreign)})
    return tables


INPUTS = {
    "first": inputs_first,
    "resume": inputs_first,
    "edges_static": inputs_edges_static,
    "edges_rows": inputs_edges_rows,
    "states": inputs_states,
    "given": inputs_given,
}
INPUT_STAGE = {
    "first": "none",
    "resume": "given",
    "edges_static": "edges",
    "edges_rows": "edges",
    "states": "states",
    "given": "given",
}


# ---- outputs: DL tables -> routed rows ------------------------------------------------------------


def _own_rows(cfg, result, owned, part):
    h = to_numpy_matrix(result["own"].column("h"))
    return make_rows(np.asarray(cfg.keys), np.full(len(owned.ids), part), OWN, owned.ids, pack_binary(h))


def _output_batch(cfg, result, part) -> pa.RecordBatch:
    owned = static.owned(cfg.prep_dir, part)
    own = result["own"]
    columns = [pa.array(owned.ids), to_list(to_numpy_matrix(own.column("h")))]
    names = ["id", "h"]
    if cfg.with_pred:
        columns.append(pc.cast(own.column("pred"), pa.int64()).combine_chunks())
        names.append("pred")
    return pa.RecordBatch.from_arrays(columns, names=names)


def outputs_final(cfg, result, part, header):
    yield _output_batch(cfg, result, part)


def outputs_final_files(cfg, result, part, header):
    """The output rows written by the task itself as one Parquet file, `part-<p>.parquet`, in
    cfg.out_dir (the job's staging directory); Spark gets one row per partition (pt, rows, bytes).
    Why: handing 128 floats per row back to the JVM as array<float> and letting Spark's Parquet
    writer encode them was the slowest phase of the last layer at 8M edges (10-16 task s); pyarrow
    writes the same file from the buffers the DL step returned. The file is written under a hidden
    temporary name and renamed, so a retried or speculative attempt replaces it whole and readers
    (Spark and pyarrow skip dot files) never see a partial part."""
    import uuid

    import pyarrow.parquet as pq

    from sparkgnn.files import filesystem

    batch = _output_batch(cfg, result, part)
    fs, directory = filesystem(cfg.out_dir)
    name = f"part-{part:05d}.parquet"
    temporary = f"{directory}/.{name}.tmp-{uuid.uuid4().hex}"
    with fs.open_output_stream(temporary) as sink:
        pq.write_table(pa.Table.from_batches([batch]), sink, compression="snappy")
    fs.move(temporary, f"{directory}/{name}")
    size = fs.get_file_info(f"{directory}/{name}").size
    yield pa.RecordBatch.from_arrays(
        [pa.array([part], pa.int32()), pa.array([batch.num_rows], pa.int64()), pa.array([size], pa.int64())],
        names=["pt", "rows", "bytes"],
    )


def _own_and_targeted(cfg, result, part, targets_table: str, kind: int, payload_column):
    """h to self, and each own vertex's payload once to every partition its routing table names."""
    owned = static.owned(cfg.prep_dir, part)
    yield _own_rows(cfg, result, owned, part)
    targets = static.targets(cfg.prep_dir, targets_table, part)
    payload = to_numpy_matrix(payload_column)
    yield make_rows(
        np.asarray(cfg.keys), targets.part, kind, owned.ids[targets.local], pack_binary(payload[targets.local])
    )


def outputs_mirrors(cfg, result, part, header):
    """replicate: h to self, the next layer's source payload to every other partition holding an
    out-edge of the vertex (vertex-cut mirrors)."""
    yield from _own_and_targeted(cfg, result, part, "out_targets", SRC, result["src"].column("p"))


def outputs_edge_payloads(cfg, result, part, header):
    """edge_join: h to self; the source payload of every own vertex unrouted (pt = -1): Spark joins it
    onto the edges by src and routes one row per edge to the dst's partition."""
    owned = static.owned(cfg.prep_dir, part)
    yield _own_rows(cfg, result, owned, part)
    payload = to_numpy_matrix(result["src"].column("p"))
    yield make_rows(np.asarray(cfg.keys), np.full(len(owned.ids), -1), SRC, owned.ids, pack_binary(payload))


def outputs_partials(cfg, result, part, header):
    """combine: h to self, one partial state per distinct destination of this partition's out-edges,
    routed to the destination's owner."""
    owned = static.owned(cfg.prep_dir, part)
    yield _own_rows(cfg, result, owned, part)
    out = static.out_edges(cfg.prep_dir, part)
    partials = result["partials"]
    row = partials.column("row").to_numpy()
    if not len(row):
        return
    n_own = len(owned.ids)
    is_own = row < n_own
    foreign = row[~is_own] - n_own
    ids = np.empty(len(row), dtype=np.int64)
    pts = np.empty(len(row), dtype=np.int32)
    ids[is_own], pts[is_own] = owned.ids[row[is_own]], part
    ids[~is_own], pts[~is_own] = out.foreign_ids[foreign], out.foreign_part[foreign]
    yield make_rows(np.asarray(cfg.keys), pts, STATE, ids, pack_binary(to_numpy_matrix(partials.column("s"))))


def outputs_dst_payloads(cfg, result, part, header):
    """combine with attention, first half: h to self, destination payloads to the partitions holding
    in-edges of own vertices."""
    yield from _own_and_targeted(cfg, result, part, "in_targets", DST, result["dst"].column("d"))


def outputs_own_only(cfg, result, part, header):
    """Last step of a PE precomputation: h^(k) as routed own rows (no output schema, no routing)."""
    yield _own_rows(cfg, result, static.owned(cfg.prep_dir, part), part)


OUTPUTS = {
    "final": outputs_final,
    "final_files": outputs_final_files,
    "own_only": outputs_own_only,
    "mirrors": outputs_mirrors,
    "edge_payloads": outputs_edge_payloads,
    "partials": outputs_partials,
    "dst_payloads": outputs_dst_payloads,
}
OUTPUT_STAGE = {
    "final": "none",
    "final_files": "none",
    "own_only": "none",
    "mirrors": "src",
    "edge_payloads": "src",
    "partials": "partials",
    "dst_payloads": "dst",
}


# ---- the mapInArrow function ----------------------------------------------------------------------


def _partition_of(rows: pa.Table) -> int:
    parts = pc.unique(rows.column("pt")).to_numpy()
    if len(parts) != 1:
        raise StepFailed(
            f"rows of several partitions {parts[:5].tolist()} reached one task; is adaptive coalescing on?"
        )
    return int(parts[0])


TIMERS = ("rows_in_s", "collect_s", "dl_s", "scatter_s")
# A max-accumulator (engine.metrics.MaxParam): the largest peak RSS of a Python worker after a task.
PEAK_RSS = "peak_rss_bytes"


def _peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB). The Python worker is reused
    across tasks, so it bounds the peak of every task it ran, this one included."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def run_partition(cfg: StepConfig, batches, timers: dict | None = None):
    """Collect one partition's rows, run the DL step through the transport, scatter the results.
    `timers` (Spark accumulators, optional) sum task seconds spent receiving rows from Spark,
    building the DL tables, in the DL engine, and building the output rows: where the time goes."""
    from sparkgnn.runners import get_transport

    retain_freed_memory()  # the worker is reused: later steps reuse this step's buffers (sparkgnn.heap)
    clock = time.perf_counter()
    batches = [b for b in batches if b.num_rows]
    if not batches:
        return
    rows = pa.Table.from_batches(batches)
    spent = {"rows_in_s": time.perf_counter() - clock}
    clock = time.perf_counter()
    part = _partition_of(rows)
    try:
        tables = INPUTS[cfg.inputs](cfg, rows, part)
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
        spent["collect_s"] = time.perf_counter() - clock
        clock = time.perf_counter()
        _, result = get_transport(cfg.transport).call(header, tables)
        spent["dl_s"] = time.perf_counter() - clock
    except USER_ERRORS + (ValueError,) as exc:  # a messenger TransportError too
        raise StepFailed(
            f"layer step {cfg.layer + 1}/{cfg.num_layers} ({cfg.inputs} -> {cfg.outputs}) "
            f"failed in partition {part}: {exc}"
        ) from exc
    clock = time.perf_counter()
    for batch in OUTPUTS[cfg.outputs](cfg, result, part, header):
        yield from split_batches(batch)
    if "state" in result:
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
