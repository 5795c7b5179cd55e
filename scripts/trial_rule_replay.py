"""Replays two alternatives to the trial's rules over stored embodied benchmark results, to see
whether either would have predicted or chosen better than the rules the runs used.

    python scripts/trial_rule_replay.py "docs/results/**/*.json*"

1. The estimate a run is predicted from. The trial times the candidates in turns, then times the
   chosen one again (``auto_trial_confirm`` rollouts) and predicts from those alone
   (``confirmed``). The alternatives: the turns' rollouts of the chosen one alone (``turns``),
   or both pooled (``pooled``). A run's prediction is its rollout estimate plus what the
   iteration adds (update, overhead), so another estimate moves the prediction by the
   difference; each variant's error is counted against the run's measured s/it.
2. The choice among candidates the turns cannot tell apart (``_close_to_best`` still lists
   them after the extra passes). The rule used: the fastest median. The alternative: the one
   with the fewest groups among them (fewer hand-offs and row counts). Each round where that
   picks another placement is scored by both placements' measured s/it in the same file
   (median over the runs of each).

Only rounds whose trial timed one rollout length and kept ``confirmed_s`` count for 1.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import load_json  # noqa: E402

from loomrl.cycle_trial import _close_to_best  # noqa: E402

ESTIMATES = ("confirmed", "pooled", "turns")


def _rounds(doc: dict) -> list[dict[str, Any]]:
    return [
        r
        for m in doc.get("results", []) or []
        if isinstance(m, dict)
        for r in (m.get("rounds") or [m])
        if r.get("feasible") and r.get("trials") and r.get("measured_s") and r.get("predicted_s")
    ]


def estimate_errors(doc: dict) -> list[dict[str, Any]]:
    """Per round with one timed length and a confirmation: the relative error of the run's
    measured s/it against the prediction under each estimate in ``ESTIMATES``. Pure."""
    out = []
    for r in _rounds(doc):
        tr = r["trials"]
        if "chosen" not in tr or tr.get("rollout_s") is None:
            continue
        pick = tr["trials"][tr["chosen"]]
        conf, timed = pick.get("confirmed_s") or {}, pick.get("timed_s") or {}
        if len(conf) != 1 or set(conf) != set(timed):
            continue
        (n,) = conf
        c, t = conf[n], timed[n]
        if not c or not t or abs(statistics.median(c) - tr["rollout_s"]) > 1e-9:
            continue  # predicted from something else (rollouts of two lengths)
        est = {"confirmed": statistics.median(c), "pooled": statistics.median(c + t)}
        est["turns"] = statistics.median(t)
        errors = {}
        for name, e in est.items():
            pred = r["predicted_s"] + e - est["confirmed"]
            errors[name] = (r["measured_s"] - pred) / pred
        out.append({"mode": r["mode"], "errors": errors})
    return out


def fewest_groups_outcomes(doc: dict) -> list[dict[str, Any]]:
    """Per hybrid or auto round whose close candidates hold a pick with fewer groups than the
    one chosen: both placements' measured s/it (median over the file's runs of each; None where
    one never ran). Pure."""
    measured: dict[str, list[float]] = {}
    for r in _rounds(doc):
        measured.setdefault(json.dumps(r["placement"], sort_keys=True), []).append(r["measured_s"])
    out = []
    for r in _rounds(doc):
        tr, rows = r["trials"], r["trials"].get("trials", [])
        if r["mode"] not in ("hybrid", "auto") or "chosen" not in tr:
            continue
        if any(len(x.get("timed_s") or {}) != 1 for x in rows):
            continue
        steps = int(next(iter(rows[0]["timed_s"])))
        timed = {
            i: {int(k): v for k, v in x["timed_s"].items()}
            for i, x in enumerate(rows)
            if x.get("probe_workers")
            and x.get("same_cycle_as") is None
            and all(x["timed_s"].values())
        }
        close = _close_to_best(timed, steps, steps)
        if len(close) < 2:
            continue
        old = tr["chosen"]
        new = min(close, key=lambda i: (rows[i]["placement"]["groups"], rows[i]["rollout_s"]))
        if rows[new]["placement"] == rows[old]["placement"]:
            continue
        runs = [measured.get(json.dumps(rows[i]["placement"], sort_keys=True)) for i in (old, new)]
        out.append(
            {
                "mode": r["mode"],
                "groups": [rows[old]["placement"]["groups"], rows[new]["placement"]["groups"]],
                "measured_s": [statistics.median(v) if v else None for v in runs],
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("patterns", nargs="+", help="benchmark JSON files or glob patterns")
    args = ap.parse_args(argv)
    errors, outcomes = [], []
    for pat in args.patterns:
        for f in sorted(glob.glob(pat, recursive=True)):
            try:
                doc = load_json(f)
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict):
                errors += estimate_errors(doc)
                outcomes += fewest_groups_outcomes(doc)
    if not errors:
        print("no rounds with a confirmed trial estimate found", file=sys.stderr)
        return 1
    print(f"estimate the prediction comes from, {len(errors)} rounds:")
    for name in ESTIMATES:
        e = [r["errors"][name] for r in errors]
        within = sum(abs(x) <= 0.05 for x in e)
        print(
            f"  {name:<9} within 5%: {within}/{len(e)} ({within / len(e):.0%}), "
            f"mean |error| {statistics.mean(abs(x) for x in e):.3f}"
        )
    scored = [o for o in outcomes if None not in o["measured_s"]]
    better = sum(o["measured_s"][1] < o["measured_s"][0] for o in scored)
    print(
        f"fewest groups among close candidates: {len(outcomes)} rounds would pick another "
        f"placement; of {len(scored)} with both measured, {better} ran faster, "
        f"{len(scored) - better} slower"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
