"""Gantt charts of plans (predicted) and of runs (measured): one row per device group.

matplotlib is imported lazily with the Agg backend, so this works headless and
importing the planner never pulls it in.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from loomrl.plan.plan import Interval, Plan

__all__ = ["draw_timeline", "intervals_of"]

# (row_label, component, start, end, label)
Row = tuple[str, str, float, float, str]


def intervals_of(plan: Plan) -> list[Row]:
    """A plan's predicted busy intervals as generic rows (row = device range)."""
    rows: list[Row] = []
    for i in plan.timeline:
        a, b = i.devices
        label = f"dev {a}" if b - a == 1 else f"dev {a}-{b - 1}"
        text = "switch" if i.kind == "switch" else ("" if i.micro_batch < 0 else str(i.micro_batch))
        comp = i.component if i.kind == "run" else f"{i.component} (switch)"
        rows.append((label, comp, i.start, i.end, text))
    return rows


def draw_timeline(
    plan_or_intervals: Plan | Sequence[Row] | Sequence[Interval],
    path: str | Path,
    title: str = "",
) -> Path:
    """Draw a Gantt chart to ``path`` (PNG/SVG/PDF by suffix) and return the path.

    Accepts a Plan, a list of :class:`Interval`, or generic rows
    ``(row_label, component, start, end, label)`` such as measured spans.
    Gaps between boxes are idle time.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if isinstance(plan_or_intervals, Plan):
        rows = intervals_of(plan_or_intervals)
    else:
        rows = []
        for x in plan_or_intervals:
            if isinstance(x, Interval):
                a, b = x.devices
                rows.append((f"dev {a}-{b - 1}", x.component, x.start, x.end, str(x.micro_batch)))
            else:
                rows.append(tuple(x))  # type: ignore[arg-type]
    labels = sorted({r[0] for r in rows}, key=_row_key)
    comps = sorted({r[1] for r in rows})
    cmap = plt.get_cmap("tab10" if len(comps) <= 10 else "tab20")
    color = {c: cmap(i % cmap.N) for i, c in enumerate(comps)}
    y = {lab: i for i, lab in enumerate(labels)}
    # a plan of zero-cost calls ends at 0 s; an axis from 0 to 0 has no scale
    end = max((r[3] for r in rows), default=0.0) or 1.0
    fig, ax = plt.subplots(figsize=(12, 0.5 * len(labels) + 1.8))
    for lab, comp, s, e, text in rows:
        ax.barh(
            y[lab], e - s, left=s, height=0.8, color=color[comp], edgecolor="black", linewidth=0.3
        )
        if text and (e - s) > end / 60:
            ax.text((s + e) / 2, y[lab], text, ha="center", va="center", fontsize=6)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_xlim(0, end * 1.01)
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[c]) for c in comps]
    ax.legend(
        handles,
        comps,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.15),
        ncol=min(len(comps), 6),
        fontsize=8,
    )
    if title:
        ax.set_title(title)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _row_key(label: str):
    digits = "".join(ch if ch.isdigit() else " " for ch in label).split()
    return (int(digits[0]) if digits else 0, label)
