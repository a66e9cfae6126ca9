"""graph.facts_cache: a directory another tool wrote is validated and fingerprinted once per work
dir, while its data stamp still matches."""

import json
import os

from _graph_helpers import write_raw

from sparkgnn.graph import facts_cache

FACTS = {"fingerprint": "0" * 32, "num_vertices": 4, "num_edges": 3, "feature_dim": 2, "num_classes": 0}


def test_recorded_facts_come_back_only_for_the_same_path_and_stamp(tmp_path):
    work = str(tmp_path / "work")
    assert facts_cache.remember(work, "/data/g", "stamp-1", {**FACTS, "has_weight": False})
    assert facts_cache.recall(work, "/data/g", "stamp-1") == {**FACTS, "validated": True}
    assert facts_cache.recall(work, "/data/g", "stamp-2") is None  # the files changed
    assert facts_cache.recall(work, "/data/other", "stamp-1") is None
    assert facts_cache.recall(work, "/data/g", None) is None
    assert not facts_cache.remember(work, "/data/g", None, FACTS)


def test_a_damaged_record_is_ignored(tmp_path, caplog):
    work = str(tmp_path / "work")
    facts_cache.remember(work, "/data/g", "s", FACTS)
    (record,) = (tmp_path / "work" / facts_cache.FOLDER).iterdir()
    doc = json.loads(record.read_text())
    for facts in ({**FACTS, "fingerprint": "../../etc"}, {**FACTS, "num_edges": -1}, {"num_vertices": 4}):
        record.write_text(json.dumps({**doc, "facts": facts}))
        assert facts_cache.recall(work, "/data/g", "s") is None
    record.write_text("{not json")
    assert facts_cache.recall(work, "/data/g", "s") is None


def test_a_second_job_adopts_the_facts_without_validating_or_fingerprinting_again(spark, tmp_path):
    from sparkgnn.engine.api import coerce_graph

    path = write_raw(
        tmp_path / "g",
        {"id": [1, 2, 3, 4], "x": [[1.0, 2.0]] * 4, "y": [0, 2, 1, 0]},
        {"src": [1, 2, 3], "dst": [2, 3, 4]},
    )
    work = str(tmp_path / "work")
    sc = spark.sparkContext

    def jobs_of(group: str, fn):
        sc.setJobGroup(group, group)
        try:
            return fn(), len(sc.statusTracker().getJobIdsForGroup(group))
        finally:
            sc.setJobGroup("", "")

    def open_and_fingerprint():
        graph = coerce_graph(spark, path, work_dir=work)
        return graph, graph.fingerprint, graph.stats()

    from sparkgnn.graph import Graph

    _, opening = jobs_of("open", lambda: Graph.load(spark, path, validate=False))  # Spark reads the schemas
    (first, fingerprint, stats), jobs = jobs_of("first", open_and_fingerprint)
    assert jobs >= opening + 4  # validation (vertices, edges) and the fingerprint's two passes
    assert stats["num_vertices"] == 4 and stats["num_edges"] == 3 and stats["num_classes"] == 3
    assert first.remember_facts(work)
    (second, again, stats_again), jobs = jobs_of("second", open_and_fingerprint)
    assert jobs == opening and again == fingerprint and stats_again == stats
    # changed files: a new stamp, so the graph is validated and fingerprinted again
    write_raw(tmp_path / "g", {"id": [1, 2, 3, 4], "x": [[1.0, 3.0]] * 4}, {"src": [1, 2], "dst": [2, 3]})
    os.utime(os.path.join(path, "edges", "part-00000.parquet"), ns=(1, 1))
    (third, changed, _), jobs = jobs_of("third", open_and_fingerprint)
    assert jobs >= opening + 4 and changed != fingerprint
