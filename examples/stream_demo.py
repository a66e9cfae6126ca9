"""Streaming demo (make demo-stream): Cora's held-out test vertices arrive as request files while
spark_jobs/stream_queries.py runs under spark-submit; answers are printed as their micro-batches
commit, and at the end the accuracy against the held-out labels.

    python examples/stream_demo.py --graph data/demo/cora --model data/demo/models/cora_sage --work data/demo/stream

Steps: (1) the OMEGA workload: 25% of Cora's test vertices become the query pool, G is the rest;
(2) the PE store of the model on G (precompute_local); (3) the streaming job starts and watches
<work>/requests; (4) request files are dropped there over ~30 s, plus one corrupt file and one
request naming an unknown vertex, to show the dead-letter directory and error rows; (5) once
every request is answered the job gets SIGTERM and stops cleanly.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spark_submit_command(args, paths) -> list[str]:
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    job = [
        os.path.join(ROOT, "spark_jobs", "stream_queries.py"),
        "--graph",
        paths["graph"],
        "--model",
        args.model,
        "--store",
        paths["store"],
        "--requests",
        paths["requests"],
        "--out",
        paths["out"],
        "--checkpoint",
        paths["checkpoint"],
        "--mode",
        args.mode,
        "--trigger",
        str(args.trigger),
        "--timeout",
        str(args.timeout),
    ]
    if args.mode == "srpe":
        job += ["--gamma", str(args.gamma)]
    if not os.path.exists(submit):  # no spark-submit next to this python: plain python
        return [sys.executable] + job
    return [
        submit,
        "--master",
        "local[2]",
        "--driver-memory",
        "2g",
        "--conf",
        "spark.ui.showConsoleProgress=false",
        "--conf",
        "spark.driver.host=127.0.0.1",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.shuffle.compress=false",
        "--driver-java-options",
        f"-Dlog4j.configurationFile={os.path.join(ROOT, 'spark_jobs', 'log4j2.properties')}",
    ] + job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", required=True, help="Cora graph directory (make demo writes data/demo/cora)")
    parser.add_argument("--model", required=True, help="trained model (make demo writes data/demo/models/cora_sage)")
    parser.add_argument("--work", required=True, help="demo work directory (recreated)")
    parser.add_argument("--mode", default="exact", help="serving mode (exact: FULL's answers from the PE store)")
    parser.add_argument("--gamma", type=float, default=0.2, help="SRPE budget when --mode srpe")
    parser.add_argument("--seconds", type=float, default=30.0, help="spread the request files over this long")
    parser.add_argument("--trigger", type=float, default=1.0, help="micro-batch trigger interval (s)")
    parser.add_argument("--timeout", type=float, default=300.0, help="the job stops itself after this long")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        os.environ.setdefault(name, sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from sparkgnn.graph import read_graph_dir
    from sparkgnn.models import Model
    from sparkgnn.pe.local import precompute_local
    from sparkgnn.serving import Request, make_workload
    from sparkgnn.serving.request import write_requests
    from sparkgnn.serving.workload import write_workload
    from sparkgnn.streaming.deadletter import read_dead_letters
    from sparkgnn.streaming.sink import read_answers

    shutil.rmtree(args.work, ignore_errors=True)
    paths = {k: os.path.join(args.work, k) for k in ("workload", "store", "requests", "out", "checkpoint", "staged")}
    paths["graph"] = os.path.join(paths["workload"], "graph")

    # (1) workload and (2) PE store
    wl = make_workload(read_graph_dir(args.graph), (16, 32, 64, 128), 5, seed=args.seed)
    write_workload(wl, paths["workload"], {"source": os.path.abspath(args.graph), "seed": args.seed})
    model = Model.load(args.model)
    precompute_local(wl.graph_G, model, paths["store"])
    rng = np.random.default_rng(args.seed)
    requests = [wl.requests[i] for i in rng.permutation(len(wl.requests))]
    r0 = requests[0]
    unknown = Request("bad-unknown-vertex", r0.qid[:4], r0.x[:4], np.array([10**9]), r0.qid[:1])
    staged = [write_requests(os.path.join(paths["staged"], f"{r.request_id}.parquet"), [r]) for r in requests]
    staged.insert(
        len(staged) // 3, write_requests(os.path.join(paths["staged"], "bad-unknown-vertex.parquet"), [unknown])
    )
    corrupt = os.path.join(paths["staged"], "corrupt.parquet")
    with open(corrupt, "wb") as fh:
        fh.write(b"PAR1 this file was cut off in transit")
    staged.insert(2 * len(staged) // 3, corrupt)
    print(
        f"demo: {len(requests)} requests of 16..128 Cora test vertices (+1 invalid request, +1 corrupt file) "
        f"will arrive over {args.seconds:.0f} s",
        flush=True,
    )

    # (3) the job
    os.makedirs(paths["requests"], exist_ok=True)
    cmd = spark_submit_command(args, paths)
    script = next(i for i, c in enumerate(cmd) if c.endswith("stream_queries.py"))
    print(
        f"demo: starting {os.path.basename(cmd[0])} ... "
        + " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd[script:]),
        flush=True,
    )
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    ready = threading.Event()

    def pump():
        for line in job.stdout:
            line = line.rstrip()
            if " WARN " in line or line.startswith(("Using Spark's", "To adjust logging")):
                continue
            if "watching" in line:
                ready.set()
            print(f"  [job] {line}", flush=True)

    threading.Thread(target=pump, daemon=True).start()
    while not ready.wait(0.5):
        if job.poll() is not None:
            print(f"demo: the job exited with code {job.returncode} before it was ready", file=sys.stderr)
            return 1

    # (4) drop files, print answers as they commit
    labels = wl.labels
    shown: set = set()
    gaps = rng.exponential(args.seconds / len(staged), len(staged))
    gaps *= args.seconds / gaps.sum()

    def show_new() -> None:
        t = read_answers(paths["out"])
        for row in t.to_pylist():
            key = (row["batch_id"], row["request_id"])
            if key in shown:
                continue
            shown.add(key)
            if row["error"]:
                print(f"  answer {row['request_id']:>20}: ERROR {row['error'][:110]}", flush=True)
                continue
            y = np.array([labels[q] for q in row["qid"]])
            acc = float((np.array(row["pred"]) == y).mean())
            print(
                f"  answer {row['request_id']:>20}: {row['num_queries']:4d} queries, accuracy {acc:.3f}, "
                f"latency {row['latency_s']:.2f} s (queue {row['queue_s']:.2f} + service {row['service_s']:.3f}), "
                f"batch {row['batch_id']}",
                flush=True,
            )

    for path, gap in zip(staged, gaps, strict=True):
        time.sleep(gap)
        now = time.time()
        os.utime(path, (now, now))
        os.replace(path, os.path.join(paths["requests"], os.path.basename(path)))
        show_new()
    expected = len(requests) + 1
    deadline = time.time() + 120
    while len(shown) < expected and time.time() < deadline and job.poll() is None:
        time.sleep(0.5)
        show_new()

    # (5) stop the job, summarise. Under spark-submit the Python driver is a child of the JVM:
    # SIGTERM goes to that driver (it stops the query cleanly and exits 0, then the JVM exits).
    if job.poll() is None:
        import psutil

        def is_driver(p) -> bool:
            try:
                return any(a.endswith("stream_queries.py") for a in p.cmdline())
            except psutil.Error:  # exited / zombie children of the JVM
                return False

        drivers = [p for p in psutil.Process(job.pid).children(recursive=True) if is_driver(p)]
        (drivers[0] if drivers else job).send_signal(signal.SIGTERM)
    code = job.wait(120)
    t = read_answers(paths["out"]).to_pylist()
    ok = [r for r in t if not r["error"]]
    pred = np.concatenate([r["pred"] for r in ok]) if ok else np.empty(0)
    y = np.concatenate([[labels[q] for q in r["qid"]] for r in ok]) if ok else np.empty(0)
    lat = np.array([r["latency_s"] for r in t])
    dead = read_dead_letters(os.path.join(paths["out"], "_dead_letter"))
    ids = [r["request_id"] for r in t]
    ref = os.path.join(args.model, "pyg_reference.json")
    print("\ndemo summary")
    print(
        f"  job exit code {code}; {len(t)} answer rows, {len(set(ids))} distinct request ids "
        f"({len(ok)} answered, {len(t) - len(ok)} error rows), {len(dead)} dead-lettered file(s)"
    )
    for d in dead:
        print(f"  dead letter: {d['reason'][:140]}")
    if len(lat):
        print(
            f"  latency file arrival -> answer: p50 {np.percentile(lat, 50):.2f} s, p99 {np.percentile(lat, 99):.2f} s"
        )
    if len(y):
        print(
            f"  accuracy of mode {args.mode} on {len(y)} query answers "
            f"({len(set(np.concatenate([r['qid'] for r in ok]).tolist()))} distinct held-out vertices, new to G): "
            f"{float((pred == y).mean()):.4f}"
        )
    if os.path.exists(ref):
        with open(ref) as fh:
            pyg = json.load(fh)
        print(
            f"  (the same model in PyG on the whole graph, all {pyg['test_nodes']} test vertices: "
            f"{pyg['pyg_test_accuracy']:.4f})"
        )
    missing = {r.request_id for r in requests} - set(ids)
    if code != 0 or missing:
        print(f"demo: FAILED (exit code {code}; unanswered: {sorted(missing)[:5]})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
