"""A CGP partition task as messenger frames: JSON header + Arrow tables, never pickle.

WHY a codec of its own: `cgp_worker.partition_task(p, cfg, job)` takes and returns dicts of numpy
arrays (1-D index/flag/statistic columns, 2-D value matrices), nested one level (statistics by
name) or in lists (partial states per message kind), plus a few scalars. The messenger carries a
header dict and named Arrow tables; this maps one onto the other, losslessly (dtype and shape are
kept in a JSON manifest), so a serving partition can run in a `sparkgnn-worker` process exactly
as it runs in a Spark task.

The header names the deployment (graph, model, PE store version) by id, never by path: a worker
runs partitions only of deployments it was started with (serving.served); the partition count
and whether states are read are the only other settings, checked here.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pyarrow as pa

META = "__meta__"
OP = "serving_partials"
MAX_PARTS = 1 << 16


def _flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out[key] = {"kind": "dict", "keys": list(v)}
            out.update(_flatten(v, key + "."))
        elif isinstance(v, list):
            out[key] = {"kind": "list", "n": len(v)}
            out.update(_flatten({str(i): x for i, x in enumerate(v)}, key + "."))
        else:
            out[key] = v
    return out


def pack(d: dict) -> tuple[dict, dict]:
    """dict -> (JSON-able manifest, {name: pa.Table}); arrays go to tables, the rest to JSON."""
    manifest, tables = {}, {}
    for key, v in _flatten(d).items():
        if isinstance(v, dict) and v.get("kind") in ("dict", "list"):
            manifest[key] = v
        elif isinstance(v, np.ndarray):
            a = np.ascontiguousarray(v)
            manifest[key] = {"kind": "array", "dtype": a.dtype.str, "shape": list(a.shape)}
            flat = a.reshape(-1)
            if a.dtype == np.bool_:
                flat = flat.astype(np.uint8)
            tables[key] = pa.table({"v": pa.array(flat)})
        elif v is None or isinstance(v, (bool, int, float, str)):
            manifest[key] = {"kind": "json", "value": v}
        elif isinstance(v, (np.integer, np.floating)):
            manifest[key] = {"kind": "json", "value": v.item()}
        else:
            raise TypeError(f"cannot send {key!r} of type {type(v).__name__}")
    return manifest, tables


def unpack(manifest: dict, tables: dict) -> dict:
    values = {}
    for key, spec in manifest.items():
        kind = spec["kind"]
        if kind == "array":
            col = tables[key].column("v")
            flat = (
                col.to_numpy(zero_copy_only=False)
                if col.num_chunks != 1
                else col.chunk(0).to_numpy(zero_copy_only=False)
            )
            dtype = np.dtype(spec["dtype"])
            a = flat.astype(np.uint8 if dtype == np.bool_ else dtype, copy=False)
            a = a.astype(np.bool_) if dtype == np.bool_ else a
            values[key] = np.require(a, requirements="W").reshape(spec["shape"])  # torch wants writable
        elif kind == "json":
            values[key] = spec["value"]
    return _rebuild(manifest, values, "")


def _rebuild(manifest: dict, values: dict, prefix: str) -> dict:
    out: dict[str, object] = {}
    for key, spec in manifest.items():
        if not key.startswith(prefix) or "." in key[len(prefix) :]:
            continue
        name = key[len(prefix) :]
        if spec["kind"] == "dict":
            out[name] = _rebuild(manifest, values, key + ".")
        elif spec["kind"] == "list":
            inner = _rebuild(manifest, values, key + ".")
            out[name] = [inner[str(i)] for i in range(spec["n"])]
        else:
            out[name] = values[key]
    return out


def request_frames(p: int, deployment: str, parts: int, states: bool, job: dict) -> tuple[dict, dict]:
    """The header and tables of partition `p` of `parts` of a job on the deployment with id
    `deployment` (served.deployment_id of its spec)."""
    manifest, tables = pack(job)
    header = {
        "op": OP,
        "partition": int(p),
        "deployment": deployment,
        "parts": int(parts),
        "states": bool(states),
        "job": manifest,
    }
    return header, tables


def worker_cfg(header: dict) -> tuple[int, dict]:
    """(partition, the cfg cgp_worker.partition_task takes) of a request header: its paths from
    the spec this worker serves under the header's deployment id; UnknownDeployment for a header
    that names paths or an id not served here, ValueError for a bad partition or count."""
    from sparkgnn.serving import served

    served.check_header(header)
    key = served.check_id(header.get("deployment"))
    parts, p, states = header.get("parts"), header.get("partition"), header.get("states")
    if isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= MAX_PARTS:
        raise ValueError(f"task header 'parts' must be an integer in 1..{MAX_PARTS}, got {parts!r}")
    if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < parts:
        raise ValueError(f"task header 'partition' must be an integer in 0..{parts - 1}, got {p!r}")
    if not isinstance(states, bool):
        raise ValueError(f"task header 'states' must be true or false, got {states!r}")
    spec = served.lookup(key)
    if not spec.get("store"):
        raise served.UnknownDeployment(f"deployment {key[:12]} has no PE store: it serves no CGP partitions")
    cfg = {"store_base": spec["store"], "graph_dir": spec["graph"], "model_path": spec["model"]}
    return p, dict(cfg, parts=parts, states=states)


def handle(header: dict, tables: dict) -> dict:
    """The worker side (a messenger handler op): run the partition, return tables."""
    from sparkgnn.serving.cgp_worker import partition_task

    p, cfg = worker_cfg(header)
    if not isinstance(header.get("job"), dict):
        raise ValueError("task header 'job' must be an object (the job's manifest)")
    job = unpack(header["job"], tables)
    result = partition_task(p, cfg, job)
    manifest, out = pack(result)
    out[META] = pa.table({"v": pa.array([json.dumps(manifest)])})
    return out


def result_from_tables(tables: dict) -> dict:
    manifest = json.loads(tables[META].column("v")[0].as_py())
    return unpack(manifest, tables)


def to_bytes(d: dict) -> bytes:
    """One self-describing blob of a partition's result (Spark tasks return it in a binary
    column, spark_compat.run_tasks): an 8-byte header length, the JSON header (manifest and each
    table's name and size), then each table as an Arrow IPC stream. Never pickle."""
    manifest, tables = pack(d)
    blobs = []
    for name, table in tables.items():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        blobs.append((name, sink.getvalue().to_pybytes()))
    header = json.dumps({"manifest": manifest, "tables": [[name, len(blob)] for name, blob in blobs]}).encode()
    return struct.pack("<Q", len(header)) + header + b"".join(blob for _, blob in blobs)


def from_bytes(data: bytes) -> dict:
    (size,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8 : 8 + size].decode())
    tables, offset = {}, 8 + size
    for name, length in header["tables"]:
        tables[name] = pa.ipc.open_stream(pa.py_buffer(data[offset : offset + length])).read_all()
        offset += length
    if offset != len(data):
        raise ValueError(f"a partition result blob holds {len(data) - offset} bytes past its tables")
    return unpack(header["manifest"], tables)
