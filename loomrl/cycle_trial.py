"""Placing the embodied env <-> policy cycle: cost probe, planner, trial rollouts.

What ``placement=auto`` (and a placement mode) does before the embodied recipe's loop starts:
launch throw-away env and policy workers (the probe), time a few env steps and policy calls
(``loomrl.cycle.measure_costs``), plan from those costs, then time the close candidates on
short real rollouts on the same workers, keep the fastest and re-cost its prediction to what
it measured. ``plan_cycle`` returns the placement and, when the plan places its workers as the
probe did, the probe's workers rebuilt to their launch state for the run. ``start_cycle``
launches (or adopts) the workers of a placement and joins them in an ``EnvPolicyCycle``.

The recipe's loop (``loomrl.recipes.embodied_ppo``) knows none of this: it runs the cycle and
the PPO update under whatever placement comes back.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from loomrl.cycle import (
    BOOKKEEPING_S,
    CYCLE_MODEL_KEYS,
    ENV,
    POLICY,
    CyclePlacement,
    EnvPolicyCycle,
    best_split_plan,
    check_cores,
    check_profile,
    cycle_profile,
    host_env_workers,
    measure_costs,
    placement_from_plan,
    split_plans_and_past,
)
from loomrl.envs.memory import NodeMemory, rollout_memory_problem
from loomrl.errors import ConfigError, PlacementError, PlanError
from loomrl.run import Run
from loomrl.worker import wait
from loomrl.workers.env import EnvWorker, worker_env_config
from loomrl.workers.policy import PolicyWorker

if TYPE_CHECKING:  # the recipe imports this module
    from loomrl.recipes.embodied_ppo import Config


def _launch_policy(cluster: Any, cfg: Config, envs: Any, devices: list[int], name: str) -> Any:
    """The policy worker, shaped by the env workers' observation and action spaces; a
    ``ConfigError`` where its rollout buffers, sized by those observations, cannot fit the
    node's memory (lazily allocated, they would fill it mid-rollout)."""
    sp = wait(envs.on(0).spaces())[0]
    ppo = cfg.ppo
    problem = rollout_memory_problem(
        cfg.env,
        ppo.rollout_steps,
        ppo.normalize_obs,
        tuple(sp["observation_space"].shape),
        NodeMemory(),
    )
    if problem is not None:
        raise ConfigError([problem])
    return cluster.launch(
        PolicyWorker,
        1,
        sp["observation_space"],
        sp["action_space"],
        cfg.env.num_envs,
        cfg.ppo,
        cfg.env.seed,
        cfg.policy,
        policy_kwargs=dict(cfg.policy_kwargs),
        cuda_graphs=cfg.policy_cuda_graphs,
        step_graph=cfg.policy_step_graph,
        devices=devices,
        name=name,
    )


def start_cycle(
    cluster: Any,
    cfg: Config,
    place: CyclePlacement,
    workers: tuple | None = None,
    on_events: Callable[[list], None] | None = None,
) -> tuple[Any, Any, Any]:
    """Env workers (env.cpu_cores each), the policy worker and their cycle; ``workers``: an
    (env, policy) pair already placed as ``place`` wants, used instead of launching;
    ``on_events``: the cycle's (``EnvPolicyCycle``)."""
    w = place.workers
    if workers is not None:
        envs, policy = workers
    else:
        envs = cluster.launch(
            EnvWorker,
            w,
            worker_env_config(cfg.env, w),
            devices=list(place.launch_devices),
            num_cpus=cfg.env.cpu_cores,
            name="env",
        )
        try:
            policy = _launch_policy(cluster, cfg, envs, list(place.policy_devices), "policy")
        except BaseException:
            envs.kill()
            raise
    cycle = EnvPolicyCycle(
        envs,
        policy,
        cfg.env.num_envs // w,
        place.groups,
        cfg.pipelined,
        handoff=handoff(cfg, cluster),
        timeout_s=cfg.cycle_timeout_s,
        on_events=on_events,
        batch=cfg.cycle_batch,
    )
    return envs, policy, cycle


def handoff(cfg: Config, cluster: Any) -> str:
    """The cycle's ``handoff`` for ``cfg.cycle_handoff``: ``direct`` asks for direct calls
    wherever they apply (the cycle's ``auto``); ``auto`` is ``pipe`` on a one-node cluster,
    else direct calls where they apply on a CPU-only cluster, else ``driver``."""
    if cfg.cycle_handoff in ("driver", "pipe"):
        return cfg.cycle_handoff
    if cfg.cycle_handoff == "auto" and len(cluster.nodes) == 1 and cfg.pipelined:
        return "pipe"
    if cfg.cycle_handoff == "auto" and cluster.has_cuda:
        return "driver"
    return "auto"


MODES = ("auto", "temporal", "spatial", "hybrid")
# How many k beyond its window a trial may walk while the fastest has an untimed k next to it:
# each step costs a warm-up and reps rollouts of two cycles.
TRIAL_WALK = 3


def host_workers(cluster: Any, cfg: Config) -> int | None:
    """Env workers on host cores beside accelerators (None where devices are CPU slots)."""
    if not cluster.has_cuda:
        return None
    return host_env_workers(cfg.env.num_envs, cfg.env.cpu_cores, cluster.nodes[0].num_cpus)


