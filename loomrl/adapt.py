"""Run-time adaptation: notice when iterations leave the plan's prediction, refresh the profile
from what the workers recorded, re-plan, and redeploy only when it pays.

The pieces are pure functions over profiles, plans and measured timelines (tested on their own);
``loomrl.flow.Flow.adapt`` strings them together between iterations:

1. ``DriftDetector``: the relative error (measured - predicted) / predicted of each iteration;
   drift is declared when the last ``window`` errors all exceed ``threshold`` on the same side
   (one slow iteration, or noise around the prediction, never triggers it).
2. ``refresh_profile``: each component's recorded time (per micro-batch, its slowest rank)
   against what the profile predicted for exactly those calls gives a correction factor, applied to its whole cost curve (the items
   changed, not the device scaling); the gap a streaming component leaves between micro-batch
   calls when it does not wait (channel hand-offs) joins its per-call cost; measured
   offload/onload times replace ``switch_s``.
3. ``worth_switching``: the best plan under the refreshed profile replaces the running one only
   when it is predicted at least ``min_gain`` faster and the gain over the remaining iterations
   repays the redeploy stall; a plan already measured slower is never returned to (no
   oscillation), and at most ``max_replans`` redeploys happen in a run.
4. ``costs_moved``: whether "measured slower" still holds. A drift is either the plan's
   prediction being wrong (its measured times are steady) or the machine's costs changing (the
   plan's own measured times moved): after the latter, times measured before it describe
   another machine, and only times measured since count. A plan with no earlier times of its
   own (just re-planned to) is judged by ``costs_moved_across`` instead: the components it runs
   on as many devices as the window judged before (``cost_baseline``), call for call.
5. ``adapt_totals``: what adaptation did over a whole run, all attempts, from its
   ``adapt.jsonl`` rows (a restart starts a new process, which knows only its own decisions).
6. ``adapted_record`` / ``read_adapted`` / ``carry_problems`` / ``carries_measured``: the plan
   and refreshed profile adaptation last settled on, kept in the run directory
   (``ADAPTED_FILE``) so that a restart or ``loomrl resume`` starts from them instead of
   detecting the same drift again, and why they cannot run as they are on the resumed run's
   cluster or settings; with them, each plan's measured times since the costs last moved and
   the last window's ``cost_baseline``, so that "never return to a slower plan" holds across
   attempts, on the same cluster.

This module never imports torch or Ray.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "ADAPTED_FILE",
    "AdaptConfig",
    "Adapted",
    "DriftDetector",
    "adapt_totals",
    "adapted_record",
    "carry_problems",
    "call_overheads",
    "carries_measured",
    "cost_baseline",
    "costs_moved",
    "costs_moved_across",
    "component_factors",
    "detection_lag",
    "iteration_overhead",
    "median_by_key",
    "measured_switch_s",
    "oscillations",
    "phase_overheads",
    "plan_id",
    "plan_key",
    "read_adapted",
    "refresh_from_runs",
    "refresh_profile",
    "throughput_lost",
    "worth_switching",
]


@dataclass(frozen=True)
class AdaptConfig:
    threshold: float = 0.15  # relative deviation that counts as drift
    window: int = 3  # consecutive iterations that must deviate (same side)
    min_gain: float = 0.05  # a new plan must be predicted this much faster
    max_replans: int = 3  # redeploys per run

    def problems(self, prefix: str = "") -> list[str]:
        """Every invalid field, each naming the key (``prefix`` + field), its value and the fix."""
        p = []
        # not (x > 0) also refuses nan; an infinite threshold or gain is never crossed, which
        # would turn adaptation off without a word.
        if not (self.threshold > 0 and math.isfinite(self.threshold)):
            p.append(
                f"{prefix}threshold: must be a finite share > 0 of the predicted iteration time "
                f"(0.15: 15% off the prediction counts as drift), got {self.threshold}"
            )
        if not self.window >= 1:
            p.append(
                f"{prefix}window: must be >= 1 iteration (how many in a row must miss the "
                f"prediction; 3 is the default), got {self.window}"
            )
        if not (self.min_gain >= 0 and math.isfinite(self.min_gain)):
            p.append(
                f"{prefix}min_gain: must be a finite share >= 0 (0.05: a new plan must be "
                f"predicted 5% faster), got {self.min_gain}"
            )
        if not self.max_replans >= 0:
            p.append(
                f"{prefix}max_replans: must be >= 0 redeploys per run (0: refresh the prediction "
                f"but never move), got {self.max_replans}"
            )
        return p


class DriftDetector:
    """Persistent deviation of measured from predicted iteration times."""

    def __init__(self, threshold: float = 0.15, window: int = 3):
        self.threshold, self.window = threshold, window
        self.errors: deque[float] = deque(maxlen=window)

    def observe(self, predicted_s: float | None, measured_s: float) -> bool:
        """Record one iteration; True when the last ``window`` all deviate on the same side."""
        if not predicted_s or predicted_s <= 0:
            return False
        self.errors.append((measured_s - predicted_s) / predicted_s)
        if len(self.errors) < self.window:
            return False
        over = all(e > self.threshold for e in self.errors)
        under = all(e < -self.threshold for e in self.errors)
        return over or under

    def reset(self) -> None:
        self.errors.clear()


def _runs_by_component(timeline: list[dict[str, Any]], kind: str) -> dict[str, list[dict]]:
    """Records of kind "run", or of the switches ("onload" / "offload"), per component."""
    kinds = ("run",) if kind == "run" else ("onload", "offload")
    out: dict[str, list[dict]] = {}
    for r in timeline:
        if r["kind"] in kinds:
            out.setdefault(r["component"], []).append(r)
    return out


def component_factors(
    profile: Any, assignment: dict[str, list[int]], *timelines: list[dict[str, Any]]
) -> dict[str, float]:
    """measured / predicted seconds per component over the ``run`` records of one or more
    iterations' timelines (several iterations average out which items each one drew).

    The ranks of a component process a micro-batch side by side and the next step waits for the
    slowest, so each micro-batch counts its slowest rank's record; its prediction is the
    profile's ``alpha + x * per_item[n]`` for the x items all ranks took (n: its devices).
    """
    seconds = _component_seconds(profile, assignment, timelines)
    return {name: measured / predicted for name, (measured, predicted) in seconds.items()}


def _component_seconds(
    profile: Any, assignment: dict[str, list[int]], timelines: Sequence[list[dict[str, Any]]]
) -> dict[str, tuple[float, float]]:
    """(measured, predicted) seconds per component, as ``component_factors`` compares them;
    only components with both > 0."""
    tagged = [
        {**r, "micro_batch": (i, r.get("micro_batch", 0))}
        for i, tl in enumerate(timelines)
        for r in tl
    ]
    out: dict[str, tuple[float, float]] = {}
    for name, recs in _runs_by_component(tagged, "run").items():
        comp = profile.components.get(name)
        devs = assignment.get(name)
        if comp is None or not devs or len(devs) not in comp.per_item:
            continue
        per_item = comp.per_item[len(devs)]
        by_k: dict[Any, list[dict]] = {}
        for r in recs:
            by_k.setdefault(r.get("micro_batch", 0), []).append(r)
        predicted = sum(comp.alpha + sum(r["items"] for r in rs) * per_item for rs in by_k.values())
        measured = sum(max(r["end"] - r["start"] for r in rs) for rs in by_k.values())
        if predicted > 0 and measured > 0:
            out[name] = (measured, predicted)
    return out


def measured_switch_s(timeline: list[dict[str, Any]]) -> dict[str, float]:
    """Offload + onload seconds per component (the slowest rank), where any were recorded."""
    out: dict[str, float] = {}
    for name, recs in _runs_by_component(timeline, "switch").items():
        per_rank: dict[int, float] = {}
        for r in recs:
            per_rank[r["rank"]] = per_rank.get(r["rank"], 0.0) + r["end"] - r["start"]
        out[name] = max(per_rank.values())
    return out


def iteration_overhead(timeline: list[dict[str, Any]], measured_s: float) -> float:
    """Seconds of one iteration outside every component's records: from its start to the first
    record's start (handing out the first items, starting the stages) plus from the last
    record's end to its end (collecting the results). 0 without records."""
    if not timeline:
        return 0.0
    head = min(r["start"] for r in timeline)
    tail = measured_s - max(r["end"] for r in timeline)
    return max(0.0, head) + max(0.0, tail)


