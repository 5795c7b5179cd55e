"""scripts/pipe_serve_sim.py: the pipe rollout model the serving rules are compared on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _scripts import load_script  # noqa: E402


def _sim():
    return load_script("scripts/pipe_serve_sim.py")


def test_a_lockstep_temporal_rollout_is_steps_times_one_round_trip():
    """Without noise, k = 1: every step is the env step, a hand-off each way and one call on all
    rows; the first observations come one hand-off in."""
    sim = _sim()
    c = sim.Costs(
        num_envs=64,
        workers=4,
        steps=10,
        env_ms=2.0,
        call_ms=0.5,
        row_us=10.0,
        latency_ms=0.1,
        noise=0.0,
    )
    r = sim.simulate(c, 1, "lockstep")
    call = 0.5 + 10.0 * 64 / 1000.0
    assert r["span_ms"] == pytest.approx(0.1 + 10 * (call + 0.2 + 2.0))
    assert r["calls"] == 10 and r["policy_busy_ms"] == pytest.approx(10 * call)


@pytest.mark.parametrize("rule", ["lockstep", "ready", "group"])
def test_every_rule_acts_on_every_part_once_a_step(rule):
    """k = 2 on 4 env workers: 8 parts a step. Lockstep acts group by group (2 calls a step);
    ready and group never act on fewer parts than lockstep's calls hold in all (their calls
    take one or more parts), and none leaves a part unacted (the rollout ends)."""
    sim = _sim()
    c = sim.Costs(num_envs=64, workers=4, steps=6, env_ms=2.0, noise=0.2)
    r = sim.simulate(c, 2, rule, seed=3)
    assert r["span_ms"] > 6 * 2.0
    if rule == "lockstep":
        assert r["calls"] == 2 * 6
    else:
        assert 1 <= r["calls"] <= 8 * 6
    # The policy's busy time is its calls' fixed cost plus every row once a step.
    rows_ms = 64 * 6 * c.row_us / 1000.0
    assert r["policy_busy_ms"] == pytest.approx(r["calls"] * c.call_ms + rows_ms)
