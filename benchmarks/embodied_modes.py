"""The embodied PPO recipe under each placement mode, measured in one run, beside the planner.

    python benchmarks/embodied_modes.py --env InvertedPendulum-v5 --num-envs 8 --steps 64 \
        --iterations 12 --out embodied_modes.json

Runs ``loomrl.recipes.embodied_ppo`` with placement temporal (env and policy co-located,
alternating), hybrid (env and policy on disjoint devices, k ring groups, training time-shared),
spatial (when the device count allows one), and auto (the planner picks from costs the recipe
measures itself). For each: the plan (env devices, or "host" for env workers on host cores beside
the accelerators, x the number of env workers | policy devices | k), the model's seconds per
iteration from the measured costs ("model"), the prediction after the recipe timed the plan on
short real rollouts ("pred", what the run reports), the measured median after warm-up, and
env-steps/s. Exits 1 when a
plan auto chose (in any round) is more than 5% slower than the best measured plan (runs of the
same placement, e.g. auto and the mode it picked, are pooled: they ran one plan; without auto in
``--modes`` there is no pick to judge, and it exits 0). Beside the pooled
time per placement it prints the fastest and slowest run of it (the noise a prediction is judged
against) and how many runs (a mode in a round) were predicted within 5%. The last line reads
``auto_mode: <mode> best_mode: <mode> auto_vs_best: <ratio>`` (auto's plan in its last round,
the fastest plan's mode, the verdict's ratio); the line before it, when both
ran, ``hybrid_vs_temporal`` (temporal's measured s/it over hybrid's; in ``--out`` too, null
when either did not run). With ``--rounds`` every
mode runs once per round, each round starting one mode later. ``--out`` is rewritten after every
run (``"complete": false`` and the raw ``runs`` so far) and at the end with the summary
(``"complete": true``), so a benchmark cut off by a time limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from loomrl.cycle import (  # no torch or Ray at import
    BATCHES,
    CYCLE_MODEL_KEYS,
    CYCLE_MODELS,
    HANDOFFS,
)

TOLERANCE = 1.05


def run_mode(placement: str, args: argparse.Namespace, out_dir: Path) -> dict:
    from loomrl.config import load_config
    from loomrl.errors import PlacementError, PlanError
    from loomrl.recipes.embodied_ppo import Config, main
    from loomrl.runlog import read_metrics

    overrides = [
        f"env.env_id={args.env}",
        f"env.num_envs={args.num_envs}",
        f"env.pixels={str(args.pixels).lower()}",
        f"env.image_size={args.image_size}",
        f"env.cpu_cores={args.env_cores}",
        f"ppo.rollout_steps={args.steps * args.num_envs}",
        f"ppo.epochs={args.epochs}",
        f"ppo.num_minibatches={args.minibatches}",
        f"run.placement={placement}",
        f"run.steps={args.iterations}",
        f"run.output_dir={out_dir / placement}",
        "run.tensorboard=false",
        "run.progress=false",
    ]
    if args.device == "cpu":
        overrides.append("run.num_gpus=0")
    if args.devices:
        overrides.append(f"run.devices={args.devices}")
    if args.no_pin:
        overrides.append("run.pin_cores=false")
    if args.no_graphs:
        overrides.append("policy_cuda_graphs=false")
    if args.no_step_graph:
        overrides.append("policy_step_graph=false")
    if args.no_batch_render:
        overrides.append("env.batch_render=false")
    if args.cycle_model:
        overrides.append(f"cycle_model={args.cycle_model}")
    if args.handoff:
        overrides.append(f"cycle_handoff={args.handoff}")
    if args.batch:
        overrides.append(f"cycle_batch={args.batch}")
    for key, value in args.policy_kwargs.items():
        overrides.append(f"policy_kwargs.{key}={json.dumps(value)}")
    cfg = load_config(Config, None, overrides)
    t, cpu0, started = time.perf_counter(), _cpu_stat(), time.time()
    try:
        s = main(cfg)
    except (PlanError, PlacementError) as e:  # no plan of this mode, or none that fits the cores
        return {"mode": placement, "feasible": False, "reason": str(e)}
    took, steal = time.perf_counter() - t, _steal_share(cpu0, _cpu_stat())
    iters = s["iteration_s"]
    measured = s["measured_iteration_s"]
    # The env <-> policy cycle alone (the part a plan can overlap), per iteration.
    collect = []
    for line in (out_dir / placement / "timeline.jsonl").read_text().splitlines():
        recs = json.loads(line)["records"]
        collect += [r["end"] - r["start"] for r in recs if r["component"] == "env<->policy"]
    logged = [m for m in read_metrics(out_dir / placement) if "time/env_busy" in m]
    busy = {  # per iteration: seconds inside env steps (per env worker) and policy calls
        "env_busy_s": [m["time/env_busy"] for m in logged],
        "policy_busy_s": [m["time/policy_busy"] for m in logged],
        "env_wait_s": [m.get("time/env_wait") for m in logged],
        "cycle_span_s": [m.get("time/cycle_span") for m in logged],
        "policy_idle_s": [m.get("time/policy_idle") for m in logged],
        "env_render_s": [m.get("time/env_render") for m in logged],
        "env_render_reads": [m.get("env_render_reads") for m in logged],
        "policy_calls": [m.get("policy_calls") for m in logged],
        "policy_graph_captures": [m.get("policy_graph_captures") for m in logged],
    }
    prof = out_dir / placement / "profile.json"  # the fitted costs the plan was chosen from
    trials = out_dir / placement / "trials.json"  # short real rollouts timed before the run
    tr = json.loads(trials.read_text()) if trials.exists() else None
    costs = out_dir / placement / "cycle_costs.json"  # the probe's costs, two models' s/it
    cycle_costs = json.loads(costs.read_text()) if costs.exists() else None
    alt = {k: (cycle_costs or {}).get(k) for k in CYCLE_MODEL_KEYS.values()}
    return {
        "mode": placement,
        "feasible": True,
        # The model's own prediction, before the trial re-costed it to a measured rollout.
        "model_s": tr["trials"][tr["chosen"]]["predicted_s"] if tr else s["predicted_iteration_s"],
        # The same plan under each cycle model (cycle_model), whichever the run planned with.
        **alt,
        "profile": json.loads(prof.read_text())["components"] if prof.exists() else None,
        "trials": tr,
        # The probe's samples (chained calls and busy time inside them), to fit other models to.
        "cycle_costs": cycle_costs,
        "plan_mode": s["plan"]["mode"],
        "placement": s["placement"],
        "probe_workers_reused": s.get("probe_workers_reused"),
        "cycle_handoff": s.get("cycle_handoff"),  # driver, direct or pipe
        "policy_cuda_graphs": s.get("policy_cuda_graphs"),
        "predicted_s": s["predicted_iteration_s"],
        "measured_s": measured,
        "iteration_s": iters,
        "collect_s": collect,
        **busy,
        "env_steps_per_s": args.steps * args.num_envs / measured,
        "episode_return": s["metrics"].get("episode_return"),
        "wall_s": took,
        "started": started,  # epoch seconds, to line the run up with host-wide samples
        "steal_share": steal,
    }


def _cpu_stat() -> list[int] | None:
    """The host's CPU time counters (/proc/stat's first line), None where there is none."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def _steal_share(a: list[int] | None, b: list[int] | None) -> float | None:
    """Share of CPU time the hypervisor gave to others between two readings (the 8th counter):
    on a virtual machine, the reason one plan can run at different speeds from run to run."""
    if not a or not b or len(a) < 8:
        return None
    total = sum(b[:8]) - sum(a[:8])
    return (b[7] - a[7]) / total if total > 0 else None


