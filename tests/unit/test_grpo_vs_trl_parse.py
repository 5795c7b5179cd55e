"""benchmarks/grpo_vs_trl.py reads loomrl's planning time from the run's plan line."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _scripts import load_script  # noqa: E402


def test_the_plan_line_is_read_whether_or_not_the_run_profiled():
    bench = load_script("benchmarks/grpo_vs_trl.py")
    assert bench.profiling_seconds("x\nplan (12.3s incl. profiling):\n") == 12.3
    # profile=calibrate (what the comparison runs) profiles nothing: the line says so
    assert bench.profiling_seconds("plan (4.5s incl. starting the workers):\n") == 4.5
    assert bench.profiling_seconds("no plan line") is None
