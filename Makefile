# The two set-up commands a newcomer runs: `make demo` and `make test`.
# Both bootstrap .venv from the pinned requirements (idempotent: a stamp file skips the
# install when requirements.txt, pyproject.toml and setup.py have not changed). uv (pinned, installed
# into the venv first) unpacks the wheels on every core: 61 s against pip's 91 s on a two-core clean
# clone. uv does not read pip's configuration, so pip's find-links (where a machine's local torch CPU
# wheel lies: never the multi-GB CUDA build) and constraint file are handed to it; where uv cannot be
# installed, pip installs the same pins. Neither byte-compiles: compileall then compiles site-packages
# on every core (uv's own compile step took longer; NO_COMPILE says what it skips), skipping a file
# this Python cannot compile (torch's 3.12-only test helper on 3.11) as pip's compile step would.
# WHY compile at all: PYTHONDONTWRITEBYTECODE=1 is set on these machines, so without .pyc files every
# test process, Spark worker and job would compile torch and pyspark again (13 s instead of 5 s an import).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
UV_VERSION := 0.13.9
# What compileall leaves out: packages' own test suites and the tools that run in one process only
# (pip, the linters, moto's S3 server and its CloudFormation linter), which a single import compiles
# as fast as compileall would; 9,100 of 15,000 files compiled, 33 -> 20 s on two cores.
NO_COMPILE := /site-packages/(pip|setuptools|moto|cfnlint|mypy|mypyc|fontTools)/|/tests?/
PIP_INSTALL = $(PY) -m pip install -q --disable-pip-version-check --no-compile -r requirements.txt
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYTHONUNBUFFERED := 1

.PHONY: venv test demo bench-batch clean lint jar

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if $(PY) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION); then \
		config="$$($(PY) -m pip config list 2>/dev/null)"; \
		links="$${PIP_FIND_LINKS:-$$(echo "$$config" | sed -n "s/^global.find-links='\(.*\)'$$/\1/p")}"; \
		constraint="$${PIP_CONSTRAINT:-$$(echo "$$config" | sed -n "s/^global.constraint='\(.*\)'$$/\1/p")}"; \
		set -x; $(VENV)/bin/uv pip install -q --no-cache --link-mode copy --python $(PY) \
			$$(for l in $$links; do printf -- '--find-links %s ' "$$l"; done) \
			$$(for c in $$constraint; do printf -- '--constraint %s ' "$$c"; done) -r requirements.txt \
		|| $(PIP_INSTALL); \
	else \
		set -x; $(PIP_INSTALL); \
	fi
	$(PY) -m compileall -q -j 0 -x '$(NO_COMPILE)' $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') >/dev/null || true
	$(PY) -m pip install -q --disable-pip-version-check --no-deps graphdatascience==2.2
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

# The JVM module (jvm/src/main/scala, the same sources build.sbt compiles): native vector aggregates
# for the pushdown strategy and the step-metrics listener. sbt cannot be installed here, so
# jvm/build.py compiles them offline with the Scala compiler in pyspark's jars (~17 s) and packs the
# jar into the package (python/sparkgnn/jars/, found by sparkgnn.engine.jvm); its .sha256 stamp
# skips the build when the sources, the script and pyspark are unchanged.
# It also writes the class-data archive of Spark's classes beside the jar (jvm/cds.py, ~35 s once; a
# stamp skips it): every driver local_session starts, the demo's spark-submit and the tests' JVMs map
# it and start on about half the CPU (engine/cds.py).
JAR := python/sparkgnn/jars/sparkgnn-jvm_2.13.jar
jar: venv
	$(PY) jvm/build.py --out $(JAR)
	$(PY) jvm/cds.py

