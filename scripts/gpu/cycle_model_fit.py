"""How well each cycle model predicted the trial rollouts that benchmark runs timed.

    python scripts/gpu/cycle_model_fit.py docs/results/gpu/graphs/embodied_px_*.json \
        docs/results/gpu/balance/embodied_px_*.json docs/results/gpu/fixed_hops/*.json \
        docs/results/gpu/past_limit/*.json

Every run of ``benchmarks/embodied_modes.py`` keeps, per mode, the fitted chained-call costs
(``profile``: t = alpha + per_item * envs for env and policy) and the short rollouts the recipe
timed before running (``trials``: co-located, and split at ring-group counts k), per round
(runs are named ``#round`` when they have more than one). For each trial
this prints the measured rollout against two models, as ``loomrl.cycle.cycle_profile`` and the
planner's ``cycle_time`` build them: "chained" (each call costs alpha + per_item * envs, hop 0)
and "fixed_hops" (each side costs per_item * envs, the two alphas are the cycle's hop, which
ring groups overlap). Intercepts and overlap slowdown come from the probe's samples where the
run kept them (``cycle_costs``), else from the stored chained profile and predictions. Then, per
set of trials, whether each model ranked the fastest trial first, and what its pick cost
against the fastest. Trials whose ring groups were smaller than any group the probe timed
(marked "*": from runs before the cycle's ``min_group``, or the first k past it, which trials
now time) are counted apart and left out of the ranking: the planner's search does not offer
such plans, only trials do.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from itertools import groupby


class _Side:
    """A cycle member as ``loomrl.plan.cost.cycle_time`` prices it: alpha + per_env * envs."""

    def __init__(self, alpha: float, per_env: float):
        self.alpha, self.per_env = alpha, per_env

    def time(self, devices: int, envs: float) -> float:
        return self.alpha + self.per_env * envs


def smallest_probed(cc: dict | None, n: int, placement: dict) -> int:
    """The smallest group of envs the run's probe timed: from its samples where it kept them,
    else the sizes the recipe probes (n / d for d in 1, 2, 4, 8 that every env worker can take
    a share of)."""
    if cc:
        return min(x for x, _ in cc["samples"]["env"])
    w = placement.get("env_workers") or len(placement["env_devices"])
    return min(n // d for d in (1, 2, 4, 8) if n % d == 0 and (n // d) % w == 0)


def trial_rows(path: str) -> list[tuple]:
    """(run, mode, plan, measured rollout s, chained s, fixed_hops s) per trial in ``path``."""
    from loomrl.cycle import _fit_line, overlap_slowdown  # the fit and slowdown the recipe used
    from loomrl.plan.cost import cycle_time  # the planner's ring, priced the same way

    d = json.load(open(path))
    S, n = d["args"]["steps"], d["args"]["num_envs"]
    name = path.rsplit("/", 1)[-1].removesuffix(".json")
    rows = []
    # every round's trials (a round keeps its own probe, profile and trials; the result's top
    # level repeats the last round's)
    if "results" in d:
        rounds = [
            (f"{name}#{i}" if len(r.get("rounds") or []) > 1 else name, {**r, **rr})
            for r in d["results"]
            for i, rr in enumerate(r.get("rounds") or [r])
        ]
    else:  # a benchmark cut off before its summary ("complete": false): its raw runs by mode
        rounds = [(f"{name}#{i}", rr) for rs in d["runs"].values() for i, rr in enumerate(rs)]
    for run, r in rounds:
        if not r.get("feasible") or not r.get("trials") or not r.get("profile"):
            continue
        pr, cc = r["profile"], r.get("cycle_costs")
        e, p = pr["env"]["time"], pr["policy"]["time"]
        upd = pr["actor_train"]["time"]["alpha"]
        if cc:  # the probe's own samples: the same whichever model the run planned with
            ae, ap = _fit_line(cc["samples"]["env"])[0], _fit_line(cc["samples"]["policy"])[0]
            slow = overlap_slowdown(cc["samples"])
        else:  # older runs planned with chained costs: their intercepts are the profile's
            ae, ap, slow = e["alpha"], p["alpha"], None

        def per_env(t: dict, e: dict = e, p: dict = p) -> tuple:
            pl = t["placement"]

            def side(c: dict, devices: int) -> float:
                return c["per_item"].get(str(devices), next(iter(c["per_item"].values())))

            return side(e, len(pl["env_devices"])), side(p, len(pl["policy_devices"]))

        def spec(t: dict) -> tuple:
            k = t["placement"]["groups"]
            return ("coloc", 1) if t["placement"]["colocated"] else ("split", 1, 1, k)

        if slow is None:  # recovered from the chained predictions of split trials
            slows = []
            for t in r["trials"]["trials"]:
                k, (be, bp) = t["placement"]["groups"], per_env(t)
                if not t["placement"]["colocated"] and k >= 2 and ae + ap + be + bp > 0:
                    base = cycle_time(_Side(ae, be), _Side(ap, bp), S, n, spec(t))
                    slows.append((t["predicted_s"] - upd) / base)
            slow = statistics.mean(slows) if slows else 1.0
        for t in r["trials"]["trials"]:
            k, (be, bp) = t["placement"]["groups"], per_env(t)
            col = t["placement"]["colocated"]
            # fixed_hops: a side whose cost does not grow with envs keeps its intercept
            fe, fp = (be > 1e-9), (bp > 1e-9)
            hop = (ae if fe else 0.0) + (ap if fp else 0.0)
            xa, xb = _Side(0.0 if fe else ae, be), _Side(0.0 if fp else ap, bp)
            chained = cycle_time(_Side(ae, be), _Side(ap, bp), S, n, spec(t), slow)
            fixed = cycle_time(xa, xb, S, n, spec(t), slow, hop)
            # "*": groups smaller than any the probe timed, which runs since then never plan
            # (the cycle's min_group); such trials come from runs before it.
            below = not col and k >= 2 and n / k < smallest_probed(cc, n, t["placement"])
            plan = "col" if col else f"k{k}" + ("*" if below else "")
            rows.append((run, r["mode"], plan, t["rollout_s"], chained, fixed))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("files", nargs="+")
    args = p.parse_args()
    rows = [row for f in args.files for row in trial_rows(f)]
    if not rows:
        print("no trials in these files", file=sys.stderr)
        return 1
    errs: dict[str, dict[str, list[float]]] = {}
    print(f"{'run':<40}{'mode':<9}{'plan':<5}{'meas':>7}{'chained':>9}{'fixed_hops':>11}")
    for name, mode, plan, meas, ch, fx in rows:
        print(
            f"{name:<40}{mode:<9}{plan:<5}{meas:7.3f}{100 * (meas / ch - 1):+8.1f}%"
            f"{100 * (meas / fx - 1):+10.1f}%"
        )
        kind = "co-located" if plan == "col" else ("split k=1" if plan == "k1" else "split k>=2")
        if plan.endswith("*"):
            kind = "split k>=2, groups smaller than the probe timed"
        for model, pred in (("chained", ch), ("fixed_hops", fx)):
            errs.setdefault(kind, {}).setdefault(model, []).append(abs(meas / pred - 1))
    for kind, by in errs.items():
        print(
            f"{kind} ({len(by['chained'])} trials): "
            + "; ".join(
                f"{m} {100 * statistics.mean(v):.1f}% off on average, {100 * max(v):.1f}% at most"
                for m, v in by.items()
            )
        )
    sets = [list(g) for _, g in groupby(rows, key=lambda r: (r[0], r[1]))]
    # Ranking: among the plans a run may pick now (groups at least as large as the probe timed)
    sets = [[r for r in g if not r[2].endswith("*")] for g in sets]
    sets = [g for g in sets if len(g) >= 2]
    for i, model in ((4, "chained"), (5, "fixed_hops")):
        best = [min(g, key=lambda r: r[3]) for g in sets]
        picks = [min(g, key=lambda r: r[i]) for g in sets]
        hits = sum(a is b for a, b in zip(picks, best, strict=True))
        loss = max(a[3] / b[3] - 1 for a, b in zip(picks, best, strict=True))
        print(
            f"{model}: ranked the fastest trial first in {hits} of {len(sets)} sets; "
            f"its pick at most {100 * loss:.1f}% slower than the fastest"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
