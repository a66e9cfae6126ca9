"""choose_partitions: cores unless memory needs more."""

import math

import pytest

from sparkgnn.errors import PlanError
from sparkgnn.planner import MEMORY_SAFETY_FACTOR, choose_partitions, task_memory_bytes


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


def test_memory_pressure_raises_partitions_to_a_multiple_of_cores(make):
    # Widest layer: 128-d raw payload on 2M edges and (in 128 + out 64 + state 129) on 200K rows.
    total = task_memory_bytes(2_000_000, 200_000, 128, 128, 64, 129)
    assert total == pytest.approx(MEMORY_SAFETY_FACTOR * (2_000_000 * (16 + 4 + 512) + 200_000 * (16 + 4 * 321)))
    memory = int(total / 9)  # needs 10 partitions' worth of splitting
    chosen = _call(make, memory, cores=4)
    assert chosen == 12  # ceil(total / memory) = 10, rounded up to whole waves of 4 cores
    assert task_memory_bytes(2_000_000 / chosen, 200_000 / chosen, 128, 128, 64, 129) <= memory
    assert _call(make, memory * 4, cores=4) == 4


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
    narrow = choose_partitions(make.sage_model(), 200_000, 2_000_000, 128, 2, 64 << 20)
    wide = choose_partitions(make.sage_model(), 200_000, 2_000_000, 4096, 2, 64 << 20)
    assert wide > narrow


def test_compile_warns_when_the_largest_partition_does_not_fit(make):
    from sparkgnn.planner import compile

    plan = compile(
        make.sage_model(), make.stats(max_partition_edges=1_500_000), make.task(memory_per_task_bytes=512 << 20)
    )
    assert plan.warnings and "exceeds memory_per_task_bytes" in plan.warnings[0]
    assert "choose_partitions suggests" in plan.warnings[0]
    assert "WARNING" in plan.explain()
    assert not compile(make.sage_model(), make.stats(), make.task()).warnings
    assert math.isfinite(plan.estimates["seconds"])
