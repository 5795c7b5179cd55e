"""Run-time adaptation: notice when iterations leave the plan's prediction, refresh the profile
from what the workers recorded, re-plan, and redeploy only when it pays.

The pieces are pure functions over profiles, plans and measured timelines (tested on their own);
``loomrl.flow.Flow.adapt`` strings them together between iterations:

1. ``DriftDetector``: the relative error (measured - predicted) / predicted of each iteration;
   drift is declared when the last ``window`` errors all exceed ``threshold`` on the same side
   (one slow iteration, or noise around the prediction, never triggers it).
2. ``refresh_profile``: each component's recorded busy time against what the profile predicted
   for exactly those calls gives a correction factor, applied to its whole cost curve (the items
   changed, not the device scaling); measured offload/onload times replace ``switch_s``.
3. ``worth_switching``: the best plan under the refreshed profile replaces the running one only
   when it is predicted at least ``min_gain`` faster and the gain over the remaining iterations
   repays the redeploy stall; a plan already measured slower is never returned to (no
   oscillation), and at most ``max_replans`` redeploys happen in a run.

This module never imports torch or Ray.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "AdaptConfig",
    "DriftDetector",
    "component_factors",
    "measured_switch_s",
    "plan_key",
    "refresh_profile",
    "worth_switching",
]


@dataclass(frozen=True)
class AdaptConfig:
    threshold: float = 0.15  # relative deviation that counts as drift
    window: int = 3  # consecutive iterations that must deviate (same side)
    min_gain: float = 0.05  # a new plan must be predicted this much faster
    max_replans: int = 3  # redeploys per run

    def problems(self, prefix: str = "") -> list[str]:
        p = []
        if not self.threshold > 0:
            p.append(f"{prefix}threshold: must be > 0, got {self.threshold}")
        if self.window < 1:
            p.append(f"{prefix}window: must be >= 1 iteration, got {self.window}")
        if self.min_gain < 0:
            p.append(f"{prefix}min_gain: must be >= 0, got {self.min_gain}")
        if self.max_replans < 0:
            p.append(f"{prefix}max_replans: must be >= 0, got {self.max_replans}")
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
    out: dict[str, list[dict]] = {}
    for r in timeline:
        if (r["kind"] == "run") == (kind == "run"):
            out.setdefault(r["component"], []).append(r)
    return out


def component_factors(
    profile: Any, assignment: dict[str, list[int]], timeline: list[dict[str, Any]]
) -> dict[str, float]:
    """measured / predicted busy seconds per component over one iteration's ``run`` records.

    A record is one call of one rank on ``items`` items; the component's call on the whole
    micro-batch spans ``items * world`` items (world = its ranks), so its prediction is
    ``alpha + items * world * per_item[n]`` with n its device count.
    """
    factors: dict[str, float] = {}
    for name, recs in _runs_by_component(timeline, "run").items():
        comp = profile.components.get(name)
        devs = assignment.get(name)
        if comp is None or not devs or len(devs) not in comp.per_item:
            continue
        world = len({r["rank"] for r in recs})
        per_item = comp.per_item[len(devs)]
        predicted = sum(comp.alpha + r["items"] * world * per_item for r in recs)
        measured = sum(r["end"] - r["start"] for r in recs)
        if predicted > 0 and measured > 0:
            factors[name] = measured / predicted
    return factors


def measured_switch_s(timeline: list[dict[str, Any]]) -> dict[str, float]:
    """Offload + onload seconds per component (the slowest rank), where any were recorded."""
    out: dict[str, float] = {}
    for name, recs in _runs_by_component(timeline, "switch").items():
        per_rank: dict[int, float] = {}
        for r in recs:
            per_rank[r["rank"]] = per_rank.get(r["rank"], 0.0) + r["end"] - r["start"]
        out[name] = max(per_rank.values())
    return out


def refresh_profile(
    profile: Any, factors: dict[str, float], switch_s: dict[str, float] | None = None
) -> Any:
    """A copy of ``profile`` with each named component's costs scaled by its factor."""
    comps = dict(profile.components)
    for name, f in factors.items():
        c = comps[name]
        comps[name] = replace(
            c, alpha=c.alpha * f, per_item={n: v * f for n, v in c.per_item.items()}
        )
    for name, s in (switch_s or {}).items():
        if name in comps:
            comps[name] = replace(comps[name], switch_s=float(s))
    return replace(profile, components=comps, fit_reports=())


def plan_key(plan: Any) -> str:
    """Identity of a plan's layout: tree and micro-batch size (not its prediction)."""
    import json

    return json.dumps([plan.tree.to_dict(), plan.micro_batch], sort_keys=True)


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


def median_or_none(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None
