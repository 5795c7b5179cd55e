"""scripts/gpu/trial_windows.py rebuilds a stored GPU run's trial window under each model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_windows_of_a_stored_one_h200_run():
    spec = importlib.util.spec_from_file_location(
        "trial_windows", ROOT / "scripts/gpu/trial_windows.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    stored = json.loads(
        (ROOT / "docs/results/gpu/confirm/cf/embodied_px_e128_s32_c3.json").read_text()
    )
    run = next(r for r in stored["results"] if r["mode"] == "hybrid")
    w = mod.windows(run, stored["args"]["steps"], stored["args"]["pixels"], env_cores=3.0)
    # That run's trial timed k = 2 fastest (0.280 s against k = 4's 0.403 and k = 8's 0.814).
    assert w["measured"] == "k2"
    # fixed_hops hides each call's fixed cost behind the ring and starts at k = 8; chained
    # pays it per call, and its window holds k = 2.
    assert w["fixed_hops"]["window"] == [4, 8, 16] and w["fixed_hops"]["best"] == "k8"
    assert 2 in w["chained"]["window"] and 8 not in w["chained"]["window"]
