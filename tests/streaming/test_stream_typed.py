"""The streaming job on a typed graph: the handler answers typed request files with ONE
TypedQueryEngine (any typed mode), each row equal to TypedQueryEngine.answer with the queries'
node types in `qtype`; an unknown type, relation or endpoint is an error row of one line, a
malformed or homogeneous file a dead letter; the job detects a typed graph and refuses what
typed serving does not offer before Spark starts; one in-process run on Spark."""

import io
import os
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from sparkgnn.deadletter import DeadLetter, read_dead_letters
from sparkgnn.graph.typed_io import write_typed_graph_dir
from sparkgnn.pe.local import precompute_local
from sparkgnn.serving import Request
from sparkgnn.serving.request import requests_table
from sparkgnn.serving.typed import TypedQueryEngine, TypedRequest
from sparkgnn.serving.typed_request import typed_requests_table, write_typed_requests
from sparkgnn.streaming.grouping import get_grouping
from sparkgnn.streaming.handler import MicroBatchHandler
from sparkgnn.streaming.intake import IncomingFile
from sparkgnn.streaming.job import StreamConfig, StreamStartError, build_engine, run
from sparkgnn.streaming.sink import AnswerSink, read_answers

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pe"))
from typed_testkit import IDS, pyg_data, to_hetero_sage, typed_graph  # noqa: E402

WRITES, CITES = ("author", "writes", "paper"), ("paper", "cites", "paper")
TOPIC, TOPIC_OF = ("paper", "has_topic", "field"), ("field", "topic_of", "paper")
P = IDS["paper"]


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    """(root with graph/, model/, store/; G; {mode: engine})."""
    root = tmp_path_factory.mktemp("typed_stream")
    d = pyg_data()
    graph = typed_graph(d)
    _, model = to_hetero_sage(d, layers=2)
    write_typed_graph_dir(graph, str(root / "graph"))
    model.save(str(root / "model"))
    store = precompute_local(graph, model, str(root / "store"))
    engines = {
        "full": TypedQueryEngine(graph, model),
        "exact": TypedQueryEngine(graph, model, mode="exact", store=store),
    }
    return root, graph, engines


def requests():
    rng = np.random.default_rng(1)
    mixed = TypedRequest(
        nodes={
            "paper": ([1000, 1001], rng.standard_normal((2, 6)).astype(np.float32)),
            "author": ([100], rng.standard_normal((1, 4)).astype(np.float32)),
            "field": ([9], None),  # no features in G
        },
        edges={
            WRITES: ([100, 2], [1000, 1001]),
            CITES: ([1000, P[3]], [P[2], 1001]),
            TOPIC: ([1001], [9]),
            TOPIC_OF: ([1], [1000]),
        },
        request_id="mixed",
    )
    single = TypedRequest(
        {"paper": ([2000], rng.standard_normal((1, 6)).astype(np.float32))},
        {CITES: ([P[0]], [2000])},
        request_id="single",
    )
    return [mixed, single]


def invalid():
    """Requests that parse but are invalid for G -> the words of their error row."""
    x = np.ones((1, 6), np.float32)
    return {
        "node type 'venue' is unknown (node types: paper, author, field)": TypedRequest(
            {"venue": ([1], None), "paper": ([3000], x)}, request_id="bad-type"
        ),
        "relation ('paper', 'likes', 'paper') is unknown": TypedRequest(
            {"paper": ([3001], x)}, {("paper", "likes", "paper"): ([3001], [P[0]])}, request_id="bad-relation"
        ),
        "endpoints [77] are neither queries nor 'author' vertices": TypedRequest(
            {"paper": ([3002], x)}, {WRITES: ([77], [3002])}, request_id="bad-endpoint"
        ),
    }


