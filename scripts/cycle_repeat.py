"""How much one plan's rollout time varies on this machine, and whether what runs between
rollouts changes it: the embodied benchmark's CPU config, planned once, then its cycle timed
back to back, after a PPO update (as in a run), and after a pause, the three taking turns.
With ``--rebuild`` the workers are then rebuilt to their launch state, as a run's are after its
trial (``plan_cycle``), and the three are timed again (``..._rebuilt``): whether a run's
rollouts differ from its trial's because of the rebuild or because of the updates between them.

    python scripts/cycle_repeat.py --placement hybrid --out cycle_repeat_hybrid.json
    python scripts/cycle_repeat.py --device cuda --pixels --num-envs 96 --steps 32 \
        --env-cores 3 --placement temporal --reps 10 --rebuild --out cycle_repeat_gpu.json

A trial times a few rollouts and predicts a run's; when rollouts of one plan on one set of
workers spread more than the gap between two plans, no trial can rank them reliably, and a
prediction is off by that spread whatever the model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any


@contextlib.contextmanager
def one_plan(
    placement: str, num_envs: int, steps: int, extra: Sequence[str] = ()
) -> Iterator[tuple[Any, Any, Any]]:
    """The embodied benchmark's CPU config (InvertedPendulum-v5, state observations, one core per
    env worker; ``extra`` overrides replace these), planned for ``placement`` at S = ``steps``
    and launched: yields the placement, the policy worker and the cycle; the run is closed on
    exit."""
    from loomrl.config import load_config
    from loomrl.cycle_trial import plan_cycle, start_cycle
    from loomrl.recipes.embodied_ppo import Config
    from loomrl.run import Run

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            "env.env_id=InvertedPendulum-v5",
            f"env.num_envs={num_envs}",
            "env.cpu_cores=1",
            f"ppo.rollout_steps={steps * num_envs}",
            "ppo.epochs=2",
            "ppo.num_minibatches=4",
            f"run.placement={placement}",
            f"run.output_dir={tmp}/run",
            "run.tensorboard=false",
            "run.progress=false",
            "run.num_gpus=0",
            *extra,
        ]
        cfg = load_config(Config, None, overrides)
        run = Run(cfg, cfg.run)
        try:
            place, probe = plan_cycle(run, cfg, steps)
            _, policy, cycle = start_cycle(run.cluster, cfg, place, probe)
            yield place, policy, cycle
        finally:
            run.close()


def rebuilt(cycle: Any, groups: int) -> Any:
    """``cycle``'s workers rebuilt to their launch state, as ``plan_cycle`` hands a trial's
    workers to the run, and a new cycle over them (the rebuilt policy listens on a new socket)."""
    from loomrl.cycle import EnvPolicyCycle
    from loomrl.worker import wait

    wait(cycle.envs._call("_loom_rebuild"), cycle.policy._call("_loom_rebuild"))
    return EnvPolicyCycle(
        cycle.envs,
        cycle.policy,
        cycle.num_envs // cycle.workers,
        groups,
        cycle.pipelined,
        handoff=cycle.handoff,
        timeout_s=cycle.timeout_s,
    )


def main() -> None:
    from loomrl.worker import wait

    ap = argparse.ArgumentParser()
    ap.add_argument("--placement", default="hybrid", choices=["temporal", "hybrid", "auto"])
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=64, help="steps per env per rollout (S)")
    ap.add_argument("--reps", type=int, default=6, help="rollouts per pattern")
    ap.add_argument("--pause", type=float, default=0.05, help="seconds idle before a rollout")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--pixels", action="store_true", help="64x64 image observations (CNN)")
    ap.add_argument("--env-cores", type=float, default=1.0, help="env.cpu_cores per env worker")
    ap.add_argument(
        "--rebuild", action="store_true", help="rebuild the workers, then time the patterns again"
    )
    ap.add_argument("--out", default="cycle_repeat.json")
    args = ap.parse_args()

    S = args.steps
    res: dict = {"args": vars(args)}
    extra = [f"env.cpu_cores={args.env_cores}"]
    if args.device == "cuda":
        extra.append("run.num_gpus=null")
    if args.pixels:
        extra += ["env.pixels=true", "env.image_size=64"]
    with one_plan(args.placement, args.num_envs, S, extra) as (place, policy, cycle):
        res["placement"], res["predicted_s"] = place.describe(), place.predicted_s
        res["handoff"] = cycle.handoff  # driver or direct (the recipe's cycle_handoff)
        cycle.collect(S)  # warm-up

        # Each timed rollout comes right after its pattern's prelude, and the patterns take
        # turns, so that the host's slow and fast spells fall on all of them alike.
        preludes = {
            "back_to_back": lambda: None,
            "after_update": lambda: wait(policy.update(1.0)),
            "after_pause": lambda: time.sleep(args.pause),
        }
        sets = [""] + (["_rebuilt"] if args.rebuild else [])
        for suffix in sets:
            if suffix:
                cycle = rebuilt(cycle, place.groups)
                cycle.collect(S)  # the run's first iteration, its warm-up
            res.update({name + suffix: [] for name in preludes})
            for _ in range(args.reps):
                for name, prelude in preludes.items():
                    prelude()
                    res[name + suffix].append(cycle.collect(S).wall_s)
    every = [x for k, v in res.items() if isinstance(v, list) for x in v]
    lo, hi, med = min(every), max(every), statistics.median(every)
    res["spread"] = {"min": lo, "median": med, "max": hi}
    print(
        f"{args.placement} {place.describe()}, hand-offs {res['handoff']}: "
        f"predicted {res['predicted_s']:.3f} s/iteration"
    )
    for name in (n + suffix for suffix in sets for n in preludes):
        v = res[name]
        print(f"  {name:<21} median {statistics.median(v):.3f} s  {[round(x, 3) for x in v]}")
    print(
        f"  every rollout: {lo:.3f}-{hi:.3f} s, median {med:.3f} "
        f"({100 * (lo / med - 1):+.0f}% to {100 * (hi / med - 1):+.0f}%)"
    )
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