def plan_cycle(run: Run, cfg: Config, steps: int) -> tuple[CyclePlacement, tuple | None]:
    """Choose the plan (measured costs, a profile file, or a plan file) and map it to workers.

    On measured costs, the plan is then timed on short real rollouts (``trial``): placement=auto
    times every close candidate and keeps the fastest, hybrid its split cycle at the close k
    (both walking on to an untimed k next to the fastest), temporal or spatial its
    one plan. Either
    way the plan's prediction is re-costed to the rollout the trial measured. When the plan
    places its workers as the probe's were, the probe's workers are rebuilt to their launch
    state and returned for the run (the prediction then comes from the very processes that
    run, and no worker starts again); the probe's workers may by then be those the trial ran the
    plan on (``choose_by_trial``). Otherwise None, and the probe is gone.
    """
    from loomrl.plan import Plan, load_profile

    rc, cluster = cfg.run, run.cluster
    hw = host_workers(cluster, cfg)
    keep = None
    if rc.placement not in MODES:
        plan = Plan.load(rc.placement)
        check_plan_devices(plan, cluster.num_devices, rc.placement)
        check_plan_batch(plan, cfg.env.num_envs, rc.placement)
    elif rc.profile and rc.profile != "calibrate":
        profile = load_profile(rc.profile, devices=cluster.num_devices)
        check_profile(profile, f"run.profile={rc.profile}")
        plan = _chosen(run, profile, rc.placement)
    else:
        run.logger.echo(
            f"measuring env and policy costs ({hw or 1} env worker(s), placement={rc.placement})"
        )
        probe = launch_probe(cluster, cfg, hw)
        try:
            profile, costs = measured_profile(cluster, cfg, steps, hw, probe.env, probe.policy)
            plan = _chosen(run, profile, rc.placement)
            if cfg.auto_trial_steps > 0 and cfg.groups is None:
                plan = trial(run, cfg, profile, plan, steps, hw, probe)
            save_costs(run, cfg, steps, hw, costs, profile, plan)
            if probe.places(placement_from_plan(plan, cfg.env.num_envs, hw)):
                _pop_probe_events(run, probe)
                wait(probe.env._call("_loom_rebuild"), probe.policy._call("_loom_rebuild"))
                keep = (probe.env, probe.policy)
        finally:
            if keep is None:
                _pop_probe_events(run, probe)
                probe.kill()
            _record_setup_events(run)
    place = placement_from_plan(plan, cfg.env.num_envs, hw)
    if cfg.groups is not None:
        place = replace(place, groups=cfg.groups)
    check_cores(place, cfg.env.cpu_cores, cluster)  # kept workers die with the run on a refusal
    run.plan, run.planned_s = plan, plan.predicted_s
    plan.save(run.dir / "plan.json")
    reused = " (on the cost probe's workers)" if keep else ""
    run.logger.echo(f"plan:\n{plan}\nplacement{reused}: {place.describe()}")
    return place, keep


def setup_events(run: Run) -> list[dict[str, Any]]:
    """The env events of the rollouts run while planning (the probe's measurements, trials):
    kept on ``run`` until ``plan_cycle`` writes them to env_events.jsonl, as step 0."""
    if not hasattr(run, "_setup_env_events"):
        run._setup_env_events = []  # type: ignore[attr-defined]
    return run._setup_env_events  # type: ignore[attr-defined]


def _pop_probe_events(run: Run, probe: Any) -> None:
    """The env events still held by the probe's env workers (its measurements' steps), from
    those that answer within a short bound: a probe that failed may have a dead worker."""
    with contextlib.suppress(Exception):
        stats = wait(probe.env.pop_stats(), timeout=BOOKKEEPING_S)
        setup_events(run).extend(e for s in stats for e in s["events"])


def _record_setup_events(run: Run) -> None:
    """Write the planning's env events to env_events.jsonl at step 0 (``run.setup_env_events``
    counts them for the summary): those that stopped the run before its first iteration too."""
    from loomrl.recipes.embodied_ppo import record_env_events

    events, run.setup_env_events = setup_events(run), 0  # type: ignore[attr-defined]
    with contextlib.suppress(OSError):  # never in place of the error that stopped planning
        run.setup_env_events = record_env_events(run.dir, 0, events)  # type: ignore[attr-defined]
    events.clear()


def check_plan_devices(plan: Any, devices: int, path: str) -> None:
    """A plan file's devices must exist here: PlanError naming each component placed past them."""
    from loomrl.errors import PlanError

    problems = plan.device_problems(devices)
    if problems:
        raise PlanError(
            f"run.placement={path}: the plan does not fit this cluster:\n  - "
            + "\n  - ".join(problems)
            + f"\n  plan again for {devices} device(s) (loomrl plan PROFILE --devices "
            f"{devices} --save FILE), or run with placement=auto"
        )


def check_plan_batch(plan: Any, num_envs: int, path: str) -> None:
    """A plan file is for the envs of the run it was made for: its ring groups cut that batch,
    and its prediction is that batch's. Run with another env.num_envs it would still start, and
    report a prediction for runs it is not (PlanError naming both)."""
    from loomrl.errors import PlanError

    if plan.batch != num_envs:
        raise PlanError(
            f"run.placement={path}: the plan is for env.num_envs={plan.batch} but this run has "
            f"env.num_envs={num_envs}: set env.num_envs={plan.batch}, or plan for {num_envs} "
            "envs (a run with placement=auto writes its plan.json), or run with placement=auto"
        )


