"""choose_partitions: cores unless memory needs more."""

import math

import pytest

from sparkgnn.errors import PlanError
from sparkgnn.planner import MEMORY_MARGIN, choose_partitions, task_memory_bytes
from sparkgnn.planner.partitions import EDGE_TASK_BYTES, MESSAGE_CHUNK_BYTES, VERTEX_CHUNK_BYTES, WORKER_RSS_BYTES


def _call(make, memory, cores=4, requested=None, edges=2_000_000, vertices=200_000):
    return choose_partitions(make.sage_model(), vertices, edges, 128, cores, memory, requested=requested)


def test_requested_value_wins(make):
    assert _call(make, 1, requested=7) == 7


@pytest.mark.parametrize("bad", [0, -3, True, 1.5, "8"])
def test_requested_value_is_validated(make, bad):
    with pytest.raises(PlanError, match="requested partitions"):
        _call(make, 8 << 30, requested=bad)


def test_small_graph_gets_one_partition_per_core(make):
    assert _call(make, 8 << 30, cores=4) == 4
    assert _call(make, 8 << 30, cores=2) == 2


def _need(p, edges=2_000_000, vertices=200_000):
    """The estimate choose_partitions uses for P partitions (source rows: min(edges per task, |V|))."""
    e = edges / p
    return task_memory_bytes(e, vertices / p, 128, 128, 64, 129, source_rows=min(e, vertices))


def test_memory_estimate_counts_ids_per_edge_and_bounded_messages():
    # Widest layer: 128-d raw payload; 2M edges, 200K source rows, (in 128 + out 64 + state 129) on 200K rows.
    total = task_memory_bytes(2_000_000, 200_000, 128, 128, 64, 129, source_rows=200_000)
    messages = min(2_000_000 * 12 * 128, MESSAGE_CHUNK_BYTES)
    expected = 2_000_000 * EDGE_TASK_BYTES + 200_000 * 512 + messages + 200_000 * (16 + 4 * 321)
    assert total == pytest.approx(WORKER_RSS_BYTES + MEMORY_MARGIN * expected)
    # edge_join's case (a payload row per edge) is the default and costs more
    assert task_memory_bytes(2_000_000, 200_000, 128, 128, 64, 129) > total


def test_memory_pressure_raises_partitions_to_a_multiple_of_cores(make):
    memory = int(_need(10))  # fits 10 partitions' worth of splitting, not 8
    chosen = _call(make, memory, cores=4)
    assert chosen == 12  # the smallest whole number of waves of 4 cores that fits
    assert _need(chosen) <= memory < _need(8)
    assert _call(make, int(_need(4)), cores=4) == 4


def test_edges_alone_do_not_multiply_partitions(make):
    # 10x the edges on the same vertices: edges cost ids and bounded messages, not payload rows,
    # so a budget that fits the sparse graph on 2 partitions fits the dense one on a few more
    # (charging a payload row per edge, as edge_join needs, would take over 20; the extra waves
    # here pay for the ids and CSR of 10x the edges, and for the second partition's layout a worker
    # serving several keeps cached, partitions.worker_bytes).
    memory = int(_need(2))
    sparse = _call(make, memory, cores=2)
    dense = _call(make, memory, cores=2, edges=20_000_000)
    assert sparse == 2 and dense <= 12
    assert task_memory_bytes(20_000_000 / 20, 200_000 / 20, 128, 128, 64, 129) > memory


def test_more_memory_never_means_more_partitions(make):
    counts = [_call(make, m, cores=2) for m in (10 << 20, 100 << 20, 1 << 30, 10 << 30)]
    assert counts == sorted(counts, reverse=True) and counts[-1] == 2


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("cores", 0, "cores must be positive"),
        ("memory", 0, "memory_per_task_bytes must be positive"),
    ],
)
def test_bad_arguments(make, field, value, message):
    kwargs = {"cores": 2, "memory_per_task_bytes": 1 << 30}
    kwargs["memory_per_task_bytes" if field == "memory" else field] = value
    with pytest.raises(PlanError, match=message):
        choose_partitions(make.sage_model(), 100, 1000, 128, **kwargs)


def test_wide_raw_features_count_for_the_first_layer(make):
    budget = WORKER_RSS_BYTES + (64 << 20)
    narrow = choose_partitions(make.sage_model(), 200_000, 2_000_000, 128, 2, budget)
    wide = choose_partitions(make.sage_model(), 200_000, 2_000_000, 4096, 2, budget)
    assert wide > narrow


def test_compile_warns_when_the_largest_partition_does_not_fit(make):
    from sparkgnn.planner import compile

    plan = compile(
        make.sage_model(), make.stats(max_partition_edges=1_500_000), make.task(memory_per_task_bytes=512 << 20)
    )
    assert plan.warnings and "exceeds the 512 MiB a task has (2 at once)" in plan.warnings[0]
    assert "choose_layout suggests" in plan.warnings[0]
    assert "WARNING" in plan.explain()
    assert not compile(make.sage_model(), make.stats(), make.task()).warnings
    assert math.isfinite(plan.estimates["seconds"])


