"""How far apart two runs of the same plan land in stored embodied benchmark results: the floor
under any prediction made before a run.

    python scripts/run_spread.py docs/results/embodied_modes_cpu2_run*.json
    python scripts/run_spread.py "docs/results/gpu/**/*.json*" --out spread_gpu.json

Reads complete ``benchmarks/embodied_modes.py --out`` files (others are skipped). Within one
file, every feasible run (a mode in a round) that ran the same placement ran the same plan on
fresh workers, minutes apart on the same machine; for each such placement run at least twice it
takes the fastest and slowest measured s/it. One prediction can be within ``tol`` of both only
when (slowest - fastest) / (slowest + fastest) <= tol: the best single number, their mean, is
off by that much from each. The summary says how often even that best number misses.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import load_json  # noqa: E402


def _key(place: dict) -> str:
    return json.dumps(place, sort_keys=True)


def spreads(doc: dict) -> list[dict[str, Any]]:
    """Per placement run at least twice in one benchmark document: its measured s/it, fastest
    to slowest, the spread slowest / fastest - 1, and the least error a single prediction can
    have against all of them (half the range over the midpoint). Pure."""
    by: dict[str, list[float]] = {}
    for m in doc.get("results", []):
        for r in m.get("rounds") or [m]:
            if r.get("feasible") and r.get("measured_s"):
                by.setdefault(_key(r["placement"]), []).append(float(r["measured_s"]))
    out = []
    for key, v in by.items():
        if len(v) < 2:
            continue
        lo, hi = min(v), max(v)
        out.append(
            {
                "placement": json.loads(key),
                "measured_s": sorted(v),
                "spread": hi / lo - 1,
                "least_error": (hi - lo) / (hi + lo),
            }
        )
    return out


def summary(rows: list[dict[str, Any]], tol: float = 0.05) -> dict[str, Any]:
    """Over placements from ``spreads``: how many, the median spread, and the shares whose
    spread exceeds ``tol`` and whose least error does (no prediction within ``tol`` of every
    run). Pure."""
    if not rows:
        return {"placements": 0}
    s = [r["spread"] for r in rows]
    return {
        "placements": len(rows),
        "median_spread": statistics.median(s),
        "max_spread": max(s),
        "share_spread_over_tol": sum(x > tol for x in s) / len(s),
        "share_no_prediction_within_tol": sum(r["least_error"] > tol for r in rows) / len(rows),
        "tol": tol,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("files", nargs="+", help="benchmark --out files or globs (** recurses)")
    p.add_argument("--tol", type=float, default=0.05)
    p.add_argument("--out", default=None, help="write the rows and the summary as JSON here")
    args = p.parse_args(argv)
    paths = sorted({f for pat in args.files for f in glob.glob(pat, recursive=True)})
    rows, used = [], 0
    for path in paths:
        try:
            doc = load_json(path)
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or not doc.get("complete") or "results" not in doc:
            continue
        used += 1
        rows += [{"file": path, **r} for r in spreads(doc)]
    if not used:
        print(f"no complete benchmark results among {len(paths)} file(s)", file=sys.stderr)
        return 1
    s = summary(rows, args.tol)
    print(f"{used} benchmark file(s), {s['placements']} placements run at least twice")
    if s["placements"]:
        print(
            f"same plan run again: median spread {100 * s['median_spread']:.1f}% "
            f"(at most {100 * s['max_spread']:.1f}%), over {100 * args.tol:.0f}% in "
            f"{100 * s['share_spread_over_tol']:.0f}%; no single prediction within "
            f"{100 * args.tol:.0f}% of every run in {100 * s['share_no_prediction_within_tol']:.0f}%"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": s, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
