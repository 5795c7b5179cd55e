"""Same seeds, different plans -> bit-identical parameters (tiny GRPO on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _tiny_grpo import COMMON, CONFIG, STEPS, run_main


def _run(tmp_path: Path, placement: str) -> dict:
    out = tmp_path / placement
    run_main(CONFIG, [f"placement={placement}", *COMMON, f"steps={STEPS}", f"output_dir={out}"])
    return _summary(out)


def _summary(out: Path) -> dict:
    return json.loads((out / "run_summary.json").read_text())


@pytest.mark.timeout(900)
def test_temporal_spatial_hybrid_give_identical_parameters(cluster, tiny_grpo_temporal, tmp_path):
    # The temporal run is the session's (the resume tests' reference too); the same overrides.
    runs = {"temporal": _summary(tiny_grpo_temporal)}
    runs |= {p: _run(tmp_path, p) for p in ("spatial", "hybrid")}
    modes = {p: r["plan"]["mode"] for p, r in runs.items()}
    assert modes == {"temporal": "temporal", "spatial": "spatial", "hybrid": "hybrid"}
    # The plans really differ in where components run.
    assert runs["temporal"]["plan"]["assignment"] != runs["spatial"]["plan"]["assignment"]
    shas = {p: r["param_sha256"] for p, r in runs.items()}
    assert len(set(shas.values())) == 1, shas
    for r in runs.values():
        assert r["steps"] == STEPS
        assert r["predicted_iteration_s"] > 0 and r["measured_iteration_s"] > 0
        # Training moved the parameters: rewards vary, so advantages are non-zero.
        assert r["metrics"]["grad_norm"] > 0
