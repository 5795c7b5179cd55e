"""``loomrl report RUN_DIR``: a finished run's measured timeline beside the plan's prediction.

Reads the files ``loomrl run`` leaves in its run directory:

- ``plan.json``: the :class:`~loomrl.plan.plan.Plan` (its ``timeline`` is the predicted intervals),
- ``timeline.jsonl``: one object per iteration, ``{"step", "measured_s", "predicted_s", "records"}``
  where each record is ``{"component", "rank", "devices", "kind", "micro_batch", "start", "end",
  "items"}`` with times in seconds from the iteration's start,
- ``run_summary.json`` (optional: a run killed outright has none; every number it holds is
  recomputed from ``timeline.jsonl``; a run that stopped on an error says so in its ``status``
  and ``error``, which the table repeats).

and writes ``timeline_measured_vs_predicted.png`` (predicted panel over measured panel on one time
axis), ``trace.json`` (Chrome / Perfetto trace of every recorded iteration, end to end) and prints
a table of predicted vs measured times. A run of ``profile=calibrate`` whose attempt ended
(finished with ``steps=1``, stopped, or resumed for one step) before its second iteration
calibrated the plan has no prediction: the table says "not known" and the figure's predicted
panel is empty, where the cost-free plan's 0 s would read as one. Imports neither torch nor Ray;
matplotlib only to draw.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loomrl.errors import LoomError
from loomrl.plan.plan import Plan
from loomrl.plan.timeline import Row, _row_key

__all__ = [
    "FIGURE_FILE",
    "TRACE_FILE",
    "Iteration",
    "ReportError",
    "RunData",
    "busy_seconds",
    "draw_measured_vs_predicted",
    "export_chrome_trace",
    "format_table",
    "load_run",
    "report_main",
]

log = logging.getLogger(__name__)

PLAN_FILE = "plan.json"
TIMELINE_FILE = "timeline.jsonl"
SUMMARY_FILE = "run_summary.json"
FIGURE_FILE = "timeline_measured_vs_predicted.png"
TRACE_FILE = "trace.json"

# Trace "processes" that are not devices: iteration markers, and records of workers without a device.
ITERATIONS_PID = -1
HOST_PID = -2


class ReportError(LoomError):
    """A run directory cannot be reported on (missing, incomplete or unreadable files)."""


@dataclass
class Iteration:
    """One line of ``timeline.jsonl``."""

    step: int
    measured_s: float
    predicted_s: float | None
    records: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RunData:
    """Everything ``loomrl report`` reads from a run directory."""

    run_dir: Path
    plan: Plan
    iterations: list[Iteration]  # in step order, one per step
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def warm(self) -> list[Iteration]:
        """Iterations after the first (warm-up: compilation, first onload, caches); all if only one.
        Of a resumed run, those of the attempt that wrote the summary after its own warm-up:
        earlier attempts ran on workers started anew, maybe on another plan than the one whose
        prediction the summary holds."""
        n = self.attempt_iterations  # reads the run directory: once
        mine = self.iterations[-n:] if n else self.iterations
        return mine[1:] or mine

    @property
    def attempt_iterations(self) -> int:
        """How many of the last iterations the summary's attempt of a resumed run ran (0: not
        a resumed run, or its summary is not the latest attempt's)."""
        from loomrl.run import pending_attempt

        times = self.summary.get("iteration_s")
        if not self.summary.get("attempts") or not isinstance(times, list) or not times:
            return 0
        if pending_attempt(self.run_dir, self.summary) is not None:
            return 0  # a later attempt, killed outright, ran after the summary's
        last = self.iterations[-1].step + 1
        done = self.summary.get("steps_done", self.summary.get("steps"))
        if done != last or len(times) > len(self.iterations):
            return 0
        return len(times)

    @property
    def calibrating(self) -> bool:
        """Whether ``plan.json`` is ``profile=calibrate``'s cost-free plan: the run stopped
        before its second iteration calibrated it, so the plan's 0 s predicts nothing."""
        return self.plan.method == "calibrate"

    @property
    def predicted_s(self) -> float | None:
        """The run's predicted iteration time; None when it has none (``calibrating``)."""
        p = self.summary.get("predicted_iteration_s")
        if isinstance(p, (int, float)) and not isinstance(p, bool):
            return float(p)
        return None if self.calibrating else self.plan.predicted_s

    @property
    def measured_median_s(self) -> float:
        return statistics.median(it.measured_s for it in self.warm)

    @property
    def on_prediction(self) -> list[Iteration]:
        """The warm iterations that ran on the prediction the run ended with (its timeline says
        which prediction each ran on): all of them unless the prediction was made or refreshed
        during the run (profile=calibrate, run.adapt); none when the run has no prediction."""
        pred = self.predicted_s
        if pred is None:
            return []
        return [
            it
            for it in self.warm
            if it.predicted_s is not None and math.isclose(it.predicted_s, pred, rel_tol=1e-9)
        ]

    def median_iteration(self) -> Iteration:
        """The iteration of median measured time (the lower one of an even count) among those
        that ran on the run's last prediction, else among the warm ones: the per-component
        table and the figure set that iteration against the plan's prediction, and an early
        iteration of a run whose costs moved since would show the move, not the model's error."""
        ranked = sorted(self.on_prediction or self.warm, key=lambda it: (it.measured_s, it.step))
        return ranked[(len(ranked) - 1) // 2]

    def iteration(self, step: int) -> Iteration:
        for it in self.iterations:
            if it.step == step:
                return it
        steps = [it.step for it in self.iterations]
        raise ReportError(
            f"step {step} is not in {TIMELINE_FILE} (recorded: {len(steps)} steps, "
            f"{steps[0]}..{steps[-1]}); pass one of those to --step (iterations count from 0; "
            "in metrics.jsonl the row of step N is the state after iteration N-1)"
        )

    def records_by_step(self) -> dict[int, list[dict[str, Any]]]:
        return {it.step: it.records for it in self.iterations}

    def iteration_s(self) -> dict[int, float]:
        return {it.step: it.measured_s for it in self.iterations}


# ----------------------------------------------------------------------- loading


def load_run(run_dir: str | Path) -> RunData:
    """Read ``plan.json``, ``timeline.jsonl`` and (if present) ``run_summary.json`` of a run.

    Raises :class:`ReportError` naming the directory or file and what is wrong with it.
    A ``timeline.jsonl`` line cut short by a crash is skipped with a warning; when a resumed run
    recorded a step twice, the later record wins.
    """
    d = Path(run_dir)
    if d.exists() and not d.is_dir():
        raise ReportError(
            f"{str(d)!r} is a file, not a run directory (pass the output_dir of a `loomrl run`)"
        )
    if not d.is_dir():
        raise ReportError(
            f"run directory {str(d)!r} does not exist (pass the output_dir of a `loomrl run`)"
        )
    missing = [f for f in (PLAN_FILE, TIMELINE_FILE) if not (d / f).is_file()]
    ended = _early_end(d) if missing else None
    if ended:
        raise ReportError(f"{str(d)!r}: no iteration to report; the {ended}")
    if missing:
        raise ReportError(
            f"{str(d)!r} has no {' or '.join(missing)}: is it the output_dir of a `loomrl run` "
            "that finished at least one iteration?"
        )
    try:
        plan = Plan.load(d / PLAN_FILE)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise ReportError(
            f"{d / PLAN_FILE} is not a readable plan ({type(e).__name__}: {e})"
        ) from None

    by_step: dict[int, Iteration] = {}
    # errors="replace": bytes that are no UTF-8 (a damaged disk block) spoil their line only,
    # which is then skipped like one cut short
    with open(d / TIMELINE_FILE, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                o = json.loads(line)
                if not isinstance(o, dict):
                    raise TypeError(f"a line must be an object, got {type(o).__name__}")
                predicted = o.get("predicted_s")
                it = Iteration(
                    step=int(o["step"]),
                    measured_s=_finite(o["measured_s"], "measured_s"),
                    predicted_s=None if predicted is None else _finite(predicted, "predicted_s"),
                    records=[_check_record(r) for r in o.get("records", [])],
                )
            except (ValueError, KeyError, TypeError) as e:
                log.warning("%s line %d unreadable (%s); skipped", d / TIMELINE_FILE, n, e)
                continue
            by_step[it.step] = it
    if not by_step:
        raise ReportError(f"{d / TIMELINE_FILE} holds no readable iteration")

    summary: dict[str, Any] = {}
    if (d / SUMMARY_FILE).is_file():
        try:
            summary = json.loads((d / SUMMARY_FILE).read_text())
        except ValueError as e:
            log.warning("%s unreadable (%s); using %s only", d / SUMMARY_FILE, e, TIMELINE_FILE)
        if not isinstance(summary, dict):
            log.warning("%s is not a JSON object; using %s only", d / SUMMARY_FILE, TIMELINE_FILE)
            summary = {}
    return RunData(d, plan, [by_step[s] for s in sorted(by_step)], summary)


def _check_record(r: Any) -> dict[str, Any]:
    if not isinstance(r, dict):
        raise TypeError(f"a record must be an object, got {type(r).__name__}")
    out = dict(r)
    out["component"] = str(r["component"])
    out["rank"] = int(r.get("rank", 0))
    out["devices"] = [int(x) for x in r.get("devices") or []]
    out["kind"] = str(r.get("kind", "run"))
    out["micro_batch"] = int(r.get("micro_batch", -1))
    out["start"] = _finite(r["start"], "start")
    out["end"] = _finite(r["end"], "end")
    return out


def _finite(value: Any, key: str) -> float:
    """A time read from timeline.jsonl: a run writes finite numbers only, so nan or inf there
    is damage (the table and the figure could not use it)."""
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{key} is {x}, not a finite number")
    return x


# ----------------------------------------------------------------------- numbers


def busy_seconds(spans: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` spans: wall time during which any of them runs.

    The union (not the sum) so that a component's predicted time (one interval per device group)
    and its measured time (one record per rank) are comparable. ``[(0, 2), (1, 3), (5, 6)] -> 4``.
    """
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((float(a), float(b)) for a, b in spans if b > a):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s  # type: ignore[operator]
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s  # type: ignore[operator]
    return total


def component_busy(
    plan: Plan, records: Sequence[Mapping[str, Any]]
) -> dict[str, tuple[float | None, float | None]]:
    """component -> (predicted busy s, measured busy s) of "run" work; None where one side lacks it."""
    pred: dict[str, list[tuple[float, float]]] = {}
    for i in plan.timeline:
        if i.kind == "run":
            pred.setdefault(i.component, []).append((i.start, i.end))
    meas: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        if r["kind"] == "run":
            meas.setdefault(r["component"], []).append((r["start"], r["end"]))
    names = list(dict.fromkeys([*pred, *meas]))
    return {
        c: (
            busy_seconds(pred[c]) if c in pred else None,
            busy_seconds(meas[c]) if c in meas else None,
        )
        for c in names
    }


def _rel(measured: float | None, predicted: float | None) -> str:
    if measured is None or not predicted:
        return "n/a"
    return f"{100.0 * (measured - predicted) / predicted:+.1f}%"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _refresh_lines(run: RunData, pred: float | None) -> list[str]:
    """When the prediction changed during the run (calibrated, refreshed from the warm
    iterations, or by run-time adaptation as the costs moved): the planned one, when the summary
    has it, and the iterations run on the prediction the run ended with against it. The
    measured median above spans every warm iteration of the plan: in a run whose responses
    shorten as it learns it holds the slower early steps (the GRPO example: 7.7 s predicted at
    the end, 10.3 s over all 19 warm steps, 7.2 s over the four run on that prediction)."""
    if pred is None:
        return []
    lines = []
    planned = run.summary.get("planned_iteration_s")
    if isinstance(planned, (int, float)) and not math.isclose(planned, pred, rel_tol=1e-9):
        meas = run.measured_median_s
        lines.append(
            f"  planned iteration       {planned:10.4f} s  (measured vs planned {_rel(meas, planned)})"
        )
    after = [it.measured_s for it in run.on_prediction]
    if after and (lines or len(after) < len(run.warm)):
        m = statistics.median(after)
        lines.append(
            f"  after the refresh       {m:10.4f} s  (median of {len(after)} iteration(s) run on"
            f" the refreshed prediction: {_rel(m, pred)})"
        )
    return lines


def _early_end(d: Path) -> str | None:
    """How a run that recorded no iteration ended, from its summary (None: no such summary)."""
    try:
        summary = json.loads((d / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    lines = _status_lines(summary) if isinstance(summary, dict) else []
    return lines[0].strip() if lines else None


def _status_lines(summary: Mapping[str, Any]) -> list[str]:
    """A run that did not finish: how it ended, after how many steps, and why."""
    status = summary.get("status")
    if status in (None, "finished"):
        return []
    done = summary.get("steps_done")
    error = str(summary.get("error") or "no error recorded").strip().splitlines()[0]
    return [f"  run {status} after {done if done is not None else '?'} step(s): {error[:300]}"]


def _unsummarised_lines(run_dir: Path, summary: Mapping[str, Any] | None) -> list[str]:
    """An attempt that has written no summary yet (``loomrl.run.pending_attempt``): still
    running, or killed outright."""
    from loomrl.run import _number, pending_attempt

    mark = pending_attempt(Path(run_dir), dict(summary) if summary else None) or {}
    done, at = _number(mark.get("steps_done")), _number(mark.get("updated"))
    if done is None or at is None:  # none, or a damaged file
        return []
    try:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    except (OverflowError, OSError, ValueError):  # a time no calendar holds
        return []
    return [
        f"  latest attempt          no summary written: still running, or killed outright "
        f"({int(done)} step(s) done, the last at {when})"
    ]


def _attempt_lines(summary: Mapping[str, Any]) -> list[str]:
    """A resumed or restarted run: how its earlier attempts ended and the wall time of all."""
    from loomrl.run import listed_attempts

    earlier = listed_attempts(summary)
    if not earlier:
        return []
    ends = ", ".join(
        f"{a.get('status') or '?'} after "
        f"{a['steps_done'] if a.get('steps_done') is not None else '?'} step(s)"
        for a in earlier
    )
    total = summary.get("wall_s_total")
    wall = f"; wall time of all {total:.1f} s" if isinstance(total, (int, float)) else ""
    return [f"  attempts                {len(earlier) + 1} (before this one: {ends}){wall}"]


def format_table(run: RunData, it: Iteration) -> str:
    """The printed summary: iteration times, relative error, per-component busy time of step ``it``."""
    warm = run.warm
    pred, meas = run.predicted_s, run.measured_median_s
    lines = [
        f"run {run.run_dir}: {len(run.iterations)} iteration(s) recorded, plan {run.plan.mode} "
        f"on {run.plan.devices} device(s), micro-batch {run.plan.micro_batch}",
        _predicted_line(pred),
        f"  measured median         {meas:10.4f} s  ({_of_attempt(run)}after warm-up: "
        f"{len(warm)} iteration(s), "
        f"steps {warm[0].step}..{warm[-1].step})",
        f"  relative error          {_rel(meas, pred):>10}  (measured vs predicted)",
        *_refresh_lines(run, pred),
        *_status_lines(run.summary),
        *_attempt_lines(run.summary),
        *_unsummarised_lines(run.run_dir, run.summary),
        "",
        f"busy time per component, step {it.step} (measured {it.measured_s:.4f} s):",
    ]
    busy = component_busy(run.plan, it.records)
    if run.calibrating:  # the cost-free plan's intervals are placeholders, not predictions
        busy = {c: (None, m) for c, (_, m) in busy.items()}
    w = max([len("component"), len("(switching)"), *(len(c) for c in busy)])
    lines.append(f"  {'component':<{w}}  {'predicted s':>12}  {'measured s':>12}  {'error':>8}")
    for c, (p, m) in busy.items():
        lines.append(f"  {c:<{w}}  {_s(p):>12}  {_s(m):>12}  {_rel(m, p):>8}")
    sw_p = None
    if not run.calibrating:
        sw_p = busy_seconds((i.start, i.end) for i in run.plan.timeline if i.kind == "switch")
    sw_m = busy_seconds((r["start"], r["end"]) for r in it.records if r["kind"] != "run")
    lines.append(f"  {'(switching)':<{w}}  {_s(sw_p):>12}  {_s(sw_m):>12}  {_rel(sw_m, sw_p):>8}")
    return "\n".join(lines)


def _of_attempt(run: RunData) -> str:
    return "this attempt's, " if run.attempt_iterations else ""


NOT_CALIBRATED = (
    "not known: profile=calibrate takes the plan's costs from an attempt's second iteration, "
    "and this attempt ended before it"
)


def _predicted_line(pred: float | None) -> str:
    if pred is None:
        return f"  predicted iteration     {NOT_CALIBRATED}"
    return f"  predicted iteration     {pred:10.4f} s"


# ----------------------------------------------------------------------- chrome trace


def export_chrome_trace(
    records_by_step: Mapping[int, Sequence[Mapping[str, Any]]],
    path: str | Path,
    iteration_s: Mapping[int, float] | None = None,
) -> Path:
    """Write measured records as a Chrome / Perfetto trace (``chrome://tracing``, ui.perfetto.dev).

    One "X" (complete) event per record and device: ``pid`` is the device index (``-2`` for a
    worker without a device), ``tid`` numbers one (component, rank) pair, named by metadata
    events; ``ts``/``dur`` are microseconds. Iterations are laid end to end in step order, each
    taking ``iteration_s[step]`` (or its last record's end, whichever is later), and each gets a
    ``step N`` event on pid ``-1``. Returns the path.
    """
    threads = sorted(
        {
            (str(r["component"]), int(r.get("rank", 0)))
            for rs in records_by_step.values()
            for r in rs
        }
    )
    tid_of = {key: i + 1 for i, key in enumerate(threads)}
    events: list[dict[str, Any]] = []
    used: set[tuple[int, int]] = set()
    offset = 0.0
    for step in sorted(records_by_step):
        recs = records_by_step[step]
        length = max([float((iteration_s or {}).get(step, 0.0)), *(float(r["end"]) for r in recs)])
        events.append(
            _x(f"step {step}", "iteration", offset, length, ITERATIONS_PID, 0, {"step": step})
        )
        for r in recs:
            comp, rank, kind = str(r["component"]), int(r.get("rank", 0)), str(r.get("kind", "run"))
            name = comp if kind == "run" else f"{comp} {kind}"
            args = {
                "step": step,
                "rank": rank,
                "micro_batch": r.get("micro_batch"),
                "items": r.get("items"),
                "devices": list(r.get("devices") or []),
            }
            start, end = float(r["start"]), float(r["end"])
            for pid in list(r.get("devices") or []) or [HOST_PID]:
                tid = tid_of[(comp, rank)]
                used.add((int(pid), tid))
                events.append(_x(name, kind, offset + start, end - start, int(pid), tid, args))
        offset += length
    meta: list[dict[str, Any]] = [_meta("process_name", ITERATIONS_PID, 0, "iterations")]
    meta.append(_meta("process_sort_index", ITERATIONS_PID, 0, None, sort_index=-1))
    for pid in sorted({p for p, _ in used}):
        meta.append(
            _meta("process_name", pid, 0, "no device" if pid == HOST_PID else f"device {pid}")
        )
    for pid, tid in sorted(used):
        comp, rank = threads[tid - 1]
        meta.append(_meta("thread_name", pid, tid, f"{comp} rank {rank}"))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"traceEvents": meta + events, "displayTimeUnit": "ms"}))
    return out


def _x(
    name: str, cat: str, start_s: float, dur_s: float, pid: int, tid: int, args: dict
) -> dict[str, Any]:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": round(start_s * 1e6, 3),
        "dur": round(max(dur_s, 0.0) * 1e6, 3),
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def _meta(
    kind: str, pid: int, tid: int, name: str | None, sort_index: int | None = None
) -> dict[str, Any]:
    args: dict[str, Any] = {"name": name} if sort_index is None else {"sort_index": sort_index}
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}


# ----------------------------------------------------------------------- the figure


def predicted_rows(plan: Plan) -> list[Row]:
    """The plan's intervals as one row per device (``draw_timeline``'s rows are per device range)."""
    rows: list[Row] = []
    for i in plan.timeline:
        text = "" if i.micro_batch < 0 else str(i.micro_batch)
        for d in range(*i.devices):
            rows.append((f"dev {d}", _comp_key(i.component, i.kind), i.start, i.end, text))
    return rows


def measured_rows(records: Sequence[Mapping[str, Any]]) -> list[Row]:
    """Measured records as one row per device (per component rank for a worker without a device)."""
    rows: list[Row] = []
    for r in records:
        mb = int(r.get("micro_batch", -1))
        text = "" if mb < 0 else str(mb)
        labels = [f"dev {d}" for d in r.get("devices") or []] or [
            f"{r['component']} r{r.get('rank', 0)}"
        ]
        for lab in labels:
            rows.append(
                (
                    lab,
                    _comp_key(r["component"], r["kind"]),
                    float(r["start"]),
                    float(r["end"]),
                    text,
                )
            )
    return rows


def _comp_key(component: str, kind: str) -> str:
    # Same suffix draw_timeline uses for switches, so legend entries read alike in both figures.
    return component if kind == "run" else f"{component} (switch)"


def draw_measured_vs_predicted(
    predicted: Sequence[Row],
    measured: Sequence[Row],
    path: str | Path,
    predicted_s: float | None,
    measured_s: float,
    title: str = "",
) -> Path:
    """Two Gantt panels, predicted over measured, on one time axis with one colour per component.

    Rows are ``draw_timeline``'s ``(row_label, component, start, end, label)``; components named
    ``"X (switch)"`` (onload/offload) are drawn hatched in X's colour. Each row's idle time up to
    the iteration's end is shaded grey, and the iteration's end is a dashed line. A
    ``predicted_s`` of None (no prediction: an uncalibrated plan) leaves the predicted panel
    empty and says so.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    def base(c: str) -> str:
        return c.removesuffix(" (switch)")

    if predicted_s is None:
        predicted = []
    comps = sorted({base(r[1]) for r in (*predicted, *measured)})
    cmap = plt.get_cmap("tab10" if len(comps) <= 10 else "tab20")
    color = {c: cmap(i % cmap.N) for i, c in enumerate(comps)}
    panels = [("predicted (plan.json)", predicted, predicted_s), ("measured", measured, measured_s)]
    labels = [sorted({r[0] for r in rows}, key=_row_key) or ["(none)"] for _, rows, _ in panels]
    ends = [x for x in (predicted_s, measured_s) if x is not None]
    end = max([*ends, *(r[3] for r in (*predicted, *measured))]) or 1.0
    fig, axes = plt.subplots(
        2,
        1,
        sharex=True,
        figsize=(12, 0.4 * (len(labels[0]) + len(labels[1])) + 2.8),
        gridspec_kw={"height_ratios": [max(len(labels[0]), 1), max(len(labels[1]), 1)]},
    )
    for ax, (name, rows, iter_s), labs in zip(axes, panels, labels, strict=True):
        y = {lab: i for i, lab in enumerate(labs)}
        if iter_s is None:
            ax.set_yticks([])
            ax.set_title(f"{name}: no prediction (not calibrated)", fontsize=9, loc="left")
            continue
        # Idle is what the grey shows through between boxes.
        ax.barh(range(len(labs)), iter_s, left=0, height=0.8, color="0.92", edgecolor="none")
        for lab, comp, s, e, text in rows:
            sw = comp != base(comp)
            ax.barh(
                y[lab],
                e - s,
                left=s,
                height=0.8,
                color=color[base(comp)],
                alpha=0.55 if sw else 1.0,
                hatch="////" if sw else None,
                edgecolor="black",
                linewidth=0.3,
            )
            if text and (e - s) > end / 60:
                ax.text((s + e) / 2, y[lab], text, ha="center", va="center", fontsize=6)
        ax.axvline(iter_s, color="black", linestyle="--", linewidth=0.8)
        ax.set_yticks(range(len(labs)))
        ax.set_yticklabels(labs)
        ax.set_ylim(len(labs) - 0.5, -0.5)
        ax.set_title(f"{name}: {iter_s:.3f} s", fontsize=9, loc="left")
    axes[1].set_xlabel("seconds from the iteration's start")
    axes[1].set_xlim(0, end * 1.02)
    handles = [Patch(color=color[c], label=c) for c in comps]
    handles += [
        Patch(facecolor="white", edgecolor="black", hatch="////", label="onload / offload"),
        Patch(color="0.92", label="idle"),
    ]
    axes[1].legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35),
        ncol=min(len(handles), 6),
        fontsize=8,
    )
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


# ----------------------------------------------------------------------- the command


def format_adaptation(run_dir: Path) -> str | None:
    """Run-time adaptation events of the run (``adapt.jsonl``), one line each, and which plan
    the last attempt of a resumed run that had adapted started on (the summary's
    ``adapt_start``); None if neither."""
    path = Path(run_dir) / "adapt.jsonl"
    start = _adapt_start(Path(run_dir))
    lines = []
    for raw in path.read_text().splitlines() if path.exists() else []:
        try:
            ev = json.loads(raw)
            errs = ", ".join(f"{100 * e:+.0f}%" for e in ev["errors"])
            # attempt 0 is the run's first; a restart's rows say which attempt decided
            again = f" (attempt {ev['attempt'] + 1})" if ev.get("attempt") else ""
            head = f"  step {ev['step']}{again}: off the prediction by {errs}; "
            if ev["action"] == "replan":
                why = f": {ev['changed_because']}" if ev.get("changed_because") else ""
                lines.append(
                    head + f"re-planned to {ev['mode']} {ev['assignment']} micro-batch "
                    f"{ev['micro_batch']} (predicted {ev['best_s']:.4f} s vs {ev['refreshed_s']:.4f}"
                    f" s), redeploy {ev['stall_s']:.2f} s{why}"
                )
            else:
                why = f": {ev['kept_because']}" if ev.get("kept_because") else ""
                lines.append(
                    head + f"profile refreshed, plan kept (now {ev['refreshed_s']:.4f} s){why}"
                )
        except (ValueError, KeyError, TypeError):
            lines.append("  (an unreadable line in adapt.jsonl was skipped)")
    if not lines and start is None:
        return None
    head = f"run-time adaptation ({len(lines)} event(s), adapt.jsonl):"
    if start is not None:  # a restart's plan: not an event of adapt.jsonl, so not counted
        lines.append(f"  the last attempt started: {start}")
    return head + "\n" + "\n".join(lines)


def _adapt_start(run_dir: Path) -> str | None:
    """What the summary's ``adapt_start`` said (the plan a resumed run that had adapted started
    on), without its ``adapt:`` tag; None where there is no such line."""
    try:
        said = json.loads((run_dir / "run_summary.json").read_text())["adapt_start"]["said"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return said.removeprefix("adapt: ") if isinstance(said, str) else None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loomrl report",
        description="Compare a run's measured timeline with its plan's prediction: "
        f"writes {FIGURE_FILE} and {TRACE_FILE} and prints a table.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="output_dir of a `loomrl run`")
    p.add_argument(
        "--step",
        type=int,
        default=None,
        metavar="N",
        help="iteration to draw, counted from 0 as in timeline.jsonl (metrics.jsonl's step N "
        "follows iteration N-1; default: the median-time one after warm-up, among those run on "
        "the run's last prediction)",
    )
    p.add_argument(
        "--out", default=None, metavar="DIR", help="where to write the files (default: RUN_DIR)"
    )
    return p


def report_main(argv: list[str]) -> int:
    """``loomrl report RUN_DIR [--step N] [--out DIR]``; returns the exit code (2: unusable RUN_DIR)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2), already printed by argparse
        return int(e.code or 0)
    try:
        run = load_run(args.run_dir)
        it = run.median_iteration() if args.step is None else run.iteration(args.step)
    except ReportError as e:
        print(f"loomrl report: error: {e}", file=sys.stderr)
        return 2
    if args.out is not None and not args.out.strip():
        # Path("") is ".": the files would land in the current folder, not where asked
        print(
            f"loomrl report: error: --out {args.out!r} is an empty path; name a directory (or "
            "drop --out to write into RUN_DIR)",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out) if args.out is not None else run.run_dir
    if out.exists() and not out.is_dir():
        print(
            f"loomrl report: error: --out {str(out)!r} is a file, not a directory; name a "
            "directory (it is made if missing)",
            file=sys.stderr,
        )
        return 2
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(
            f"loomrl report: error: cannot create --out {str(out)!r}: {e.strerror}", file=sys.stderr
        )
        return 2
    try:
        return _write_report(args, run, it, out)
    except OSError as e:  # a full disk, a folder that takes no new file
        print(
            f"loomrl report: error: writing into {str(out)!r} failed ({e.strerror or e}); "
            "pass --out DIR, a directory that can be written",
            file=sys.stderr,
        )
        return 2


def _write_report(args: argparse.Namespace, run: Any, it: Any, out: Path) -> int:
    """Print the table, write the figure and the trace into ``out``."""
    print(format_table(run, it))
    print()
    adapted = format_adaptation(run.run_dir)
    if adapted:
        print(adapted)
        print()
    which = "median after warm-up" if args.step is None else "--step"
    fig = draw_measured_vs_predicted(
        predicted_rows(run.plan),
        measured_rows(it.records),
        out / FIGURE_FILE,
        predicted_s=run.predicted_s,
        measured_s=it.measured_s,
        title=f"{run.run_dir.name}: step {it.step} ({which}), {run.plan.mode} plan",
    )
    print(f"wrote {fig}  (step {it.step}: predicted above, measured below)")
    trace = export_chrome_trace(run.records_by_step(), out / TRACE_FILE, run.iteration_s())
    print(
        f"wrote {trace}  ({len(run.iterations)} iteration(s) end to end; open in ui.perfetto.dev or chrome://tracing)"
    )
    return 0


if __name__ == "__main__":  # python -m loomrl.report RUN_DIR
    sys.exit(report_main(sys.argv[1:]))
