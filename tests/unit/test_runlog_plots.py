"""plot_run: standard plots from metrics.jsonl, skipped keys, the generic per-key fallback."""

from __future__ import annotations

import logging

import pytest
from matplotlib.image import imread

from loomrl.plots import metric_series, plot_run
from loomrl.runlog import RunLogger


def _log_run(run_dir, rows):
    with RunLogger(run_dir, use_tensorboard=False, progress=False) as rl:
        for step, metrics in rows:
            rl.log(step, metrics)


def test_reasoning_run_plots(tmp_path):
    rows = []
    for step in range(1, 26):
        m = {
            "reward_mean": step / 25,
            "kl": 0.001 * step,
            "response_len": 100 + step,
            "tokens_per_s": 1000.0,
            "time/rollout": 2.0,
            "time/update": 1.0,
        }
        if step % 5 == 0:
            m["eval_accuracy"] = step / 50
        rows.append((step, m))
    _log_run(tmp_path, rows)
    paths = plot_run(tmp_path)
    assert [p.name for p in paths] == [
        "reward.png",
        "kl.png",
        "response_len.png",
        "tokens_per_s.png",
        "time_per_stage.png",
    ]
    for p in paths:
        assert p.parent == tmp_path / "plots"
        img = imread(p)
        assert img.shape[0] > 100 and img.shape[1] > 100


def test_embodied_run_and_absent_keys_skipped(tmp_path):
    _log_run(tmp_path, [(s, {"episode_return": float(s)}) for s in range(5)])
    out = tmp_path / "elsewhere"
    assert [p.name for p in plot_run(tmp_path, out)] == ["episode_return.png"]
    assert (out / "episode_return.png").is_file()


def test_generic_keys_and_missing_key_warning(tmp_path, caplog):
    _log_run(tmp_path, [(s, {"loss/policy": 1.0 / (s + 1), "note": "x"}) for s in range(3)])
    with caplog.at_level(logging.WARNING, logger="loomrl.plots"):
        paths = plot_run(tmp_path, keys=["loss/policy", "nope", "note"])
    assert [p.name for p in paths] == ["metric_loss_policy.png"]
    assert "no numeric values of 'nope'" in caplog.text
    assert "no numeric values of 'note'" in caplog.text


def test_metric_series_last_value_per_step_and_numbers_only():
    records = [
        {"step": 2, "r": 1.0},
        {"step": 1, "r": 0.5},
        {"step": 2, "r": 3.0},  # a resumed run logged step 2 again
        {"step": 3, "r": float("nan")},
        {"step": 4, "r": True},
        {"step": 5, "r": "x"},
        {"step": 6},
    ]
    assert metric_series(records, "r") == ([1, 2], [0.5, 3.0])


def test_no_metrics_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        plot_run(tmp_path)


def test_ema_is_bias_corrected():
    from loomrl.plots import _ema

    assert _ema([1.0, 1.0, 1.0], 0.5) == [1.0, 1.0, 1.0]
    # avg1 = 0.5*0 = 0 -> 0/(1-0.5); avg2 = 0.5*0 + 0.5*2 = 1 -> 1/(1-0.25) = 4/3
    assert _ema([0.0, 2.0], 0.5) == pytest.approx([0.0, 4 / 3])
