"""The main job (README command 1) run twice the same way ends with the same parameters (slow:
two 3-step runs of SmolLM2-135M-Instruct, about 4 minutes on 2 cores). Its workers keep the
library's thread counts (2 on this machine), unlike the placement test's tiny runs at
``run.threads: 1``: a kernel that adds in thread order parts the runs within two steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loomrl.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_main_job_run_twice_ends_with_the_same_parameters(cluster, tmp_path):
    summaries, grads = [], []
    for name in ("a", "b"):
        out = tmp_path / name
        args = ["steps=3", "eval_every=100", "run.checkpoint_every=0", f"output_dir={out}"]
        assert main(["run", str(ROOT / "examples/grpo_math_smollm2.yaml"), *args]) == 0
        summaries.append(json.loads((out / "run_summary.json").read_text()))
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        grads.append([r["grad_norm"] for r in rows if "grad_norm" in r])
    assert grads[0] == grads[1] and len(grads[0]) == 3
    assert summaries[0]["param_sha256"] == summaries[1]["param_sha256"]