def _chosen(run: Run, profile: Any, placement: str) -> Any:
    """The plan of ``placement`` (a mode, or auto: the best) under ``profile``; saves the profile."""
    from loomrl.plan import search_all

    plans = search_all(profile)
    key = "best" if placement == "auto" else placement
    plan = best_split_plan(profile) if key == "hybrid" else plans[key]
    if plan is None:
        modes = {k: v for k, v in plans["best"].modes.items()}  # type: ignore[union-attr]
        raise PlanError(
            f"placement={placement}: no {key} plan fits on {profile.devices} device(s) "
            f"(feasible modes and predicted s/iteration: {modes}); choose another placement"
        )
    (run.dir / "profile.json").write_text(json.dumps(profile.to_dict(), indent=2, default=str))
    return plan


def trial(
    run: Run, cfg: Config, profile: Any, plan: Any, steps: int, hw: int | None, probe: Probe
) -> Any:
    """Time ``plan`` (auto: and the best co-located plan, the split cycle at the model's best
    k and its neighbours, and every other plan predicted within the margin; hybrid: and the
    split cycle at those k, one of them possibly past the probed group sizes; both: and the k
    next to the fastest while untimed, ``choose_by_trial``'s ladder) on real rollouts and return
    the fastest, re-costed to its measured rollout."""
    from loomrl.plan import search_all

    cluster = run.cluster
    if cfg.run.placement in ("auto", "hybrid"):
        # Where the k timed reach the largest the probed group sizes allow (the cycle's
        # min_group), the trial also times the first k past it, which the model cannot price
        # (within the margin): 16 envs on 8 env workers took 5-14% less time at k = 4 than at
        # k = 2 on two H200s (call AB), in groups of 4 below the probe's smallest, 8.
        splits, past = split_plans_and_past(profile)
        near = _near_best_k(splits, cfg, hw, past)
        ladder = _ladder([*splits, *past], cfg, cluster, hw)
    if cfg.run.placement == "auto":
        plans = search_all(profile)
        # The model errs most between co-located and split cycles (on two H200s split cycles
        # ran 32-47% below its prediction) and in k, so the best co-located plan and the split
        # cycle at the k next to the model's best are timed whatever the margin; the margin
        # trims the rest. (With the env worker calling the policy directly, cycle_handoff auto,
        # the probe's chained costs predicted 0.46-0.59 s an iteration for CPU split cycles at
        # k = 2 whose rollouts ran 0.19-0.27 s: beyond the margin, one went untimed in a run.)
        always = [plans.get("temporal"), *near]
        cands = _candidates(plan, [plans.get("spatial")], cfg, cluster, hw, always)
    elif cfg.run.placement == "hybrid":
        cands = _candidates(plan, [], cfg, cluster, hw, always=near)
    else:
        place = placement_from_plan(plan, cfg.env.num_envs, hw)
        check_cores(place, cfg.env.cpu_cores, cluster)  # before any worker is launched for it
        cands, ladder = [(plan, place)], []
    plan, rollout_s = choose_by_trial(run, cfg, cands, steps, probe, ladder)
    return calibrated_by_trial(profile, plan, rollout_s)


def _near_best_k(
    splits: list[Any], cfg: Config, hw: int | None, past: Sequence[Any] = ()
) -> list[Any]:
    """Of ``split_plans`` (one per ring-group count k, fastest first), those at the model's best
    k and at the next smaller and larger k: k is where the model is least sure (how much of each
    call's hand-off a ring hides: the chained model costed k = 2 above k = 1, which then ran
    1.4x faster; fixed_hops was up to 23% off at k = 4), and neighbours keep the first rollouts
    few (the trial walks on to an untimed k next to the fastest). ``past``: plans at the
    first k past the cycle's ``min_group``, added when the largest k allowed is among those (the
    model cannot price them, so they do not move the window)."""
    if not splits:
        return []
    by_k = {placement_from_plan(p, cfg.env.num_envs, hw).groups: p for p in splits}
    best_k = placement_from_plan(splits[0], cfg.env.num_envs, hw).groups
    ks = sorted(by_k)
    i = ks.index(best_k)
    near = [by_k[k] for k in ks[max(i - 1, 0) : i + 2]]
    return near + list(past) if by_k[ks[-1]] in near else near


def _fitting_place(plan: Any, cfg: Config, cluster: Any, hw: int | None) -> Any:
    """``plan``'s placement, or None where it does not fit the cores."""
    place = placement_from_plan(plan, cfg.env.num_envs, hw)
    try:
        check_cores(place, cfg.env.cpu_cores, cluster)
    except PlacementError:
        return None
    return place


def _ladder(plans: list[Any], cfg: Config, cluster: Any, hw: int | None) -> list[tuple]:
    """(plan, placement) of split ``plans`` that fit the cores, by ring-group count k: the
    rungs a trial may walk along beyond its window (``choose_by_trial``)."""
    placed = [(plan, _fitting_place(plan, cfg, cluster, hw)) for plan in plans]
    return sorted([c for c in placed if c[1] is not None], key=lambda c: c[1].groups)


