"""PNG plots of a run's ``metrics.jsonl``.

``plot_run`` draws the standard views whose keys the run logged and skips the rest:

    reward.png          reward_mean and eval_accuracy (held-out) against step
    kl.png              kl
    response_len.png    response_len
    tokens_per_s.png    tokens_per_s
    time_per_stage.png  every key starting with "time/" (seconds per stage)
    episode_return.png  episode_return (embodied runs)

plus one ``metric_<key>.png`` for each key passed in ``keys``. Plotting uses matplotlib's
Agg canvas directly, so it never touches pyplot's global state or needs a display.
When a run was resumed and logged a step twice, the last value of that step is drawn.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loomrl.runlog import read_metrics

__all__ = ["plot_run", "metric_series"]

log = logging.getLogger(__name__)

# (file name, title, [(key, panel label)]): each key gets its own panel, sharing the step axis.
_STANDARD: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "reward.png",
        "Reward and held-out accuracy",
        [("reward_mean", "mean reward"), ("eval_accuracy", "held-out accuracy")],
    ),
    ("kl.png", "KL to the reference policy", [("kl", "KL")]),
    ("response_len.png", "Response length", [("response_len", "tokens")]),
    ("tokens_per_s.png", "Throughput", [("tokens_per_s", "tokens / s")]),
    ("episode_return.png", "Episode return", [("episode_return", "return")]),
]
_SMOOTH_FROM = 20  # with this many points or more, draw a smoothed line over the raw one


def metric_series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of one metric, sorted by step, numbers only, last value per step."""
    by_step: dict[int, float] = {}
    for r in records:
        v = r.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        by_step[int(r["step"])] = float(v)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def plot_run(
    run_dir: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    keys: Sequence[str] = (),
) -> list[Path]:
    """Draw the run's plots into ``out_dir`` (default ``run_dir/plots``); return the files written.

    ``keys`` adds a plain line plot per metric key; a key the run never logged is skipped
    with a warning. Raises ``FileNotFoundError`` when the run has no ``metrics.jsonl``.
    """
    records = read_metrics(run_dir)
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    for filename, title, panels in _STANDARD:
        series = [(label, *metric_series(records, key)) for key, label in panels]
        series = [s for s in series if s[1]]
        if series:
            written.append(_draw_panels(out / filename, title, series))

    stage_keys = sorted({k for r in records for k in r if k.startswith("time/")})
    stages = [(k.removeprefix("time/"), *metric_series(records, k)) for k in stage_keys]
    stages = [s for s in stages if s[1]]
    if stages:
        written.append(
            _draw_overlay(out / "time_per_stage.png", "Time per stage", "seconds", stages)
        )

    for key in keys:
        steps, values = metric_series(records, key)
        if not steps:
            log.warning("no numeric values of %r in %s; plot skipped", key, run_dir)
            continue
        name = "metric_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", key) + ".png"
        written.append(_draw_panels(out / name, key, [(key, steps, values)]))
    return written


def _figure(rows: int) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(7, 2.6 * rows + 0.6), layout="constrained")


def _draw_panels(path: Path, title: str, series: list[tuple[str, list[int], list[float]]]) -> Path:
    fig = _figure(len(series))
    axes = fig.subplots(len(series), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (label, steps, values) in zip(axes, series, strict=True):
        _line(ax, steps, values, label)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    return path


def _draw_overlay(
    path: Path, title: str, ylabel: str, series: list[tuple[str, list[int], list[float]]]
) -> Path:
    fig = _figure(1)
    ax = fig.subplots()
    for label, steps, values in series:
        _line(ax, steps, values, label)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    return path


def _line(ax: Any, steps: list[int], values: list[float], label: str) -> None:
    # Sparse series (evaluations every N steps) need markers to be readable.
    marker = "o" if len(steps) <= 30 else None
    if len(steps) >= _SMOOTH_FROM:
        (raw,) = ax.plot(steps, values, alpha=0.3, linewidth=1)
        # A window of about 1/20 of the run: smooth enough to read, short enough not to lag.
        decay = 1 - 1 / max(2.0, len(steps) / 20)
        ax.plot(steps, _ema(values, decay), color=raw.get_color(), linewidth=1.8, label=label)
    else:
        ax.plot(steps, values, marker=marker, markersize=3, label=label)


def _ema(values: list[float], decay: float) -> list[float]:
    """Exponential moving average, bias-corrected so the first points are not pulled to zero."""
    out, avg = [], 0.0
    for i, v in enumerate(values, start=1):
        avg = decay * avg + (1 - decay) * v
        out.append(avg / (1 - decay**i))
    return out