def as_file_bytes(table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def typed_file(reqs, name, arrival):
    return IncomingFile(f"file:/in/{name}", arrival, as_file_bytes(typed_requests_table(reqs)))


def assert_rows_equal_typed_answers(table, expected: dict) -> None:
    """Each request id once, without error, with TypedQueryEngine's answer per query (qid order)."""
    rows = {r["request_id"]: r for r in table.to_pylist()}
    for rid, (request, answer) in expected.items():
        row = rows[rid]
        assert row["error"] is None, (rid, row["error"])
        assert row["qid"] == request.qid.tolist() and row["qtype"] == request.qtype
        seen: dict = {}
        for i, t in enumerate(row["qtype"]):
            k = seen[t] = seen.get(t, -1) + 1
            if t not in answer.h:
                assert row["h"][i] is None and (row["pred"] is None or row["pred"][i] is None)
                continue
            np.testing.assert_array_equal(np.array(row["h"][i], np.float32), answer.h[t][k].numpy())
            assert row["pred"][i] == int(answer.pred[t][k])


@pytest.mark.parametrize("mode", ["full", "exact"])
def test_typed_micro_batch_answers_equal_the_typed_engine(tmp_path, typed, mode):
    _, graph, engines = typed
    engine = engines[mode]
    bad = invalid()
    files = [
        typed_file(requests(), "good.parquet", 10.0),
        typed_file(list(bad.values()), "bad.parquet", 11.0),
        IncomingFile(
            "file:/in/flat.parquet",
            12.0,
            as_file_bytes(requests_table([Request("flat", [5000], np.ones((1, 6)), [], [])])),
        ),
    ]
    handler = MicroBatchHandler(
        engine, graph, get_grouping("degree"), AnswerSink(str(tmp_path / "out")), DeadLetter(str(tmp_path / "dead"))
    )
    progress = handler.handle(files, 0)

    t = read_answers(str(tmp_path / "out"))
    expected = {r.request_id: (r, engine.answer(r)) for r in requests()}
    assert_rows_equal_typed_answers(t, expected)
    if mode == "exact":  # and EXACT's rows equal FULL's answers
        full = engines["full"]
        for r in requests():
            for node_type, h in full.answer(r).h.items():
                np.testing.assert_allclose(
                    expected[r.request_id][1].h[node_type].numpy(), h.numpy(), rtol=1e-5, atol=1e-5
                )
    errors = {r["request_id"]: r for r in t.to_pylist() if r["error"]}
    assert set(errors) == {r.request_id for r in bad.values()}
    for words, r in bad.items():
        row = errors[r.request_id]
        assert row["error"].startswith("invalid request: ") and words in row["error"], row["error"]
        assert "\n" not in row["error"] and row["h"] is None and row["qtype"] == r.qtype
    assert all(r["mode"] == mode for r in t.to_pylist())
    (dead,) = read_dead_letters(str(tmp_path / "dead"))
    assert dead["file"].endswith("flat.parquet") and "lacks column(s) ['type', 'relation']" in dead["reason"]
    assert (progress.requests, progress.errors, progress.dead_letters) == (len(requests()) + len(bad), len(bad), 1)


def _config(root, tmp_path, **kw):
    base = dict(
        graph=str(root / "graph"),
        model=str(root / "model"),
        store=str(root / "store"),
        mode="exact",
        requests=str(tmp_path / "in"),
        out=str(tmp_path / "out"),
        checkpoint=str(tmp_path / "ck"),
        available_now=True,
    )
    base.update(kw)
    return StreamConfig(**base)


def test_a_typed_graph_is_detected_and_what_typed_serving_lacks_is_refused_at_start_up(tmp_path, typed):
    root = typed[0]
    for kw, words in (
        (dict(mode="ns"), "a typed graph is served in modes full, he, srpe, exact, not 'ns'"),
        (dict(mode="srpe", mode_options={"gamma": 2}), "gamma must be a number in [0, 1], got 2"),
        (dict(mode="he", mode_options={"gamma": 1}), "typed serving mode 'he' does not take option(s) ['gamma']"),
        (dict(mode="he", store=None), "mode 'he' reuses precomputed embeddings: --store is required"),
        (dict(mode="full", workers="spark"), "which take none of: --workers spark"),
        (dict(mode="exact", store=None), "mode 'exact' reuses precomputed embeddings: --store is required"),
        (dict(mode="full", engine="serve://tcp://127.0.0.1:1"), "which take none of: --engine serve://"),
    ):
        with pytest.raises(StreamStartError) as info:
            build_engine(_config(root, tmp_path, **kw))
        assert words in str(info.value) and "\n" not in str(info.value), str(info.value)
    graph, engine = build_engine(_config(root, tmp_path, mode="full", store=None))
    assert (
        isinstance(engine, TypedQueryEngine)
        and engine.mode_name == "full"
        and graph.node_types == ["paper", "author", "field"]
    )
    _, engine = build_engine(_config(root, tmp_path, mode="srpe", mode_options={"gamma": 0.5, "policy": "random"}))
    assert engine.mode_name == "srpe" and (engine.gamma, engine.policy) == (0.5, "random")


def test_typed_stream_in_process_equals_the_typed_engine(spark, tmp_path, typed):
    root = typed[0]
    write_typed_requests(str(tmp_path / "in" / "good.parquet"), requests())
    write_typed_requests(str(tmp_path / "in" / "bad.parquet"), list(invalid().values()))
    (tmp_path / "in" / "junk.parquet").write_bytes(b"not parquet")
    cfg = _config(root, tmp_path)
    result = run(cfg, spark)
    assert result.stopped_by == "finished"
    t = read_answers(cfg.out)
    _, engine = build_engine(cfg)  # G, model and store read from disk, as the job's
    assert_rows_equal_typed_answers(t, {r.request_id: (r, engine.answer(r)) for r in requests()})
    assert sorted(r["request_id"] for r in t.to_pylist() if r["error"]) == sorted(
        r.request_id for r in invalid().values()
    )
    assert [os.path.basename(d["file"]) for d in read_dead_letters(cfg.dead_letter_dir)] == ["junk.parquet"]


def test_queries_of_types_the_model_gives_no_output_get_null_rows(tmp_path):
    import torch

    from sparkgnn.serving.typed import TypedAnswer
    from sparkgnn.streaming.handler import typed_outputs
    from sparkgnn.streaming.sink import answers_table

    request = requests()[0]  # papers 1000, 1001, author 100, field 9
    h = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    answer = TypedAnswer({"paper": h}, {"paper": h.argmax(-1)}, {})
    rows, pred = typed_outputs(request, answer)
    assert [r is None for r in rows] == [False, False, True, True] and pred == [2, 2, None, None]
    table = answers_table(
        [{"request_id": "mixed", "qid": request.qid, "qtype": request.qtype, "h": rows, "pred": pred}]
    )
    row = table.to_pylist()[0]
    assert row["h"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], None, None] and row["pred"] == [2, 2, None, None]
    assert row["qtype"] == ["paper", "paper", "author", "field"]