def _merge(rs: list[dict]) -> dict:
    """One row per mode over rounds: the median of every warm iteration of every round."""
    ok = [r for r in rs if r["feasible"]]
    if not ok:
        return rs[0]
    warm = [t for r in ok for t in _warm(r)]
    out = dict(ok[-1])
    out["measured_s"] = statistics.median(warm)
    cyc = [t for r in ok for t in _warm(r, "collect_s")]
    out["collect_median_s"] = statistics.median(cyc) if cyc else None
    out["predicted_s"] = statistics.median(r["predicted_s"] for r in ok)
    out["model_s"] = statistics.median(r["model_s"] for r in ok)
    for key in CYCLE_MODEL_KEYS.values():
        vals = [r[key] for r in ok if r.get(key)]
        out[key] = statistics.median(vals) if vals else None
    out["env_steps_per_s"] = ok[0]["env_steps_per_s"] * ok[0]["measured_s"] / out["measured_s"]
    out["rounds"] = rs
    out["plans"] = [(r["plan_mode"], r["placement"]) for r in ok]
    return out


def _env_where(pl: dict) -> str:
    """Env devices, or 'host' for env workers on host cores beside the policy; 'xW' workers."""
    where = str(pl["env_devices"]) if pl["env_devices"] else "host"
    return f"{where}x{pl.get('env_workers', len(pl['env_devices']))}"


