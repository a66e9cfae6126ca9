"""Size report: what the PEs cost next to the graph they summarise (OMEGA section 8.4).

OMEGA sizes PEs as (L-1) x H x D bytes per node (D = 4 for float32): every layer but the last is
stored (the last is the model output, recomputed for queries). With per-layer widths that differ
this generalises to sum_{l<L} dims[l] x 4 x |V|, which is what `omega_formula_bytes` reports.
Measured bytes come from the Parquet footers (compressed column-chunk sizes), split into the `h`
and `state` columns, plus raw (uncompressed float32) bytes = rows x width x 4.
"""

from __future__ import annotations

from sparkgnn import files
from sparkgnn.pe import layout


def _column_bytes(base: str, manifest: dict, key: str) -> dict:
    """Compressed bytes per top-level column over the committed Parquet files of `key` (footers only)."""
    import pyarrow.parquet as pq

    listed = layout.committed_files(base, manifest, key)
    if listed is None:
        folder = layout.committed_dir(base, manifest, key)
        listed = [files.join(folder, f.rel) for f in files.data_files(folder)]
    out: dict = {}
    for path in sorted(p for p in listed if p.endswith(".parquet")):
        fs, inner = files.filesystem(path)
        with fs.open_input_file(inner) as handle:
            meta = pq.ParquetFile(handle).metadata
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            for c in range(group.num_columns):
                col = group.column(c)
                top = col.path_in_schema.split(".")[0]
                out[top] = out.get(top, 0) + int(col.total_compressed_size)
    return out


def size_report(base: str, manifest: dict) -> dict:
    dims, state_dims = manifest["dims"], manifest.get("state_dims") or []
    graph = manifest.get("graph") or {}
    n = graph.get("num_vertices")
    pe_bytes, state_bytes, pe_raw, state_raw = {}, {}, {}, {}
    for l in sorted(int(x) for x in manifest["layers_complete"]):
        cols = _column_bytes(base, manifest, layout.layer_key(l))
        rows = int(manifest.get("rows", {}).get(str(l), n or 0))
        pe_bytes[str(l)] = cols.get("h", 0)
        pe_raw[str(l)] = rows * dims[l - 1] * 4
        if state_dims and state_dims[l - 1] is not None:
            state_bytes[str(l)] = cols.get("state", 0)
            state_raw[str(l)] = rows * state_dims[l - 1] * 4
    return {
        "pe_bytes": pe_bytes,
        "state_bytes": state_bytes,
        "pe_raw_bytes": pe_raw,
        "state_raw_bytes": state_raw,
        "store_bytes": layout.dir_bytes(base),
        "graph_feature_bytes": (n * graph["feature_dim"] * 4) if n is not None and "feature_dim" in graph else None,
        "omega_formula_bytes": (sum(dims[:-1]) * 4 * n) if n is not None else None,
        "num_vertices": n,
    }
