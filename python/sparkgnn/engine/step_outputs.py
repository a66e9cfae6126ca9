"""The scatter half of a layer step: the DL engine's result tables -> routed rows for the next step
(or the job's output rows / Parquet parts after the last layer), in slices.

A registry, not flags: OUTPUTS maps what the next layer needs (a step's `outputs` key, chosen by
engine.schedule) to a row builder; OUTPUT_STAGE names the DL emit stage that produces its tables.
Split out of engine/steps.py, which keeps collecting rows and running the step.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkgnn.arrowvec import pack_binary, to_list, to_numpy_matrix
from sparkgnn.engine import exchange, static
from sparkgnn.engine.routing import DST, OWN, SRC, STATE, make_rows

# Rows per routed output batch: Spark converts Arrow batches to rows batch by batch, and a payload
# gathered slice by slice never exists whole (a full gather of every targeted payload was one more
# copy of all own vectors at the step's peak).
OUTPUT_BATCH_ROWS = 32768


def _routed_slices(cfg, pt: np.ndarray, kind: int, ids: np.ndarray, vectors: np.ndarray, rows=None):
    """Routed rows of `kind` for ids (vectors[rows] when `rows` is given, else vectors), in slices."""
    keys = np.asarray(cfg.keys)
    for start in range(0, len(ids), OUTPUT_BATCH_ROWS):
        window = slice(start, start + OUTPUT_BATCH_ROWS)
        values = vectors[window] if rows is None else vectors[rows[window]]
        yield make_rows(keys, pt[window], kind, ids[window], pack_binary(values))


def _own_rows(cfg, result, owned, part):
    h = to_numpy_matrix(result["own"].column("h"))
    yield from _routed_slices(cfg, np.full(len(owned.ids), part, dtype=np.int32), OWN, owned.ids, h)


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
    batch = _output_batch(cfg, result, part)
    size = _write_part(cfg.out_dir, part, pa.Table.from_batches([batch]))
    yield exchange.summary_row(part, batch.num_rows, size)


def _write_part(out_dir: str, part: int, table: pa.Table) -> int:
    """`table` as `part-<p>.parquet` in `out_dir`, written under a hidden temporary name and
    renamed (a retried attempt replaces the file whole; readers skip dot files); returns its bytes.
    The vector columns plain, the others snappy as Spark writes (arrowvec.parquet_options)."""
    import uuid

    import pyarrow.parquet as pq

    from sparkgnn.arrowvec import parquet_options
    from sparkgnn.files import filesystem

    fs, directory = filesystem(out_dir)
    name = f"part-{part:05d}.parquet"
    temporary = f"{directory}/.{name}.tmp-{uuid.uuid4().hex}"
    with fs.open_output_stream(temporary) as sink:
        pq.write_table(table, sink, **parquet_options(table.schema, unique=("id",)))
    fs.move(temporary, f"{directory}/{name}")
    return int(fs.get_file_info(f"{directory}/{name}").size)


def write_pe_part(pe_dir: str, ids: np.ndarray, result: dict, part: int) -> int:
    """PE precompute: this partition's rows of the layer the step completed -- id, h and, when
    the DL step returned them, the merged states -- as one Parquet file in the PE store's attempt
    folder `pe_dir` (pe.writer.PEWriter.stage_layer), sorted by id, in the store's format (id
    long, h array<float>[, state array<float>]). Why: handing every vector back to Spark to be
    paired and written by a separate commit job cost as much as the layer; the task already holds
    them. Returns the rows written."""
    order = np.argsort(ids, kind="stable")
    columns = {"id": pa.array(np.asarray(ids, dtype=np.int64)[order])}
    columns["h"] = to_list(to_numpy_matrix(result["own"].column("h"))[order])
    if "state" in result:
        columns["state"] = to_list(to_numpy_matrix(result["state"].column("s"))[order])
    _write_part(pe_dir, part, pa.table(columns))
    return len(order)


def _own_and_targeted(cfg, result, part, targets_table: str, kind: int, payload_column):
    """h to self, and each own vertex's payload once to every partition its routing table names."""
    owned = static.owned(cfg.prep_dir, part)
    yield from _own_rows(cfg, result, owned, part)
    targets = static.targets(cfg.prep_dir, targets_table, part)
    yield from _routed_slices(
        cfg, targets.part, kind, owned.ids[targets.local], to_numpy_matrix(payload_column), targets.local
    )


def outputs_mirrors(cfg, result, part, header):
    """replicate: h to self, the next layer's source payload to every other partition holding an
    out-edge of the vertex (vertex-cut mirrors)."""
    yield from _own_and_targeted(cfg, result, part, "out_targets", SRC, result["src"].column("p"))


def outputs_edge_payloads(cfg, result, part, header):
    """edge_join: h to self; the source payload of every own vertex unrouted (pt = -1): Spark joins it
    onto the edges by src and routes one row per edge to the dst's partition."""
    owned = static.owned(cfg.prep_dir, part)
    yield from _own_rows(cfg, result, owned, part)
    payload = to_numpy_matrix(result["src"].column("p"))
    yield from _routed_slices(cfg, np.full(len(owned.ids), -1, dtype=np.int32), SRC, owned.ids, payload)


def outputs_partials(cfg, result, part, header):
    """combine: h to self, one partial state per distinct destination of this partition's out-edges,
    routed to the destination's owner."""
    owned = static.owned(cfg.prep_dir, part)
    yield from _own_rows(cfg, result, owned, part)
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
    """Last step of a PE precomputation: h^(k) as routed own rows (no output schema, no routing);
    nothing when the task writes the layer's rows into the store itself (cfg.pe_dir)."""
    if cfg.pe_dir is None:
        yield from _own_rows(cfg, result, static.owned(cfg.prep_dir, part), part)


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