def _placement_key(pl: dict) -> str:
    where = "co-located" if pl["colocated"] else "split"
    return f"env {_env_where(pl)} policy {pl['policy_devices']} k={pl['groups']} {where}"


def _warm(r: dict, key: str = "iteration_s") -> list[float]:
    """A run's times under ``key`` (per iteration) after the first (warm-up), or all of them
    when there is one."""
    return r[key][1:] or r[key]


def _by_placement(runs: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Every feasible run, grouped by its placement (runs of one placement ran one plan)."""
    per: dict[str, list[dict]] = {}
    for rs in runs.values():
        for r in rs:
            if r["feasible"]:
                per.setdefault(_placement_key(r["placement"]), []).append(r)
    return per


def _pooled_by_placement(runs: dict[str, list[dict]]) -> dict[str, float]:
    """Median warm iteration time per distinct placement over every run that used it."""
    return {
        k: statistics.median(t for r in rs for t in _warm(r))
        for k, rs in _by_placement(runs).items()
    }


def _spread_by_placement(runs: dict[str, list[dict]]) -> dict[str, list[float]]:
    """Per distinct placement, the fastest and slowest run's measured s/it: the same plan run
    again on fresh workers, the noise a prediction is judged against."""
    return {
        k: [min(r["measured_s"] for r in rs), max(r["measured_s"] for r in rs)]
        for k, rs in _by_placement(runs).items()
    }


def _round_errors(runs: dict[str, list[dict]]) -> list[dict]:
    """Every feasible run's prediction error, (measured - predicted) / predicted, by round."""
    return [
        {"mode": mode, "round": i, "error": (r["measured_s"] - r["predicted_s"]) / r["predicted_s"]}
        for mode, rs in runs.items()
        for i, r in enumerate(rs)
        if r["feasible"]
    ]


def _late_captures(runs: dict[str, list[dict]]) -> dict[str, int]:
    """Per run ("mode round N") that recorded any, the policy's CUDA graphs recorded after its
    first iteration: each is two eager forwards and a capture inside a timed iteration."""
    out = {}
    for mode, rs in runs.items():
        for i, r in enumerate(rs):
            caps = [c for c in r.get("policy_graph_captures") or [] if c is not None]
            if len(caps) > 1 and caps[-1] > caps[0]:
                out[f"{mode} round {i}"] = int(caps[-1] - caps[0])
    return out


def _verdict(runs: dict[str, list[dict]]) -> tuple[float, dict[str, float]]:
    """auto's slowest pick over the best plan (NaN without auto), and the pooled s/it by placement.

    Runs with the same placement ran the same plan: their iterations are pooled, so that the
    verdict compares plans, not the machine's drift between two runs of one plan. Every round's
    choice is judged: a plan auto picked in one round and not the next was still its choice."""
    pooled = _pooled_by_placement(runs)
    picked = {_placement_key(r["placement"]) for r in runs.get("auto", []) if r["feasible"]}
    if not picked:
        return float("nan"), pooled
    return max(pooled[k] for k in picked) / min(pooled.values()), pooled


def _best_mode(runs: dict[str, list[dict]], pooled: dict[str, float]) -> str:
    """The mode (temporal or hybrid) of the fastest plan by pooled s/it: the plan auto_vs_best
    is measured against ("none" when nothing ran). Not the fastest mode's row: auto's merged
    rounds may have run two plans, its row showing the last one."""
    if not pooled:
        return "none"
    best = min(pooled, key=pooled.__getitem__)
    return next(
        r["placement"]["mode"]
        for rs in runs.values()
        for r in rs
        if r["feasible"] and _placement_key(r["placement"]) == best
    )


def round_order(modes: list[str], rnd: int) -> list[str]:
    """The modes of round ``rnd``: the list turned by ``rnd`` places, so that over as many
    rounds as modes each mode runs once in every position."""
    i = rnd % len(modes) if modes else 0
    return modes[i:] + modes[:i]


def _write(path: str, doc: dict) -> None:
    """Write ``doc`` as JSON through a temporary file, so that a run killed mid-write leaves the
    previous version whole."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.replace(path)


MODES = ("temporal", "hybrid", "spatial", "auto")


def _modes(text: str) -> str:
    """--modes: a comma-separated list of placement modes (argparse reports others); kept as
    text, the way the results' ``args`` record it."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise argparse.ArgumentTypeError(
            f"{', '.join(bad) or text!r}: not a placement mode; choose from {', '.join(MODES)}"
        )
    return ",".join(dict.fromkeys(modes))


