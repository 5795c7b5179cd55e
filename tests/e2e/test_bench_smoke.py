"""Benchmarks run end to end on small settings and end with their result lines (slow)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_grpo_vs_trl_tiny(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "grpo_vs_trl.py"),
        "--model",
        "tiny-llama",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--batch",
        "2",
        "--group-size",
        "2",
        "--max-new-tokens",
        "8",
        "--train-micro-batch",
        "4",
        "--out",
        str(out),
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1100, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"ratio: \d+\.\d{3}", last), last
    res = json.loads(out.read_text())
    for side in ("loomrl", "trl"):
        assert res[side]["s_per_step"] > 0
        assert res[side]["gen_tokens_per_step"] > 0
        assert res[side]["tokens_per_s"] > 0
    # 2 prompts x 2 responses x at most 8 tokens each.
    assert res["trl"]["gen_tokens_per_step"] <= 32
    assert res["loomrl"]["gen_tokens_per_step"] <= 32
    assert float(last.split()[1]) == pytest.approx(res["ratio"], abs=1e-3)


def _run(args: list[str], timeout: int = 900) -> str:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines, f"exit {proc.returncode} with nothing printed: {proc.stderr[-3000:]}"
    return lines[-1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_adapt_benchmark_small(tmp_path):
    out = tmp_path / "adapt.json"
    last = _run(
        [
            "benchmarks/adapt.py",
            "--scenario=stale",
            "--size=64",
            "--batch=8",
            "--steps=6",
            "--window=2",
            f"--out={out}",
        ]
    )
    assert re.fullmatch(
        r"detection_lag: (\d+|None) redeploy_stall_s: \d+\.\d\d replans: \d+ oscillations: \d+ "
        r"throughput_lost: -?\d+\.\d{3} adaptive_vs_static: \d+\.\d{3}",
        last,
    ), last
    res = json.loads(out.read_text())
    assert res["events"], "a profile 100x off must be noticed"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_flow_modes_benchmark_small(tmp_path):
    out = tmp_path / "flow.json"
    last = _run(["benchmarks/flow_modes.py", "--size=64", "--batch=8", "--steps=4", f"--out={out}"])
    assert re.fullmatch(
        r"auto_mode: \w+ best_mode: \w+ auto_vs_best: \d+\.\d{3} max_gap: \d+\.\d{3}", last
    ), last
    rows = json.loads(out.read_text())["rows"]
    assert all("refreshed_s" in r for r in rows.values() if r["feasible"])