# The suite runs on TEST_WORKERS processes (pytest-xdist), whole files per process (--dist loadfile)
# so each file's module-scoped fixtures and its process's one SparkSession are built once. Three
# processes on two cores: the messenger and service tests wait on sockets and timeouts (a third of
# a core idle with two processes), and the last long files leave one process running alone; with
# three the cores stayed busy to the end (measured with /proc/stat every 10 s). Handing the long
# files out first did not shorten it. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 3
# The 25 slowest tests are listed at the end of every run (CI's log says where the suite's time goes).
# sparkgnn's own modules are byte-compiled first (compileall skips the unchanged ones), for the same
# reason as site-packages above: the package is installed editable, so without .pyc files every
# test process, job subprocess and Spark Python worker compiled them again (0.2-0.25 s a process).
PYTEST_ARGS ?= --durations=25
test: venv jar
	$(PY) -m compileall -q -j 0 python planner messenger spark_jobs >/dev/null
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) tests

# Lint and types: ruff (rules and format in pyproject.toml) and mypy. mypy reads the package as it is
# installed (planner/ and messenger/ are sparkgnn.planner / sparkgnn.messenger), so it runs on a
# symlink tree of that shape under build/typecheck (rebuilt each time, ignored by git).
LINT_PATHS := python planner messenger spark_jobs tests bench examples setup.py
lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	rm -rf build/typecheck && mkdir -p build/typecheck/sparkgnn
	for f in python/sparkgnn/*; do ln -s ../../../$$f build/typecheck/sparkgnn/$$(basename $$f); done
	ln -s ../../../planner build/typecheck/sparkgnn/planner
	ln -s ../../../messenger build/typecheck/sparkgnn/messenger
	cd build/typecheck && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml -p sparkgnn

# The main job on the embedded default: Cora from the packaged dataset, a GraphSAGE trained in
# PyTorch Geometric, batch inference through spark-submit on local Spark, accuracy vs PyG.
DEMO_DATA := data/demo
demo: venv jar
	$(PY) -m sparkgnn.datasets cora --out $(DEMO_DATA)/cora --overwrite
	rm -rf $(DEMO_DATA)/models/cora_sage
	$(PY) examples/train_cora_sage.py --graph $(DEMO_DATA)/cora --model-out $(DEMO_DATA)/models/cora_sage
	$(VENV)/bin/spark-submit --master 'local[2]' --driver-memory 2g --jars $(JAR) \
		--conf spark.ui.showConsoleProgress=false --conf spark.driver.host=127.0.0.1 --conf spark.ui.enabled=false \
		--conf spark.shuffle.compress=false --conf spark.python.daemon.module=sparkgnn.pydaemon \
		--driver-java-options "-Dlog4j.configurationFile=spark_jobs/log4j2.properties $$($(PY) -c 'from sparkgnn.engine.cds import java_options; print(java_options())')" \
		spark_jobs/batch_inference.py --graph $(DEMO_DATA)/cora --model $(DEMO_DATA)/models/cora_sage \
		--out $(DEMO_DATA)/out/cora_pred --overwrite --work-dir $(DEMO_DATA)/work --explain
	$(PY) examples/demo_report.py --graph $(DEMO_DATA)/cora --model $(DEMO_DATA)/models/cora_sage --out $(DEMO_DATA)/out/cora_pred

clean:
	rm -rf $(VENV) build *.egg-info python/*.egg-info .pytest_cache python/sparkgnn/jars

# Messenger throughput/latency report: bench/results/messenger.json + messenger.png.
.PHONY: bench-messenger
bench-messenger: venv
	$(PY) bench/bench_messenger.py

# Batch inference vs PyG: bench/results/batch.json + batch.png (several minutes; makes data/bench).
.PHONY: bench-batch
bench-batch: venv
	$(PY) bench/bench_batch.py

# Cold batch jobs with and without the class-data archive `make jar` writes (jvm/cds.py):
# bench/results/cds.json + cds.png.
.PHONY: bench-cds
bench-cds: venv jar
	$(PY) bench/bench_cds.py

# bench-batch's generic-fallback section alone: cold jobs of the generic fallback vs the native layer of
# the same conv (GraphConv, replicate, P=2) next to a cold PyG script (edge_index and CSR adj_t) per
# graph size: batch.json "generic_vs_native" + batch_generic.png (about 6 minutes, graphs made once under
# data/bench; GENERIC_SIZES=20000 GENERIC_RESULTS=/tmp/generic for a smoke run that leaves bench/results alone).
GENERIC_SIZES ?= 2000000,8000000
GENERIC_RESULTS ?= bench/results
.PHONY: bench-generic
bench-generic: venv
	$(PY) bench/bench_batch.py --section generic --generic-sizes $(GENERIC_SIZES) --generic-results $(GENERIC_RESULTS)

# PE precomputation: bench/results/precompute.json + precompute.png.
.PHONY: bench-precompute
bench-precompute: venv
	$(PY) bench/bench_precompute.py

# Streaming query micro-batches (spark_jobs/stream_queries.py): Cora's held-out test vertices
# arrive as request files over ~30 s; answers print as they commit, then accuracy vs labels.
# Reuses make demo's Cora + trained model when present, else builds them.
.PHONY: demo-stream
demo-stream: venv
	test -f $(DEMO_DATA)/cora/graph.json || $(PY) -m sparkgnn.datasets cora --out $(DEMO_DATA)/cora --overwrite
	test -f $(DEMO_DATA)/models/cora_sage/model.json || $(PY) examples/train_cora_sage.py --graph $(DEMO_DATA)/cora --model-out $(DEMO_DATA)/models/cora_sage
	$(PY) examples/stream_demo.py --graph $(DEMO_DATA)/cora --model $(DEMO_DATA)/models/cora_sage --work $(DEMO_DATA)/stream

# Streaming latency/throughput, degree-aware vs FIFO grouping under Poisson arrivals:
# bench/results/stream.json + stream.png (a few minutes; makes data/bench).
.PHONY: bench-stream
bench-stream: venv
	$(PY) bench/bench_stream.py

# Serving modes (full, ns, he, srpe, exact, CGP) on Cora and a 1.2M-edge synthetic graph, the OMEGA
# section 8 experiments: bench/results/serving.json + serving_{latency,recovery,bytes}.png
# (~5 minutes on 2 cores with the trained weights cached under data/bench/serving, ~8 without).
.PHONY: bench-serving
bench-serving: venv
	$(PY) bench/bench_serving.py

# Cost of the refusal checks (graph footers + data_stamp, PE store CRC-32 / size verification) next to
# the reads they guard, at two graph sizes: bench/results/integrity.json + integrity.png (~3 minutes).
.PHONY: bench-integrity
bench-integrity: venv
	$(PY) bench/bench_integrity.py

# What surviving a lost executor costs: cold jobs on the 2M-edge graph, each step materialised as
# Parquet in the work dir vs localCheckpoint, in local mode and on local-cluster[2,1,4096]:
# bench/results/cluster.json + cluster.png (~10 minutes).
.PHONY: bench-cluster
bench-cluster: venv
	$(PY) bench/bench_cluster.py

# The online service (sparkgnn.serving.online) under open-loop load from its own process: capacity,
# FIFO vs degree scheduling, HE vs EXACT, 1 vs 2 workers, hot cache, PSGS router, with vs without
# authentication on a 1.1M-edge graph: bench/results/online.json + online_latency.png +
# online_schedulers.png + online_auth.png (~12 minutes; QUICK=1 for a 100K-edge graph at 2 s per
# point, written as online_quick.*; ONLY=auth runs the authentication cost alone into the existing
# result, a few minutes).
.PHONY: bench-online
bench-online: venv
	$(PY) bench/bench_online.py $(if $(QUICK),--quick,) $(if $(ONLY),--only $(ONLY),)

# Incremental PE refresh vs a precompute from scratch (same run) at 0.01/0.1/1/10% of edges changed on
# the 2M-edge bench graph and a 4x smaller one, plus one warm Spark precompute per size:
# bench/results/refresh.json + refresh.png (~6 minutes).
.PHONY: bench-refresh
bench-refresh: venv
	$(PY) bench/bench_refresh.py

# Streaming refresh (`sparkgnn-refresh follow`): sustained edge updates/s and batch latency p50/p99 with
# files of 10/100/1,000 edge inserts offered open-loop on the 2M- and 8M-edge graphs, 2-layer SAGE and
# GCN, next to a precompute and refresh_local cold/warm, and the freshness p50/p99 of a service
# following the store at 100-edge batches (200K edges), against the issue's targets:
# bench/results/follow.json + follow.png (QUICK=1: 10x smaller graphs).
.PHONY: bench-follow
bench-follow: venv
	$(PY) bench/bench_follow.py $(if $(QUICK),--quick,)

# Batch inference at scale as a spark-submit user pays it: cold jobs at 2M / 8M / 32M edges vs a cold
# PyG script, peak RSS of each: bench/results/scale.json + scale.png (long; SIZES=2000000,8000000 for
# a shorter run, HUGE=1 adds 100M edges).
SIZES ?= 2000000,8000000,32000000
.PHONY: bench-scale
bench-scale: venv
	$(PY) bench/bench_scale.py --sizes $(SIZES) $(if $(HUGE),--huge,)

# Link prediction as a spark-submit user pays it, on the bench-scale graphs: cold score_edges.py jobs
# over 10M seeded pairs (dot and MLP decoders) and cold topk.py jobs (exact and --approx, top-10 over
# every node for a seeded sample of LINKPRED_SOURCES sources) vs cold PyG scripts of the same weights:
# bench/results/linkpred.json + linkpred.png (LINKPRED_SIZES=20000 LINKPRED_RESULTS=/tmp/lp for a smoke
# run that leaves bench/results alone).
LINKPRED_SIZES ?= 2000000,8000000
LINKPRED_SOURCES ?= 5000
LINKPRED_RESULTS ?= bench/results
.PHONY: bench-linkpred
bench-linkpred: venv
	$(PY) bench/bench_linkpred.py --sizes $(LINKPRED_SIZES) --topk-sources $(LINKPRED_SOURCES) --results $(LINKPRED_RESULTS)

# Recall and speed of vector indexes (faiss HNSW, IVF, topk.py --approx's shards) against exact
# brute force on bench-linkpred's node outputs: bench/results/linkpred_frontier.json + png.
.PHONY: bench-linkpred-frontier
bench-linkpred-frontier: venv
	$(PY) bench/linkpred_index_frontier.py

# Typed batch inference at scale: cold jobs of a to_hetero GraphSAGE on the seeded OGB-MAG-shaped
# graph (synthetic_mag with rev_ relations, made once under data/bench) vs a cold PyG script of the
# same module, outputs compared per type: bench/results/hetero.json + hetero.png
# (HETERO_SIZES=50000 HETERO_RESULTS=/tmp/hetero for a smoke run that leaves bench/results alone).
HETERO_SIZES ?= 2000000,8000000
HETERO_RESULTS ?= bench/results
.PHONY: bench-hetero
bench-hetero: venv
	$(PY) bench/bench_hetero.py --sizes $(HETERO_SIZES) --results $(HETERO_RESULTS)

# What only a GPU shows (bench/bench_gpu.py): the batch job's DL step on the CPU vs CUDA (cold, warm,
# error vs PyG) at 2M and 8M edges per partition, PyG in memory on the same GPU, sparkgnn-worker
# --device cuda vs cpu over the messenger, the serving hot cache's gather on CUDA:
# bench/results/gpu.json + gpu.png (about 4 minutes; without CUDA the CPU parts run and `gpu` is null;
# QUICK=1: tiny sizes, written as gpu_quick.*).
.PHONY: bench-gpu
bench-gpu: venv
	$(PY) bench/bench_gpu.py --out bench/results $(if $(QUICK),--quick,)

# Every conv the converter accepts (native and generic, with and without edge features) through the
# batch job's DL step on the CPU and CUDA against PyG on the same device (bench/gpu_coverage.py):
# bench/results/gpu_coverage.json + gpu_coverage.png (QUICK=1: a 20K-edge graph, gpu_coverage_quick.*).
.PHONY: bench-gpu-coverage
bench-gpu-coverage: venv
	$(PY) bench/gpu_coverage.py --out bench/results $(if $(QUICK),--quick,)

# The exact top-k's tiles (linkpred/tiles.py) for every node as a source on CUDA against the CPU and
# a naive torch brute force on the same GPU (bench/gpu_topk.py): bench/results/gpu_topk.json + png.
.PHONY: bench-gpu-topk
bench-gpu-topk: venv
	$(PY) bench/gpu_topk.py --out bench/results $(if $(QUICK),--quick,)