def _json_object(text: str) -> dict:
    """--policy-kwargs: a JSON object (argparse reports anything else as a usage error)."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--env", default="InvertedPendulum-v5")
    p.add_argument("--pixels", action="store_true", help="image observations (CNN policy)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=64, help="steps per env per iteration (S)")
    # 12: on the 2-core host a state iteration takes about 0.1 s and one plan's iterations
    # spread by +-30%; the median of 3 warm ones (the former default) could rank two runs of
    # near-equal plans either way (run 32: auto_vs_best 1.326 between plans whose trial
    # rollouts overlapped).
    p.add_argument("--iterations", type=int, default=12, help="per mode; the first is warm-up")
    p.add_argument("--epochs", type=int, default=2, help="PPO epochs per iteration")
    p.add_argument("--minibatches", type=int, default=4)
    p.add_argument("--env-cores", type=float, default=1.0, help="env.cpu_cores per env worker")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--devices", type=int, default=None, help="CPU slots to plan over (cpu)")
    p.add_argument("--modes", type=_modes, default="temporal,hybrid,spatial,auto")
    p.add_argument("--rounds", type=int, default=1, help="repeat every mode, interleaved")
    p.add_argument(
        "--no-pin", action="store_true", help="leave GPU-node env workers unpinned (run.pin_cores)"
    )
    p.add_argument(
        "--no-graphs",
        action="store_true",
        help="run a GPU policy's forward eagerly, not as CUDA graphs (policy_cuda_graphs)",
    )
    p.add_argument(
        "--no-step-graph",
        action="store_true",
        help="run the PPO minibatch step eagerly, act's graphs kept (policy_step_graph)",
    )
    p.add_argument(
        "--no-batch-render",
        action="store_true",
        help="render pixel observations env by env through gymnasium (env.batch_render=false)",
    )
    p.add_argument(
        "--cycle-model",
        choices=("auto", *CYCLE_MODELS),
        default=None,
        help="how measured costs become the cycle's model (cycle_model; default: the recipe's)",
    )
    p.add_argument(
        "--handoff",
        choices=HANDOFFS,
        default=None,
        help="how env workers and the policy hand off (cycle_handoff; default: the recipe's)",
    )
    p.add_argument(
        "--batch",
        choices=BATCHES,
        default=None,
        help="what a split pipe cycle's policy acts on (cycle_batch; default: the recipe's)",
    )
    p.add_argument(
        "--policy-kwargs",
        type=_json_object,
        default={},
        help="JSON object for the policy's constructor (policy_kwargs), e.g. '{\"channels\": [64, 128, 128]}'",
    )
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    from loomrl.cluster import Cluster

    cluster = Cluster.start(
        num_gpus=0 if args.device == "cpu" else None,
        num_devices=args.devices,
        log_to_driver=False,
    )
    load = os.getloadavg()
    runs: dict[str, list[dict]] = {m: [] for m in args.modes.split(",")}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            # Rounds interleave the modes so that drifting load on a shared machine hits all
            # alike, and each round starts one mode later, so that no mode always runs first or
            # last.
            for rnd in range(args.rounds):
                for mode in round_order(list(runs), rnd):
                    r = run_mode(mode, args, Path(tmp) / f"round{rnd}")
                    runs[mode].append(r)
                    print(f"{mode}: {r.get('measured_s') or r.get('reason')}", file=sys.stderr)
                    if args.out:  # what ran so far survives a run cut off by a time limit
                        doc = {"args": vars(args), "load_average": load, "complete": False}
                        _write(args.out, {**doc, "runs": runs})
    finally:
        cluster.shutdown()
    results = [_merge(rs) for rs in runs.values()]

    ok = [r for r in results if r["feasible"]]
    auto = next((r for r in ok if r["mode"] == "auto"), None)
    print(
        f"{args.env} pixels={args.pixels} num_envs={args.num_envs} S={args.steps} "
        f"device={args.device} load average at start {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
    )
    print(
        f"{'mode':<9}{'plan':<10}{'env':<11}{'pol dev':<9}{'k':>3}{'model s/it':>11}{'error':>8}"
        f"{'pred s/it':>11}{'meas s/it':>11}{'error':>8}{'env-steps/s':>13}{'cycle s':>9}"
    )
    for r in results:
        if not r["feasible"]:
            print(f"{r['mode']:<9}infeasible: {r['reason']}")
            continue
        pl = r["placement"]
        err = (r["measured_s"] - r["predicted_s"]) / r["predicted_s"]
        m_err = (r["measured_s"] - r["model_s"]) / r["model_s"]
        print(
            f"{r['mode']:<9}{r['plan_mode']:<10}{_env_where(pl):<11}"
            f"{str(pl['policy_devices']):<9}{pl['groups']:>3}{r['model_s']:>11.3f}"
            f"{100 * m_err:>+7.1f}%{r['predicted_s']:>11.3f}"
            f"{r['measured_s']:>11.3f}{100 * err:>+7.1f}%{r['env_steps_per_s']:>13.0f}"
            f"{r.get('collect_median_s') or float('nan'):>9.3f}"
        )
        chosen = [_placement_key(x["placement"]) for x in r["rounds"] if x["feasible"]]
        if len(set(chosen)) > 1:  # the row above shows the last round's plan
            print(f"{'':<9}plans by round: " + "; ".join(chosen))
    for label, key in CYCLE_MODEL_KEYS.items():
        have = [r for r in ok if r.get(key)]
        if have:
            print(
                f"cycle model {label}, off the measured: "
                + ", ".join(
                    f"{r['mode']} {100 * (r['measured_s'] / r[key] - 1):+.1f}%" for r in have
                )
            )
    ratio, pooled = _verdict(runs)
    spread = _spread_by_placement(runs)
    if pooled:
        print(
            "per placement, all runs pooled (s/it; fastest and slowest run): "
            + ", ".join(
                f"{k}: {v:.3f} ({spread[k][0]:.3f}-{spread[k][1]:.3f})"
                for k, v in sorted(pooled.items(), key=lambda kv: kv[1])
            )
        )
    errors = _round_errors(runs)
    if errors:
        off = [e for e in errors if abs(e["error"]) > TOLERANCE - 1]
        print(
            f"predictions within {100 * (TOLERANCE - 1):.0f}%: {len(errors) - len(off)} of "
            f"{len(errors)} runs"
            + (
                "; off by more: "
                + ", ".join(f"{e['mode']} round {e['round']} {100 * e['error']:+.1f}%" for e in off)
                if off
                else ""
            )
        )
    steal = [x.get("steal_share") for rs in runs.values() for x in rs]
    steal = [x for x in steal if x is not None]
    if steal:
        print(f"host CPU steal during the runs: {100 * min(steal):.1f}-{100 * max(steal):.1f}%")
    late = _late_captures(runs)
    if late:
        print(
            "policy CUDA graphs recorded after the first iteration (row counts met late or "
            "dropped by the cache): " + ", ".join(f"{k} {n}" for k, n in late.items())
        )
    by_mode = {r["mode"]: r for r in ok}
    speedup = None
    if "temporal" in by_mode and "hybrid" in by_mode:
        speedup = by_mode["temporal"]["measured_s"] / by_mode["hybrid"]["measured_s"]
        print(f"hybrid_vs_temporal (temporal s/it / hybrid s/it): {speedup:.3f}")
    auto_mode = auto["plan_mode"] if auto else "none"
    best_mode = _best_mode(runs, pooled)
    if args.out:
        _write(
            args.out,
            {
                "args": vars(args),
                "load_average": load,
                "complete": True,
                "results": results,
                "auto_mode": auto_mode,
                "best_mode": best_mode,
                "auto_vs_best": ratio,
                "pooled_by_placement": pooled,
                "spread_by_placement": spread,
                "round_errors": errors,
                "hybrid_vs_temporal": speedup,
            },
        )
    print(f"auto_mode: {auto_mode} best_mode: {best_mode} auto_vs_best: {ratio:.3f}")
    if "auto" not in runs:  # no choice of auto's to judge
        return 0
    return 0 if ratio == ratio and ratio <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