def _power_law_histogram(vertices, edges, seed=0):
    """{out-degree: vertices} of a Zipf-like graph with `edges` edges (a few hubs, many leaves)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, vertices + 1) ** 0.8
    degrees = rng.multinomial(edges, weights / weights.sum())
    ks, counts = np.unique(degrees[degrees > 0], return_counts=True)
    return dict(zip(ks.tolist(), counts.tolist(), strict=True)), degrees


def test_expected_sources_match_a_sampled_partition():
    # The expectation sum_k n_k (1 - (1 - k/|E|)^e) against counting the distinct sources of a
    # uniform 1/P share of the edges.
    import numpy as np

    from sparkgnn.planner.partitions import expected_sources

    vertices, edges = 50_000, 500_000
    histogram, degrees = _power_law_histogram(vertices, edges)
    src = np.repeat(np.arange(vertices), degrees)
    rng = np.random.default_rng(1)
    for parts in (2, 8, 32):
        share = src[rng.random(len(src)) < 1 / parts]
        counted = len(np.unique(share))
        assert expected_sources(histogram, edges, vertices, edges / parts) == pytest.approx(counted, rel=0.02)
    assert expected_sources(None, edges, vertices, edges / 2) == vertices  # the bound without a histogram
    assert expected_sources({}, edges, vertices, 1000) == 1000


def test_a_histogram_lowers_p_on_a_power_law_graph_and_never_raises_it(make):
    vertices, edges = 3_200_000, 32_000_000
    histogram, _ = _power_law_histogram(vertices, edges)
    budget = 6 << 30
    layers = make.sage_model()
    bound = choose_partitions(layers, vertices, edges, 128, 2, budget)
    counted = choose_partitions(layers, vertices, edges, 128, 2, budget, out_degrees=histogram)
    assert counted < bound and counted % 2 == 0
    for memory in (1 << 30, 3 << 30, 64 << 30):
        assert choose_partitions(layers, vertices, edges, 128, 2, memory, out_degrees=histogram) <= choose_partitions(
            layers, vertices, edges, 128, 2, memory
        )


def test_a_range_wise_layer_counts_its_state_for_one_range_only():
    whole = task_memory_bytes(16e6, 1.6e6, 128, 128, 128, 129, source_rows=3.2e6)
    ranges = task_memory_bytes(16e6, 1.6e6, 128, 128, 128, 129, source_rows=3.2e6, range_wise=True)
    assert whole - ranges == pytest.approx(MEMORY_MARGIN * (1.6e6 * 4 * 129 - VERTEX_CHUNK_BYTES))
    # a partition smaller than one range is charged what it holds
    small = dict(source_rows=2e3)
    assert task_memory_bytes(1e4, 1e3, 128, 128, 128, 129, **small) == task_memory_bytes(
        1e4, 1e3, 128, 128, 128, 129, range_wise=True, **small
    )


def test_range_wise_layers_keep_p_at_the_cores_where_whole_states_would_not(make):
    # The 32M-edge bench graph's shape on 2 cores with its measured 6.3 GB budget: counting the
    # whole state chose 4 partitions; the DL step only ever holds one range's state.
    budget, sources = 6_319_127_552, {1: 600_000, 5: 1_400_000, 20: 1_168_000}
    whole = choose_partitions(
        make.sage_model((128, 128, 128)), 3_200_000, 32_000_000, 128, 2, budget, out_degrees=sources
    )
    layers = make.sage_model((128, 128, 128), range_wise=True)
    ranged = choose_partitions(layers, 3_200_000, 32_000_000, 128, 2, budget, out_degrees=sources)
    assert (whole, ranged) == (4, 2)


def test_payloads_left_in_mapped_files_leave_the_estimate(make):
    # 100M-edge bench shape, P=4: a task receives 9.1M of the 10M vertices as sources
    copied = task_memory_bytes(25e6, 2.5e6, 128, 128, 128, 129, source_rows=9.1e6, range_wise=True)
    mapped = task_memory_bytes(
        25e6, 2.5e6, 128, 128, 128, 129, source_rows=9.1e6, range_wise=True, mapped_payloads=True
    )
    # remote payload rows and the own rows' input h no longer count; the renumbered sources do
    removed = (9.1e6 - 2.5e6) * 512 + 2.5e6 * 512 - 25e6 * 8
    assert copied - mapped == pytest.approx(MEMORY_MARGIN * removed)
    layers = make.sage_model((128, 128, 128), range_wise=True)
    degrees = {1: 2_000_000, 10: 6_000_000, 40: 1_000_000}
    args = (layers, 10_000_000, 100_000_000, 128, 2, 6_319_127_552)
    assert choose_partitions(*args, out_degrees=degrees, mapped_payloads=True) < choose_partitions(
        *args, out_degrees=degrees
    )


def test_a_worker_counts_the_partitions_it_keeps_cached():
    from sparkgnn.planner.partitions import CACHED_PARTITIONS, KEPT_EDGE_BYTES, RENUMBERED_SOURCE_BYTES, worker_bytes

    assert worker_bytes(1e9, 1e6, served=1) == 1e9  # one partition per step: the task is the worker
    kept = MEMORY_MARGIN * (CACHED_PARTITIONS - 1) * 1e6
    assert worker_bytes(1e9, 1e6, served=2) == pytest.approx(1e9 + kept * KEPT_EDGE_BYTES)
    # serving more partitions than it caches keeps no more (the others are rebuilt)
    assert worker_bytes(1e9, 1e6, served=5) == worker_bytes(1e9, 1e6, served=2)
    mapped = worker_bytes(1e9, 1e6, served=2, mapped_payloads=True)
    assert mapped == pytest.approx(1e9 + kept * (KEPT_EDGE_BYTES + RENUMBERED_SOURCE_BYTES))


def _bench_100m(make):
    """The 100M-edge bench graph on this 2-core, 23.5 GiB machine: the Python workers' share per
    task and the page cache left for mapped exchange files (engine.session), a Zipf-like histogram."""
    layers = make.sage_model((128, 128, 128), range_wise=True)
    degrees = {4: 1_000_000, 8: 3_000_000, 10: 3_000_000, 12: 2_000_000, 16: 1_000_000}
    return (layers, 10_000_000, 100_000_000, 128, 2, 6_319_127_552), degrees, 8_340_000_000


def test_fewer_tasks_at_once_before_more_partitions(make):
    from sparkgnn.planner import choose_layout

    args, degrees, page_cache = _bench_100m(make)
    common = {"out_degrees": degrees, "mapped_payloads": True, "mapped_budget_bytes": page_cache}
    # two tasks at once would need 2 x (heap + mapped inputs) at every P up to 6; one task at P=4
    # fits, and shipping ~R_f(4) = 3.7 copies of the payloads beats ~R_f(6)
    assert choose_layout(*args, serial_partitions=True, **common) == (4, 1)
    # where a task cannot serve several partitions (Spark routes the rows), only P can give
    partitions, tasks = choose_layout(*args, **common)
    assert partitions > 4 and tasks == 2
    # a requested P keeps its count and gets the tasks that fit
    assert choose_layout(*args, requested=4, serial_partitions=True, **common) == (4, 1)
    assert choose_layout(*args, requested=4, **common) == (4, 2)
    # a small graph runs on every core at once
    assert choose_layout(args[0], 200_000, 2_000_000, 128, 2, args[5], serial_partitions=True, **common) == (2, 2)


def test_the_page_cache_budget_bounds_the_mapped_inputs_of_all_tasks(make):
    from sparkgnn.planner import choose_layout

    args, degrees, _ = _bench_100m(make)
    roomy = choose_layout(*args, out_degrees=degrees, mapped_payloads=True, serial_partitions=True)
    tight = choose_layout(
        *args, out_degrees=degrees, mapped_payloads=True, mapped_budget_bytes=1 << 30, serial_partitions=True
    )
    assert tight[0] > roomy[0]  # 1 GiB holds the mapped inputs of the tasks only at a larger P


def test_explain_shows_the_tasks_at_once(make):
    from sparkgnn.planner import compile

    plan = compile(make.sage_model(), make.stats(), make.task(concurrent_tasks=1))
    assert plan.concurrent_tasks == 1
    line = next(line for line in plan.explain().splitlines() if line.startswith("tasks:"))
    assert "1 at once" in line and "partition(s) each per step in turn" in line
    # the one task has both cores' share of the workers' memory
    assert plan.memory["budget_per_task_bytes"] == 2 * make.task()["memory_per_task_bytes"]


def test_idle_workers_keep_nothing_when_all_of_them_would_not_fit(make):
    from sparkgnn.planner import compile
    from sparkgnn.planner.partitions import worker_bytes

    stats = make.stats()
    plan = compile(make.sage_model(), stats, make.task(concurrent_tasks=1))
    assert plan.memory["keep_between_steps"]  # a small graph: every worker may keep its caches
    worker = plan.memory["worker_bytes"]
    # a budget where one worker fits but two (Spark keeps min(cores, P) alive) would not
    tight = compile(make.sage_model(), stats, make.task(concurrent_tasks=1, memory_per_task_bytes=int(worker * 0.75)))
    assert worker_bytes(worker, 0, 1) == worker and not tight.memory["keep_between_steps"]
    assert "caches and free heap dropped after each task" in tight.explain()
