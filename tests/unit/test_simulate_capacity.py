"""simulate's channel capacity: micro-batches a producer may run ahead of its consumer, the
meaning Flow(channel_capacity=...) gives it at run time; 0 and None are unbounded."""

from __future__ import annotations

import pytest
from _capacity_cases import BAD_CAPACITIES

from loomrl.plan import load_profile, simulate
from loomrl.plan.plan import leaf, spatial
from loomrl.plan.search import fixed_plan
from loomrl.plan.simulate import capacity_problems

K = 6  # micro-batches


def _chain(producer_s: float, consumer_s: float):
    """A spatial plan a -> b of K micro-batches of one item, and its profile."""

    def spec(per_item):
        return {"valid_devices": [1], "time": {"alpha": 0, "per_item": {1: per_item}}}

    prof = load_profile(
        {
            "devices": 2,
            "device_memory_gb": 8,
            "batch": K,
            "granularities": [1],
            "components": {"a": spec(producer_s), "b": spec(consumer_s)},
            "edges": [["a", "b"]],
        }
    )
    return fixed_plan(prof, spatial(leaf("a", 1), leaf("b", 1)), 1), prof


def _starts(sim, component: str) -> list[float]:
    rows = sorted((i.micro_batch, i.start) for i in sim.intervals if i.component == component)
    return [s for _, s in rows]


@pytest.mark.parametrize("capacity", [1, 2, 3])
def test_a_producer_starts_micro_batch_j_when_its_consumer_starts_j_minus_capacity(capacity):
    """A fast producer (0.5 s a micro-batch) ahead of a slow consumer (2 s) starts micro-batch
    j when it has ended j - 1 and its consumer has started j - capacity, whichever comes later:
    once it has run ``capacity`` micro-batches ahead it is held there."""
    plan, prof = _chain(0.5, 2.0)
    sim = simulate(plan, prof, channel_capacity=capacity)
    a, b = _starts(sim, "a"), _starts(sim, "b")
    assert a[:capacity] == [0.5 * j for j in range(capacity)]  # nothing to wait for yet
    assert a[capacity:] == [max(a[j - 1] + 0.5, b[j - capacity]) for j in range(capacity, K)]
    assert a[-1] == b[K - 1 - capacity] > a[-2] + 0.5  # held, not just slow
    assert b == [0.5 + 2.0 * j for j in range(K)]  # the consumer never waits: it is the bottleneck
    # Unbounded, the producer runs through: each micro-batch as soon as the last one ended.
    assert _starts(simulate(plan, prof), "a") == [0.5 * j for j in range(K)]


def test_capacity_zero_or_none_is_unbounded():
    plan, prof = _chain(0.5, 2.0)
    unbounded = simulate(plan, prof, channel_capacity=None)
    zero = simulate(plan, prof, channel_capacity=0)
    assert zero.times == unbounded.times and zero.intervals == unbounded.intervals
    assert zero.times == pytest.approx((0.5 + 2.0 * K,), abs=1e-9)


@pytest.mark.parametrize("value, says", BAD_CAPACITIES)
def test_a_capacity_that_is_not_a_count_of_micro_batches_is_refused(value, says):
    plan, prof = _chain(0.5, 2.0)
    with pytest.raises(ValueError, match=rf"channel_capacity={value!r}: .*{says}") as e:
        simulate(plan, prof, channel_capacity=value)
    assert "use an integer >= 1" in str(e.value) and "or 0 for unbounded" in str(e.value)
    assert capacity_problems(value, "run.channel_capacity")[0].startswith(
        f"run.channel_capacity={value!r}: "
    )
    assert capacity_problems(None) == capacity_problems(0) == capacity_problems(4) == []
