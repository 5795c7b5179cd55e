"""The GRPO-vs-TRL benchmark runs end to end on the tiny model and ends with its ratio line."""

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