def call_overheads(timeline: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds a streaming component spends between consecutive micro-batch calls when it does
    not wait: the smallest gap between one call's end and the next call's start on a rank
    (taking the result's hand-off to the next channel and the next micro-batch from its input),
    the median over ranks. Components called once per rank (phase by phase) have no gap."""
    runs = _runs_by_component(timeline, "run")
    out: dict[str, float] = {}
    for name, recs in runs.items():
        by_rank: dict[int, list[dict]] = {}
        for r in recs:
            by_rank.setdefault(r["rank"], []).append(r)
        # Calls of other components on the same devices (a co-resident partner taking its turn)
        # fill part of a gap: that part is their work, not this component's overhead. What is
        # left are the hand-offs of the whole alternation (this -> partner -> this), which every
        # partner's gap holds too: each of the k components taking turns gets 1/k of them, so
        # that the hand-offs count once per round, not once per component.
        others = [r for c, rs in runs.items() if c != name for r in rs]
        gaps = []
        for rs in by_rank.values():
            rs.sort(key=lambda r: r["start"])
            devs = set(rs[0].get("devices") or ())
            near = [o for o in others if devs & set(o.get("devices") or ())]
            g = [
                (b["start"] - a["end"] - _covered(near, a["end"], b["start"]))
                / (1 + _turns(near, a["end"], b["start"]))
                for a, b in zip(rs, rs[1:], strict=False)
            ]
            if g:
                gaps.append(max(0.0, min(g)))
        if gaps:
            out[name] = statistics.median(gaps)
    return out


def phase_overheads(
    timeline: list[dict[str, Any]], phases: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """Per phase-context stage: the driver-side wall time of its call beyond the busiest rank's
    recorded work and switches (dispatch, the batch's channel hand-offs, the return)."""
    busy: dict[tuple[str, int], float] = {}
    for r in timeline:
        if r["kind"] in ("run", "onload", "offload"):
            k = (r["component"], r["rank"])
            busy[k] = busy.get(k, 0.0) + r["end"] - r["start"]
    out = {}
    for name, (start, end) in phases.items():
        mine = [v for (c, _), v in busy.items() if c == name]
        if mine:
            out[name] = max(0.0, end - start - max(mine))
    return out


def median_by_key(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Per key, the median over the dicts that have it (the mean of two; one stalled iteration
    among three or more does not move it)."""
    keys = {k for d in dicts for k in d}
    return {k: statistics.median(d[k] for d in dicts if k in d) for k in keys}


def _turns(recs: list[dict[str, Any]], lo: float, hi: float) -> int:
    """Components with a record inside (lo, hi): the partners that took a turn in a gap."""
    return len({r["component"] for r in recs if r["start"] < hi and r["end"] > lo})


def _covered(recs: list[dict[str, Any]], lo: float, hi: float) -> float:
    """Length of [lo, hi] covered by the union of the records' [start, end]."""
    spans = sorted((max(lo, r["start"]), min(hi, r["end"])) for r in recs)
    spans = [(a, b) for a, b in spans if b > a]
    total, reach = 0.0, lo
    for a, b in spans:
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


def refresh_profile(
    profile: Any,
    factors: dict[str, float],
    switch_s: dict[str, float] | None = None,
    overhead_s: dict[str, float] | None = None,
    iteration_overhead_s: float | None = None,
) -> Any:
    """A copy of ``profile`` with each named component's costs scaled by its factor, and its
    per-call overhead (``call_overheads``) added to ``alpha``; ``iteration_overhead_s`` (as
    measured by ``iteration_overhead``) replaces the profile's when given."""
    comps = dict(profile.components)
    for name, f in factors.items():
        c = comps[name]
        comps[name] = replace(
            c, alpha=c.alpha * f, per_item={n: v * f for n, v in c.per_item.items()}
        )
    for name, extra in (overhead_s or {}).items():
        if name in comps:
            comps[name] = replace(comps[name], alpha=comps[name].alpha + float(extra))
    for name, s in (switch_s or {}).items():
        if name in comps:
            comps[name] = replace(comps[name], switch_s=float(s))
    if iteration_overhead_s is not None:
        profile = replace(profile, iteration_overhead_s=float(iteration_overhead_s))
    return replace(profile, components=comps, fit_reports=())


def refresh_from_runs(
    profile: Any, assignment: dict[str, list[int]], results: list[Any]
) -> tuple[dict[str, float], Any]:
    """``refresh_profile`` with everything measured by iterations ``results`` (objects with
    ``timeline``, ``phases`` and ``measured_s``, as ``Flow.run`` returns) under ``assignment``:
    component factors, switch times, per-call overheads and the iteration overhead, each the
    median over the iterations (on a busy machine one iteration in a few runs 10-20% slow, and
    a mean would carry that into every later prediction). Returns (factors, refreshed profile)."""
    factors = median_by_key([component_factors(profile, assignment, r.timeline) for r in results])
    prof = refresh_profile(
        profile,
        factors,
        median_by_key([measured_switch_s(r.timeline) for r in results]),
        median_by_key(
            [
                {**call_overheads(r.timeline), **phase_overheads(r.timeline, r.phases)}
                for r in results
            ]
        ),
        statistics.median(iteration_overhead(r.timeline, r.measured_s) for r in results),
    )
    return factors, prof


def plan_key(plan: Any) -> str:
    """Identity of a plan's layout: tree and micro-batch size (not its prediction)."""
    return json.dumps([plan.tree.to_dict(), plan.micro_batch], sort_keys=True)


def plan_id(plan: Any) -> str:
    """``plan_key`` in 12 hex digits: short enough for every adapt.jsonl row to name its plans."""
    return _key_id(plan_key(plan))


def _key_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def costs_moved(earlier: Sequence[float], recent: Sequence[float], threshold: float) -> bool:
    """Whether one plan's ``recent`` iteration times left its ``earlier`` ones (both measured
    under that plan) by more than ``threshold`` relative, median against median: the machine's
    costs changed, not only the prediction. False when either is empty (a plan that has just
    started has nothing of its own to compare with)."""
    if not earlier or not recent:
        return False
    before = statistics.median(earlier)
    return before > 0 and abs(statistics.median(recent) / before - 1.0) > threshold


# Right after a re-plan (or a restart onto a plan that has not run since the costs last moved)
# the running plan has no earlier times of its own, and ``costs_moved`` cannot tell a machine
# that changed from a prediction that was wrong. Comparing the window with the plan's
# prediction would call every mispredicted plan a machine change (a drift is exactly a window
# off its prediction), and the times of other plans would then be set aside after every
# mispredicted re-plan: the run could return to a plan it measured slower, again and again.
# What does tell them apart is a measurement of the same work before and after: a component
# that runs on as many devices in the new plan as in the window judged before does the same
# calls on the same kind of slice of the machine, and its cost per call moves only when the
# machine's does. Its other device counts are where the profile extrapolates, and where a
# re-planned prediction is most often wrong: those components are left out. Both windows'
# factors are taken against one profile (the refreshed one in use), so that the overheads it
# folded into alpha and its curve over micro-batch sizes weigh on both alike.


def cost_baseline(
    profile: Any, assignment: dict[str, list[int]], timelines: Sequence[list[dict[str, Any]]]
) -> dict[str, Any]:
    """What a window of iterations (their ``timelines``, run under ``assignment``) measured of
    the machine, for ``costs_moved_across`` to compare a later plan's window with: each
    component's ``factors`` against ``profile`` (the median over the iterations, as
    ``refresh_from_runs`` takes them) and the ``devices`` it ran on. JSON-ready (it is kept in
    ``ADAPTED_FILE`` for the next attempt)."""
    return {
        "factors": median_by_key([component_factors(profile, assignment, tl) for tl in timelines]),
        "devices": {name: len(devs) for name, devs in assignment.items()},
    }


def costs_moved_across(
    baseline: dict[str, Any] | None,
    profile: Any,
    assignment: dict[str, list[int]],
    timelines: Sequence[list[dict[str, Any]]],
    threshold: float,
) -> bool | None:
    """Whether the machine's costs moved since ``baseline`` (``cost_baseline`` of an earlier
    window, against the same ``profile``), judged on the components that ran on as many devices
    then as now (under ``assignment``, in these iterations' ``timelines``): per iteration, their
    measured seconds against what the baseline's factors make of the same calls, and the median
    of that ratio over the iterations off 1 by more than ``threshold`` (one stalled iteration is
    no move). None when it cannot tell: no baseline, or no component alike in both."""
    if not baseline or not timelines:
        return None
    before, devices = baseline.get("factors") or {}, baseline.get("devices") or {}
    ratios = []
    for tl in timelines:
        seconds = _component_seconds(profile, assignment, [tl])
        alike = [
            c for c in seconds if c in before and devices.get(c) == len(assignment.get(c) or ())
        ]
        expected = sum(before[c] * seconds[c][1] for c in alike)
        if expected > 0:
            ratios.append(sum(seconds[c][0] for c in alike) / expected)
    if not ratios:
        return None
    return abs(statistics.median(ratios) - 1.0) > threshold


def worth_switching(
    current_s: float,
    candidate_s: float,
    stall_s: float,
    iterations_left: int,
    min_gain: float = 0.05,
) -> bool:
    """Switch when the candidate is at least ``min_gain`` faster and the saving over the
    remaining iterations exceeds the redeploy stall."""
    gain = current_s - candidate_s
    return gain > min_gain * current_s and gain * max(0, iterations_left) > stall_s


# ------------------------------------------------------------------ what adaptation cost
# The paper never measured its adaptation; these say how well ours did, from a run's record.


def detection_lag(event_steps: Sequence[int], onset: int, first_judged: int = 1) -> int | None:
    """Iterations from the first affected one that adaptation judges to its first decision
    (an event of ``Flow.adapt``, re-plan or not), both counted: ``window`` when it notices at
    once. The affected ones start at ``onset``, or at ``first_judged`` when that is later (the
    first iteration of fresh workers is their warm-up, never judged). Events before that
    (false alarms) are no detection; None when no event came after it."""
    first = max(onset, first_judged)
    after = [s for s in event_steps if s >= first]
    return min(after) - first + 1 if after else None


def oscillations(plan_keys: Sequence[str]) -> int:
    """How often the plan changed back to one that ran before (``plan_key`` per iteration, in
    order): A A B B A counts 1, A B A B counts 2, A B C counts 0."""
    seen: set[str] = set()
    count, prev = 0, None
    for k in plan_keys:
        if k != prev and k in seen:
            count += 1
        seen.add(k)
        prev = k
    return count


def throughput_lost(times: Sequence[float], reference_s: float, start: int = 0) -> float:
    """The share of time the iterations from ``start`` on took beyond ``reference_s`` each (the
    steady iteration of the plan that was best from the start): 0.25 when they took 25% longer,
    negative when faster. 0 without iterations from ``start`` on."""
    if reference_s <= 0:
        raise ValueError(f"reference_s={reference_s}: must be > 0 seconds per iteration")
    tail = list(times[start:])
    return sum(tail) / (reference_s * len(tail)) - 1.0 if tail else 0.0


def adapt_totals(rows: Sequence[dict[str, Any]], attempts: int = 1) -> dict[str, Any]:
    """What adaptation did over a whole run from its ``adapt.jsonl`` rows (in order, every
    attempt's; ``attempts``: how many the run had): ``decisions`` (rows), ``replans``,
    ``oscillations`` (re-plans to a plan that had run earlier in the same attempt: a restart
    starts again from the configured plan, which is not adaptation returning to it) and
    ``redeploy_stall_s``; and ``per_attempt``, the same for each attempt, in order. A row names
    its attempt (``attempt``, from 0; rows without one count for the first) and, for
    oscillations, the plan it judged (``plan_from``) and the one after it (``plan_to``)."""
    n = max(1, attempts, *(_attempt(r) + 1 for r in rows))
    per = [
        {"attempt": i, "decisions": 0, "replans": 0, "oscillations": 0, "redeploy_stall_s": 0.0}
        for i in range(n)
    ]
    # Per attempt, the plans in the order they ran: each row's judged plan, then a re-plan's next.
    ran: list[list[str]] = [[] for _ in range(n)]
    for r in rows:
        i = _attempt(r)
        a = per[i]
        a["decisions"] += 1
        if r.get("plan_from"):
            ran[i].append(r["plan_from"])
        if r.get("action") == "replan":
            a["replans"] += 1
            stall = r.get("stall_s")
            if isinstance(stall, (int, float)) and math.isfinite(stall):
                a["redeploy_stall_s"] += float(stall)
            if r.get("plan_to"):
                ran[i].append(r["plan_to"])
    for a, plans in zip(per, ran, strict=True):
        a["oscillations"] = oscillations(plans)
    total: dict[str, Any] = {
        k: sum(a[k] for a in per)
        for k in ("decisions", "replans", "oscillations", "redeploy_stall_s")
    }
    total["per_attempt"] = per
    return total


def _attempt(row: dict[str, Any]) -> int:
    a = row.get("attempt")
    return a if isinstance(a, int) and not isinstance(a, bool) and a >= 0 else 0


# ------------------------------------------------------------------ across attempts
# A restart (a dead worker) or ``loomrl resume`` starts a new Flow; without this record it would
# plan again from the profile of the run's start and pay ``window`` slow iterations to find the
# same drift, and it would not know which plans it measured slower: it could re-plan back to
# one. Machine costs do not roll back with a checkpoint: the latest record counts, also one
# written after the checkpoint the run resumes from, measured times included.

ADAPTED_FILE = "adapted.json"  # in the run directory; rewritten whole after every adapt event


@dataclass(frozen=True)
class Adapted:
    """What adaptation last settled on in a run: the plan running after its last event, the
    refreshed profile it was judged with, and where (step, attempt, on a cluster of
    ``devices``) and under which settings (``placement``, ``micro_batch``: the re-plans kept to
    them) it was decided. ``measured``: each plan's measured iteration seconds (by
    ``plan_key``) since the costs last moved, and ``baseline`` the last window's
    ``cost_baseline``, both of the cluster of ``devices`` devices of ``device_memory_gb`` each
    (None: no GPU); empty in a record written before they were kept."""

    plan: Any
    profile: Any
    step: int
    attempt: int
    placement: str
    micro_batch: int | None
    devices: int
    measured: dict[str, list[float]] = field(default_factory=dict)
    baseline: dict[str, Any] | None = None
    device_memory_gb: float | None = None


def adapted_record(
    plan: Any,
    profile: Any,
    step: int,
    attempt: int,
    placement: str,
    micro_batch: int | None,
    devices: int,
    measured: dict[str, list[float]] | None = None,
    baseline: dict[str, Any] | None = None,
    device_memory_gb: float | None = None,
) -> dict[str, Any]:
    """The JSON object of ``ADAPTED_FILE`` (what ``read_adapted`` reads back); ``devices``: the
    cluster's, which may differ from the profile's (a profile file made for another one), and
    ``device_memory_gb`` its devices' memory (None: no GPU). ``measured``: plan_key -> measured
    iteration seconds (``Flow.measured_state``), kept as a list naming each plan by its
    ``plan_id`` too; ``baseline``: a ``cost_baseline``."""
    return {
        "step": step,
        "attempt": attempt,
        "placement": placement,
        "micro_batch": micro_batch,
        "devices": devices,
        "plan_id": plan_id(plan),
        "plan": plan.to_dict(),
        "profile": profile.to_dict(),
        "device_memory_gb": device_memory_gb,
        "measured": [
            {
                "plan_id": _key_id(k),
                "plan_key": k,
                "times_s": list(v),
            }
            for k, v in (measured or {}).items()
        ],
        "baseline": baseline,
    }


def read_adapted(path: Any) -> Adapted:
    """``ADAPTED_FILE`` read back; ``PlanError`` naming the file and what is wrong with it when
    it cannot be (missing, cut short, edited by hand into something else)."""
    from pathlib import Path

    from loomrl.errors import ConfigError, PlanError
    from loomrl.plan.plan import Plan
    from loomrl.plan.profile import load_profile

    p = Path(path)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise PlanError(f"{p} cannot be read ({e.strerror or e})") from None
    except ValueError as e:  # UnicodeDecodeError included
        raise PlanError(f"{p} is not JSON ({e})") from None
    if not isinstance(d, dict):
        raise PlanError(f"{p} is not a JSON object (got {type(d).__name__})")
    keys = ("step", "attempt", "placement", "devices", "plan", "profile")
    missing = [k for k in keys if k not in d]
    if missing:
        raise PlanError(f"{p} lacks {missing}")
    step, attempt, mb, devices = d["step"], d["attempt"], d.get("micro_batch"), d["devices"]
    for key, v in (("step", step), ("attempt", attempt), ("micro_batch", mb), ("devices", devices)):
        if (v is not None or key != "micro_batch") and (
            isinstance(v, bool) or not isinstance(v, int) or v < 0
        ):
            raise PlanError(f"{p}: {key} is {v!r}, not a whole number >= 0")
    if not isinstance(d["placement"], str):
        raise PlanError(f"{p}: placement is {d['placement']!r}, not a string")
    try:
        profile = load_profile(d["profile"])
    except ConfigError as e:
        raise PlanError(f"{p}: its profile is not valid: {'; '.join(e.problems)}") from None
    try:
        plan = Plan.from_dict(d["plan"])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        what = f"missing key {e}" if isinstance(e, KeyError) else str(e)
        raise PlanError(f"{p}: its plan is not valid: {what}") from None
    measured, baseline, memory = _read_measured(p, d)
    return Adapted(
        plan, profile, step, attempt, d["placement"], mb, devices, measured, baseline, memory
    )


def _read_measured(
    p: Any, d: dict[str, Any]
) -> tuple[dict[str, list[float]], dict[str, Any] | None, float | None]:
    """``ADAPTED_FILE``'s measured times, cost baseline and device memory (absent in a record
    written before they were kept: none, None, None); PlanError naming what is wrong."""
    from loomrl.errors import PlanError

    def seconds(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    rows, measured = d.get("measured") or [], {}
    if not isinstance(rows, list):
        raise PlanError(f"{p}: measured is {rows!r}, not a list of plans' times")
    for i, r in enumerate(rows):
        ok = isinstance(r, dict) and isinstance(r.get("plan_key"), str)
        times = r.get("times_s") if ok else None
        if not (isinstance(times, list) and all(seconds(t) and t >= 0 for t in times)):
            raise PlanError(
                f"{p}: measured[{i}] is {r!r}, not {{'plan_key': str, 'times_s': [seconds >= 0]}}"
            )
        measured[r["plan_key"]] = [float(t) for t in times]
    baseline = d.get("baseline")
    if baseline is not None:
        b = baseline if isinstance(baseline, dict) else {}
        factors, devices = b.get("factors"), b.get("devices")
        if not (
            isinstance(factors, dict)
            and isinstance(devices, dict)
            and all(seconds(v) for v in factors.values())
        ):
            raise PlanError(
                f"{p}: baseline is {baseline!r}, not {{'factors': {{component: float}}, "
                "'devices': {component: int}}"
            )
    memory = d.get("device_memory_gb")
    if memory is not None and not (seconds(memory) and memory > 0):
        raise PlanError(f"{p}: device_memory_gb is {memory!r}, not a number of GB > 0 or null")
    return measured, baseline, memory


def carry_problems(
    adapted: Adapted,
    placement: str,
    micro_batch: int | None,
    devices: int,
    memory_gb: float | None,
) -> list[str]:
    """Why ``adapted.plan`` cannot run as it is now (empty: it can): the run asks for another
    mode or micro-batch than it was adapted under, the cluster has another device count than
    the one it was adapted on, or its peak memory exceeds ``memory_gb`` per device (None: not
    checked). Each of these leaves the refreshed profile good to plan again from."""
    a, p = adapted, []
    if placement != a.placement:
        p.append(f"run.placement is {placement!r} now, the plan was adapted under {a.placement!r}")
    if micro_batch != a.micro_batch:
        said = ["null" if m is None else m for m in (micro_batch, a.micro_batch)]
        p.append(f"run.micro_batch is {said[0]} now, the plan was adapted under {said[1]}")
    if devices != a.devices:
        p.append(f"this cluster has {devices} device(s), the plan was adapted on {a.devices}")
    if memory_gb is not None and a.plan.memory_gb > memory_gb:
        p.append(
            f"the plan's peak memory is {a.plan.memory_gb:.1f} GB per device, a device here "
            f"has {memory_gb:.1f} GB"
        )
    return p


def carries_measured(adapted: Adapted, devices: int, memory_gb: float | None) -> bool:
    """Whether ``adapted``'s measured times and cost baseline still count on the resumed run's
    cluster (``devices`` devices of ``memory_gb`` each; None: no GPU): only on the cluster they
    were measured on. A cluster of another device count or another device memory is another
    machine, whose costs those times do not describe, and most of whose plans are other plans
    (other device counts): none of them is kept there. Another ``placement`` or
    ``micro_batch`` on the same cluster keeps them all: a plan's time on this machine is as true
    as it was, and the times of plans outside the mode or micro-batch asked for now are never
    looked up (adaptation compares only the running plan and the best of the search)."""
    if devices != adapted.devices:
        return False
    have, had = memory_gb, adapted.device_memory_gb
    if have is None or had is None:
        return have is None and had is None
    return math.isclose(have, had, rel_tol=1e-3)
