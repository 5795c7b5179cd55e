"""A plan file for the embodied cycle is checked against the cluster before any worker starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from loomrl.cycle_trial import check_plan_devices
from loomrl.errors import PlanError
from loomrl.plan import load_profile, search_all

ROOT = Path(__file__).resolve().parents[2]


def test_a_plan_for_more_devices_than_the_cluster_has_is_refused_naming_each_component():
    plan = search_all(load_profile(ROOT / "examples/profiles/embodied_cycle_gpu_sim.yaml"))["best"]
    assert plan.devices == 8
    check_plan_devices(plan, 8, "plan8.json")  # fits as planned
    with pytest.raises(PlanError) as e:
        check_plan_devices(plan, 2, "plan8.json")
    msg = str(e.value)
    assert "run.placement=plan8.json" in msg
    assert "the plan uses 8 devices but the cluster has 2" in msg
    for c in plan.assignment():
        assert f"the plan places {c!r} on devices" in msg
    assert "loomrl plan PROFILE --devices 2 --save FILE" in msg
