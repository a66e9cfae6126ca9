"""The graph's out-degree histogram, computed once per graph with Spark and kept in the work dir.

Why: the planner's memory rule needs the distinct sources a task's in-edges reach
(planner.partitions.expected_sources); on a power-law graph the simple bound min(edges, |V|)
overstates them and raises P, and with it the replication factor and the bytes every layer
shuffles. The histogram (how many vertices have out-degree k) is a few thousand numbers for any
graph size. It is only computed when the bound would raise P above the cores: below that, P is
the core count either way.

Cached at <work>/prep/<graph fingerprint>/out_degrees.json (the fingerprint covers the edges, so a
changed graph has another file); written atomically (files.write_json_atomic), and a file that does
not parse is recomputed.
"""

from __future__ import annotations

from sparkgnn import files

FILE = "out_degrees.json"


def out_degree_histogram(graph, work_dir: str, log=print) -> dict[int, int]:
    """{out-degree k > 0: number of vertices with k out-edges}."""
    path = files.join(work_dir, "prep", str(graph.fingerprint), FILE)
    try:
        return {int(k): int(v) for k, v in files.read_json(path)["out_degrees"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    rows = graph.edges.groupBy("src").count().groupBy("count").count().collect()
    histogram = {int(r[0]): int(r[1]) for r in rows}
    files.write_json_atomic(path, {"fingerprint": str(graph.fingerprint), "out_degrees": histogram})
    log(
        f"sparkgnn: out-degree histogram of {sum(histogram.values()):,} source vertices computed for the partition rule"
    )
    return histogram