def _candidates(
    best: Any,
    others: list[Any],
    cfg: Config,
    cluster: Any,
    hw: int | None,
    always: Sequence[Any] = (),
) -> list[tuple]:
    """(plan, placement) of the planner's best, then of each plan in ``always`` and of every
    other plan predicted within the margin, where it maps to a different placement and fits the
    cores."""
    out, seen = [], set()
    limit = best.predicted_s * (1 + cfg.auto_trial_margin)
    for plan in [best, *always, *others]:
        if plan is None or (plan.predicted_s > limit and not any(plan is a for a in always)):
            continue
        place = _fitting_place(plan, cfg, cluster, hw)
        if place is None:
            continue
        key = json.dumps(place.describe(), sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append((plan, place))
    # The best not fitting the cores is reported by check_cores.
    return out or [(best, placement_from_plan(best, cfg.env.num_envs, hw))]


def choose_by_trial(
    run: Run,
    cfg: Config,
    candidates: list[tuple],
    steps: int,
    probe: Probe | None = None,
    ladder: Sequence[tuple] = (),
) -> tuple[Any, float]:
    """Time short real rollouts of each candidate plan; return the fastest and its estimated
    seconds for a ``steps``-step rollout.

    The model ranks plans; where its ranking is within its own error (the margin), a measurement
    decides, and the measurement re-costs the prediction: ``cfg.auto_trial_confirm`` more
    rollouts of the fastest (or only) candidate, timed after the choice on the workers that
    will run it (below), give its estimate. After a warm-up rollout, a rollout of ``steps`` is
    timed three times (median) when ``steps`` <= 2L (L = auto_trial_steps), each after a PPO
    update of the policy as in the run, in the turns and the confirmation alike; longer ones
    are estimated from rollouts of L and 2L steps (twice each, medians, back to back) as a
    fixed cost per rollout plus a cost per step. A candidate with as many env workers as the
    cost probe's ``probe`` workers is timed on those (their devices may differ from the plan's:
    with host-core env workers only rendering depends on the device, and a co-located plan
    alternates, so nothing renders beside a running policy), the candidates there taking turns
    rollout by rollout, and those that come out closer to the best of them than their rollouts'
    noise taking up to 2 x reps more passes; candidates whose rollouts there are the same cycle
    (``_same_cycle``) are timed once, for the first of them in that order, the others sharing
    its timings and losing ties to it. Others on fresh workers, one after another, each thrown
    away when the next starts. Where the fastest will not run on the probe's workers, the probe
    adopts its workers (those it was timed on, if still up; else fresh ones, timed again), so the
    run gets the processes its prediction came from. (A pick timed on the probe's workers whose
    plan places them otherwise, a co-located plan on CPU slots, still runs on fresh ones.) The run
    starts from the launch state either way (``plan_cycle`` rebuilds the probe's workers when it
    keeps them).

    ``ladder``: split candidates at every k (``_ladder``). While the fastest candidate timed on
    the probe's workers has a rung next to it on the ladder that was not timed there (beside
    accelerators a co-located plan on the probe's workers runs the rung at k = 1:
    ``_same_cycle``), that rung is timed too, in turns with the fastest (``_next_rung``; at most
    ``TRIAL_WALK`` more): the model's window of k can sit off the best k (Humanoid-v5 states on
    one H200: the window k = 4, 8, 16, k = 4 fastest, while k = 2 ran its rollouts 13% faster
    than k = 4, scripts/gpu/RESULTS.md call BF), or leave a gap beside it (a co-located plan
    timed as k = 1 beside the window 4, 8, 16). The fastest's median then pools its rollouts
    from before and during the walk, the others' only from before: a slow spell during the walk
    can favour them, which the extra passes for close candidates (below) narrow but do not undo.
    """
    L, t0, rows = cfg.auto_trial_steps, time.perf_counter(), []
    lengths = (steps,) if steps <= 2 * L else (L, 2 * L)
    reps = 3 if len(lengths) == 1 else 2
    # Every timed rollout comes after a PPO update of its policy (at learning rate 0,
    # _update_policy), as each of the run's does: on one H200 (pixels, 96 envs, calls CM and
    # CN) the co-located cycle's and k = 2's rollouts after updates (at learning rate 1 then)
    # ran 12-24% slower than back to back in 7 of 8 trials, k = 3's within 6% in all 4 (at 64
    # and 128 envs -12% to +13%, either way), and turns without updates ranked k = 2 first
    # where k = 3 then ran 12-16% faster. Rollouts of L and 2L steps run back to back: each
    # shape would record the update's graph again.
    before = _update_policy if lengths == (steps,) else None
    keep_events = setup_events(run).extend  # every trial cycle's env events: planning's record
    fits = [probe is not None and probe.can_time(p) for _, p in candidates]
    # Candidates the probe's workers can run go first: fresh workers for the others may need
    # the probe's cores.
    order = sorted(range(len(candidates)), key=lambda i: not fits[i])
    candidates, fits = [candidates[i] for i in order], [fits[i] for i in order]
    timed: list[dict[int, list[float]]] = [{n: [] for n in lengths} for _ in candidates]
    walk_from = len(candidates)
    shared = [i for i, f in enumerate(fits) if f]
    slots = not run.cluster.has_cuda
    first: dict[tuple, int] = {}
    alias = {}  # candidate -> the one whose timed cycle it shares
    for i in shared:
        j = first.setdefault(_same_cycle(candidates[i][1], slots), i)
        if j != i:
            alias[i] = j
    shared = [i for i in shared if i not in alias]
    ran: dict[int, str] = {}
    cycles: dict[int, Any] = {}
    if shared:
        # On the probe's workers the candidates take turns, one timed rollout each per pass:
        # a host's speed drifts within seconds, and turns spread a slow spell over all of
        # them rather than over whichever ran during it.
        how = handoff(cfg, run.cluster)

        def on_probe(place: Any) -> EnvPolicyCycle:
            return EnvPolicyCycle(
                probe.env,  # type: ignore[union-attr]
                probe.policy,  # type: ignore[union-attr]
                cfg.env.num_envs // place.workers,
                place.groups,
                cfg.pipelined,
                handoff=how,
                timeout_s=cfg.cycle_timeout_s,
                on_events=keep_events,
                batch=cfg.cycle_batch,
            )

        cycles = {i: on_probe(candidates[i][1]) for i in shared}
        ran.update({i: c.handoff for i, c in cycles.items()})
        _time_in_turns(cycles, timed, lengths, reps, before=before)
        can_time = probe.can_time  # type: ignore[union-attr]
        for _ in range(TRIAL_WALK):
            best = min(shared, key=lambda i: _trial_estimate(timed[i], steps, L))
            timed_here = [candidates[i] for i in shared]
            rung = _next_rung(best, candidates, timed_here, ladder, slots, can_time)
            if rung is None:
                break
            i = len(candidates)
            candidates.append(rung)
            fits.append(True)
            timed.append({n: [] for n in lengths})
            shared.append(i)
            cycles[i] = on_probe(rung[1])
            ran[i] = cycles[i].handoff
            cycles[i].collect(min(lengths))  # its warm-up; the fastest had one
            pair = {best: cycles[best], i: cycles[i]}
            _time_in_turns(pair, timed, lengths, reps, warm_up=False, before=before)
        # Plans closer than their own rollouts' spread are not ranked yet: the close ones take
        # more turns (up to 2 x reps more passes, no warm-up), which narrows their medians.
        for _ in range(2 * reps):
            close = _close_to_best({i: timed[i] for i in shared}, steps, L)
            if len(close) < 2:
                break
            closest = {i: cycles[i] for i in sorted(close)}
            _time_in_turns(closest, timed, lengths, 1, warm_up=False, before=before)
        for i, j in alias.items():
            timed[i], ran[i] = timed[j], ran[j]
    # How many forwards the probe's policy has recorded as CUDA graphs by the end of the turns
    # (its cost probe's included): about the row counts of the cycles timed there, many more
    # where a cycle's calls outnumber the graphs kept (None: no graphs, or not a policy worker).
    captures = _graph_captures(probe.policy) if shared else None  # type: ignore[union-attr]
    fresh: tuple | None = None  # (i, envs, policy, cycle): the last candidate on fresh workers
    for i, (_, place) in enumerate(candidates):
        if fits[i]:
            continue
        _kill_fresh(fresh)  # the next may need its cores
        fresh = None
        try:
            envs, policy, cyc = start_cycle(run.cluster, cfg, place, on_events=keep_events)
        except PlacementError:  # the node's cores: the probe gives its own back first
            if probe is None or not probe.alive:
                raise
            probe.kill()
            envs, policy, cyc = start_cycle(run.cluster, cfg, place, on_events=keep_events)
        ran[i] = cyc.handoff
        try:
            _time_in_turns({i: cyc}, timed, lengths, reps, before=before)
        except BaseException:
            _kill_fresh((i, envs, policy, cyc))
            raise
        fresh = (i, envs, policy, cyc)  # kept up in case it is the one chosen
    try:
        for i, ((plan, place), reuse, t) in enumerate(zip(candidates, fits, timed, strict=True)):
            rollout_s = _trial_estimate(t, steps, L)
            rows.append(
                {
                    "placement": place.describe(),
                    "handoff": ran[i],  # how the cycle timed passed results: driver or direct
                    "predicted_s": plan.predicted_s,
                    "probe_workers": reuse,
                    "timed_s": {str(n): v for n, v in t.items()},
                    "rollout_s": rollout_s,
                    "walked": i >= walk_from,  # timed because it was next to the fastest, untimed
                    "same_cycle_as": alias.get(i),  # not run itself: that row's timings are its own
                }
            )
        # min keeps the first of equal times: an alias never wins over the row it shares
        pick = min(range(len(rows)), key=lambda i: rows[i]["rollout_s"])
        rollout_s = rows[pick]["rollout_s"]
        # The pick's rollouts in the turns are not those of the run: the fastest of several noisy
        # estimates is the luckiest one, and a cycle taking turns with another on the same workers
        # ran slower than back to back, as the run goes. On one H200 (calls CE-CG, 23 runs of
        # auto and hybrid) predictions from rollouts timed after the choice were within 5% in 13
        # and 7.1% off on average; from the turns' own they would have been in 9, 8.5% off (split
        # plans predicted too slow by up to 25%). The choice itself stays with the turns. A
        # lone candidate (temporal's one plan) is timed again too: rollouts still speed up over
        # the first seconds on a worker set (119 trial sequences on one H200: the first third of
        # each 3.8% above its median, the last third 1.9% below; 128 envs, call CH: temporal's
        # runs went 6-8% under the three rollouts its trial timed).
        src = alias.get(pick, pick)
        confirm, again_on = cfg.auto_trial_confirm, None
        if src in cycles and probe is not None and probe.alive:
            if confirm > 0:
                again_on = cycles[src]
        elif probe is not None:
            # The run will not be on the probe's workers (the pick ran on fresh ones, or the probe
            # gave its own back for one): the probe adopts the pick's, those just timed if they are
            # still up, else fresh ones timed here, so that the run's prediction comes from the
            # processes that run. On two cores auto's runs on workers other than those its trials
            # timed came out 10.8% above their predictions on average (48 stored runs, against
            # +7.8% for 6 on the probe's and 0.0% for hybrid's 54, always on the probe's).
            if fresh is not None and fresh[0] == pick:
                _, envs, policy, cyc = fresh
                fresh = None
                _adopt(probe, envs, policy, candidates[pick][1])
                again_on = cyc if confirm > 0 else None
            elif confirm > 0:
                _kill_fresh(fresh)
                fresh = None
                if probe.alive:  # its cores, for the pick's
                    probe.kill()
                envs, policy, cyc = start_cycle(
                    run.cluster, cfg, candidates[pick][1], on_events=keep_events
                )
                # The probe's from here: a failure below ends them with it (plan_cycle).
                _adopt(probe, envs, policy, candidates[pick][1])
                cyc.collect(min(lengths))  # its warm-up
                again_on = cyc
    finally:
        _kill_fresh(fresh)  # a candidate's fresh workers, unless handed on (then None)
    if again_on is not None:
        again: dict[int, list[float]] = {n: [] for n in lengths}
        # The updates leave the policy trained a little: the workers the run keeps are rebuilt
        # to their launch state afterwards (plan_cycle).
        _time_in_turns({0: again_on}, [again], lengths, confirm, warm_up=False, before=before)
        rollout_s = _trial_estimate(again, steps, L)
        rows[pick]["confirmed_s"] = {str(n): v for n, v in again.items()}
    took = time.perf_counter() - t0
    (run.dir / "trials.json").write_text(
        json.dumps(
            {
                "trials": rows,
                "chosen": pick,
                "rollout_s": rollout_s,
                "seconds": took,
                "policy_graph_captures": captures,
            },
            indent=2,
        )
    )
    each = ", ".join(
        f"{r['placement']['mode']}{'' if r['placement']['colocated'] else ' split'} "
        f"k={r['placement']['groups']}{' (walked)' if r['walked'] else ''}: {r['rollout_s']:.3f}s"
        for r in rows
    )
    what = "candidate plans" if len(rows) > 1 else "plan"
    run.logger.echo(
        f"trial: timed {len(rows)} {what} on {'/'.join(map(str, lengths))}-step rollouts in "
        f"{took:.1f}s; measured {steps}-step rollout: {each}"
        + (f"; the chosen one timed again: {rollout_s:.3f}s" if "confirmed_s" in rows[pick] else "")
    )
    return candidates[pick][0], rollout_s


def _graph_captures(policy: Any) -> int | None:
    """The forwards ``policy`` (a policy worker group) has recorded as CUDA graphs so far; None
    where it records none (CPU, graphs off) or is not one."""
    status = getattr(policy, "graph_status", None)
    if not callable(status):
        return None
    got = wait(status())[0]
    return int(got["captures"]) if got.get("enabled") else None


def _kill_fresh(fresh: tuple | None) -> None:
    """End the workers of a candidate timed on fresh ones (``choose_by_trial``), if any."""
    if fresh is not None:
        fresh[1].kill()
        fresh[2].kill()


def _adopt(probe: Any, envs: Any, policy: Any, place: Any) -> None:
    """Make ``envs`` and ``policy``, placed as ``place``, the probe's workers (its own, if still
    up, are ended): ``plan_cycle`` then hands them to the run like the probe's own."""
    if probe.alive:
        probe.kill()
    probe.env, probe.policy, probe.alive = envs, policy, True
    probe.env_devices, probe.policy_devices = (
        tuple(place.launch_devices),
        tuple(place.policy_devices),
    )


def _same_cycle(place: Any, slots: bool) -> tuple:
    """What identifies a candidate's rollouts on the probe's workers: its env workers and ring
    groups, so a co-located plan there runs the split cycle at k = 1 (with host-core env
    workers only rendering depends on the device, and a co-located cycle alternates). On a
    CPU-only cluster (``slots``) a device is a core, and a co-located plan puts env and policy on
    one core where the probe has two: there co-location tells them apart. Pure."""
    return (place.workers, place.groups, place.colocated and slots)


def _next_rung(
    best: int,
    candidates: list[tuple],
    timed: list[tuple],
    ladder: Sequence[tuple],
    slots: bool = False,
    can_time: Callable[[Any], bool] = lambda place: True,
) -> tuple | None:
    """The ladder's rung next to ``candidates[best]`` that no candidate in ``timed`` (those
    timed on the probe's workers so far) has run and the probe's workers can (``can_time`` of
    its placement): the one below it first, else the one above; None where neither is left
    (both timed, the best then a local minimum of the rungs timed, or not runnable there), the
    best is not a rung, or the ladder ends there. Past the edge of the rungs timed, that is the
    next one out; inside them, a gap: with a co-located plan as the rung at k = 1 beside a
    window of k = 4, 8, 16, the best k = 4 has k = 2 untimed below it (pixels on one H200, 64
    envs: k = 2's rollouts ran 12% under k = 4's in one trial set, scripts/gpu/RESULTS.md). A
    rung is identified by ``_same_cycle`` (beside accelerators a co-located plan is the rung at
    k = 1 of its workers). Pure."""

    def key(c: tuple) -> tuple:
        return _same_cycle(c[1], slots)

    rungs = [key(c) for c in ladder]
    if key(candidates[best]) not in rungs:
        return None
    done = {key(c) for c in timed}
    j = rungs.index(key(candidates[best]))
    for n in (j - 1, j + 1):
        if 0 <= n < len(ladder) and rungs[n] not in done and can_time(ladder[n][1]):
            return ladder[n]
    return None


def _trial_estimate(timed: dict[int, list[float]], steps: int, L: int) -> float:
    """Seconds of a ``steps``-step rollout from timed rollouts (lists by length): the median
    of those of ``steps`` steps, or a fixed cost plus a cost per step from the medians at L
    and 2L."""
    med = {n: statistics.median(v) for n, v in timed.items()}
    if steps in med:
        return med[steps]
    per_step = max(0.0, (med[2 * L] - med[L]) / L)
    return max(0.0, med[L] - L * per_step) + steps * per_step


def _close_to_best(timed: dict[int, dict[int, list[float]]], steps: int, L: int) -> list[int]:
    """The candidates (keys of ``timed``) whose estimate is above the best one's by less than
    the larger of the two's noise, the best first; ``[]`` when no other is that close: such a
    ranking rests on the host, not on the plans. Noise is the median absolute deviation of a
    candidate's longest rollouts over their median (one stalled rollout does not move it; with
    three rollouts it is the smaller gap to the middle one, so it errs towards fewer extra
    turns). Where the estimate comes from rollouts of L and 2L steps it is noisier than the 2L
    rollouts this reads."""
    if len(timed) < 2:
        return []
    est = {i: _trial_estimate(t, steps, L) for i, t in timed.items()}

    def noise(i: int) -> float:
        v = timed[i][max(timed[i])]
        m = statistics.median(v)
        return statistics.median(abs(x - m) for x in v) / m if m > 0 else 0.0

    best = min(est, key=est.__getitem__)
    close = [
        i
        for i in sorted(est, key=est.__getitem__)
        if i != best and est[i] - est[best] < est[best] * max(noise(i), noise(best))
    ]
    return [best, *close] if close else []


def _time_in_turns(
    cycles: dict[int, Any],
    timed: list[dict[int, list[float]]],
    lengths: tuple,
    reps: int,
    warm_up: bool = True,
    before: Callable[[Any], None] | None = None,
) -> None:
    """A warm-up rollout of each cycle (its first calls of each row count record graphs), then
    ``reps`` passes in which each cycle in turn times one rollout of each length into
    ``timed[i]``; ``before(cycle)``, when given, runs (untimed) before each timed rollout."""
    for cyc in cycles.values() if warm_up else ():
        cyc.collect(min(lengths))
    for _ in range(reps):
        for i, cyc in cycles.items():
            for n in lengths:
                if before is not None:
                    before(cyc)
                timed[i][n].append(cyc.collect(n).wall_s)


def _update_policy(cycle: Any) -> None:
    """One PPO update of ``cycle``'s policy on the last rollout it served (on the probe's shared
    policy, often another candidate's: the same work), as the run makes after each rollout, at
    learning rate 0: all of its work (GAE, every epoch's forward, backward and Adam step) and no
    weight moved, so that through a trial's tens of updates the weights stay those the run
    starts from (a policy that learned to keep the pole up longer would reset its envs less;
    state observations' normaliser still follows the trial's rollouts, as it follows the run's).
    With ppo.target_kl set the run's updates may stop early where these (KL about 0) do not.
    On one H200 (calls CM, CN; temporal at 96 envs) rollouts went from 0.25-0.28 s in the turns
    to 0.30-0.32 s in the first one after the policy's first update (updates at learning rate 1
    then) and stayed about there (0.28-0.35 s): after one update of 3e-4 the work is the likely
    cause, not what was learned (not yet told apart on a GPU: scripts/gpu/first_update.py). The
    cost probe's timed updates, on a copy of the policy in the same process, left the turns
    fast."""
    wait(cycle.policy.update(0.0))


def calibrated_by_trial(profile: Any, plan: Any, rollout_s: float) -> Any:
    """``plan`` re-costed with env, policy and the cycle's hop scaled so that its cycle takes
    the ``rollout_s`` its trial measured (the Ray hops and driver work between calls that timing
    each side alone misses); the rest of the iteration keeps its modelled cost."""
    from loomrl.adapt import refresh_profile
    from loomrl.plan import fixed_plan

    def cost(r: float) -> Any:
        prof = refresh_profile(profile, {ENV: r, POLICY: r})
        cycles = tuple(
            replace(c, hop_s=c.hop_s * r) if set(c.members) == {ENV, POLICY} else c
            for c in prof.cycles
        )
        prof = replace(prof, cycles=cycles)
        return fixed_plan(prof, plan.tree, plan.micro_batch, method="trial-calibrated")

    rest = cost(0.0).predicted_s
    cycle_s = plan.predicted_s - rest
    if cycle_s <= 0:
        return plan
    return cost(rollout_s / cycle_s)


@dataclass
class Probe:
    """The cost probe's workers: ``env`` on ``env_devices`` (launch devices), ``policy`` on
    ``policy_devices``."""

    env: Any
    policy: Any
    env_devices: tuple[int, ...]
    policy_devices: tuple[int, ...]
    alive: bool = True

    def can_time(self, place: CyclePlacement) -> bool:
        """Whether these workers can run ``place``'s cycle (as many env workers; the devices
        may differ, see ``choose_by_trial``)."""
        return self.alive and place.workers == self.env.world_size

    def places(self, place: CyclePlacement) -> bool:
        """Whether ``place`` puts its workers where these are."""
        return (
            self.can_time(place)
            and tuple(place.launch_devices) == self.env_devices
            and tuple(place.policy_devices) == self.policy_devices
        )

    def kill(self) -> None:
        self.env.kill()
        self.policy.kill()
        self.alive = False


def launch_probe(cluster: Any, cfg: Config, hw: int | None) -> Probe:
    """Workers for the cost probe and trials: one env worker with every env, or the ``hw``
    host-core env workers side by side, on device 0; the policy on device 1 when there is one
    (where pixel env workers render on device 0: the split a rendering env is planned with).
    A plan that places its workers the same way runs on them (``plan_cycle``)."""
    w = hw or 1
    env_devs, pol_devs = (0,), (1 if cluster.num_devices > 1 else 0,)
    have = cluster.nodes[cluster.devices[0].node].num_cpus
    if w * cfg.env.cpu_cores > have + 1e-9:
        raise PlacementError(
            f"env.cpu_cores={cfg.env.cpu_cores:g}: {w} env worker(s) would reserve "
            f"{w * cfg.env.cpu_cores:g} CPU cores, but the node has {have:g}; lower env.cpu_cores "
            f"to at most {have / w:g}"
        )
    env = cluster.launch(
        EnvWorker,
        w,
        worker_env_config(cfg.env, w),
        devices=list(env_devs),
        num_cpus=cfg.env.cpu_cores,
        name="env",
    )
    try:
        pol = _launch_policy(cluster, cfg, env, list(pol_devs), "policy")
    except BaseException:
        env.kill()
        raise
    return Probe(env, pol, env_devs, pol_devs)


def measured_profile(
    cluster: Any,
    cfg: Config,
    steps: int,
    hw: int | None,
    env: Any,
    pol: Any,
    reps: int | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Time env.step / policy.act at the group sizes the planner weighs on the probe workers
    (``launch_probe``) and fit: (profile, the measured costs)."""
    n, w = cfg.env.num_envs, env.world_size
    sizes = sorted({n // d for d in (1, 2, 4, 8) if n % d == 0 and (n // d) % w == 0})
    # A pipe cycle's hand-offs are timed over the pipe (the chains' cost 2-3x as much).
    how = "pipe" if handoff(cfg, cluster) == "pipe" else "driver"
    costs = measure_costs(
        env,
        pol,
        n,
        sizes,
        steps,
        reps or cfg.probe_reps,
        handoff=how,
        timeout_s=cfg.cycle_timeout_s,
    )
    return profile_of_costs(cluster, cfg, steps, hw, costs), costs


def profile_of_costs(
    cluster: Any, cfg: Config, steps: int, hw: int | None, costs: dict, hops: str | None = None
) -> Any:
    """The cycle's profile on this cluster from ``measure_costs``'s costs, under the cycle model
    ``hops`` (default: ``cfg.cycle_model``; see ``cycle_profile``)."""
    node0 = cluster.nodes[0]
    hops = hops or cfg.cycle_model
    if hops == "auto":  # see Config.cycle_model
        hops = "chained"
    return cycle_profile(
        costs,
        cfg.env.num_envs,
        steps,
        cluster.num_devices,
        cfg.env.cpu_cores,
        int(node0.num_cpus),
        len(node0.devices) if len(cluster.nodes) > 1 else None,
        hw,
        hops=hops,
        env_renders=bool(cfg.env.pixels and cluster.has_cuda),
    )


def save_costs(
    run: Run, cfg: Config, steps: int, hw: int | None, costs: dict, profile: Any, plan: Any
) -> None:
    """Write the probe's costs to cycle_costs.json beside what each cycle model predicts for the
    plan that runs: ``model_s`` from ``profile`` (the one planned with, ``cfg.cycle_model``),
    then ``model_fixed_hops_s``, ``model_chained_s`` and ``model_split_hops_s`` (busy_hops).
    Runs then show which model their own data favours."""
    from loomrl.errors import PlanError
    from loomrl.plan import fixed_plan

    models: dict[str, float | None] = {}
    for hops, name in (("", "model_s"), *CYCLE_MODEL_KEYS.items()):
        prof = profile if not hops else profile_of_costs(run.cluster, cfg, steps, hw, costs, hops)
        try:
            models[name] = fixed_plan(prof, plan.tree, plan.micro_batch).predicted_s
        except PlanError:  # a tree that fits one model fits the others; kept safe all the same
            models[name] = None
    (run.dir / "cycle_costs.json").write_text(json.dumps({**costs, **models}, indent=1))
