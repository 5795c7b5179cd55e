"""PPO for embodied control: env workers <-> a policy worker, then a PPO update, under any plan.

Run: loomrl run examples/ppo_inverted_pendulum.yaml [placement=temporal|hybrid|auto|PLAN.json]

Each iteration runs the env <-> policy cycle for S = ppo.rollout_steps / env.num_envs steps of
every env (``loomrl.cycle``) and one PPO update (GAE, clipped policy and value losses, observation
normalisation, reward scaling) on the policy worker. The plan decides which devices / cores the
env workers and the policy worker get and how many ring groups k the envs are cut into. With a
placement mode or ``auto`` the recipe first times a few env steps and policy calls (cheap) on
throw-away workers, plans from those costs, then times the plan (auto: the close candidates) on
short real rollouts on the same workers and predicts from that; ``run.profile`` plans from a
profile file instead, and a plan file is run as it is (all of it in ``loomrl.cycle_trial``).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loomrl.config import finite_in
from loomrl.cycle import BATCHES, CYCLE_MODELS, HANDOFFS
from loomrl.cycle_trial import plan_cycle, start_cycle
from loomrl.embodied import PPOConfig
from loomrl.envs.memory import MemorySource, NodeMemory, rollout_memory_problem
from loomrl.envs.vec import EnvConfig, check_env_id
from loomrl.errors import ConfigError
from loomrl.run import Run, RunConfig
from loomrl.worker import wait

MAX_TIMEOUT_S = 1e6  # about 11.6 days: a wait no simulator step or policy call should need


@dataclass
class Config:
    recipe: str = "embodied_ppo"
    env: EnvConfig = field(default_factory=EnvConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    # auto | mlp | cnn | package.module:factory (an nn.Module with act/evaluate). The name's
    # form is checked before anything starts; a factory's module is imported by the policy
    # worker, where it must be importable.
    policy: str = "auto"
    # Keyword arguments for the policy's constructor, e.g. {channels: [64, 128, 128],
    # feature_dim: 512} for the CNN or {hidden: [256, 256]} for the MLP (over ppo.hidden); a
    # factory gets them as **kwargs. Built-in policies' keys are checked before any worker starts.
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    # On a GPU, replay the built-in policy's forward as CUDA graphs (one per call's row count,
    # rounded up to whole blocks of policy_kwargs.row_block rows), and
    # each PPO minibatch step (forward, backward, clipping, Adam) as one: one launch per call
    # instead of hundreds, the bits of the same calls run eagerly (Adam is then capturable;
    # off, it is the plain fused Adam). No effect on CPU or user policies.
    policy_cuda_graphs: bool = True
    # With policy_cuda_graphs, record the PPO minibatch step as a CUDA graph too (false: the
    # step runs eagerly, with the fused Adam, and act's graphs stay).
    policy_step_graph: bool = True
    groups: int | None = None  # pin the ring groups k (None: the plan's)
    pipelined: bool = True  # False: wait after every env step (the unpipelined loop)
    target_return: float | None = None  # stop once the mean of the last `window` returns reaches it
    window: int = 10  # episodes in the reported episode_return
    probe_reps: int = 5  # timed calls per size when measuring costs for the planner
    # On measured costs the plan is timed on short real rollouts (rollouts of S steps, or of
    # auto_trial_steps and twice that when S is longer than twice auto_trial_steps) and its
    # prediction re-costed to them; placement=auto times the best co-located plan and the split
    # cycle at the model's best k and the k next to it (and at the first k past the group sizes
    # the probe timed, when the largest allowed k is among them), whatever their predictions,
    # and every other plan predicted within auto_trial_margin of the best; hybrid times its
    # split cycle at those k, temporal and spatial their one plan; while the fastest of auto's
    # or hybrid's split cycles has an untimed k next to it, that k is timed too (up to
    # TRIAL_WALK more); the fastest runs (0 steps:
    # trust the model alone). Results: trials.json in the run directory. A rollout estimated
    # from two shorter ones carries their noise magnified (at S = 4L: 3 x the longer - 2 x the
    # shorter): on a 2-core host a 64-step rollout estimated from medians of 2 rollouts of 16
    # and of 32 steps had a standard deviation of 17-19% of the median, against 6-12% for the
    # median of 3 rollouts of 64 steps (scripts/trial_lengths.py), so rollouts up to 64 steps
    # are timed whole.
    auto_trial_steps: int = 32
    auto_trial_margin: float = 0.5
    # Rollouts of the plan a trial picked (also the only one), timed after the choice, that its
    # prediction comes from (0: from its rollouts in the trial's turns; choose_by_trial). In the
    # turns and here, a rollout of S steps comes after a PPO update, as in the run.
    auto_trial_confirm: int = 5
    # How measured costs become the cycle's model: fixed_hops (a call's fixed cost is hand-off
    # latency that ring groups overlap), chained (each call costs what it took, hand-off
    # included) or busy_hops (only the time the worker was busy); loomrl.cycle.cycle_profile.
    # auto: chained. Where the cycle runs over a pipe the probe also times one-group pipe
    # rollouts, and each side's call then costs its busy time there plus half the pipe's round
    # trip: on one H200 (call CV, 96 and 128 pixel envs) split cycles came out 1-26% below the
    # runs (busy_hops 19-32%), where chains through the driver had priced them at about twice
    # the runs; on the 2-core host its medians per mode came within 4% for two of three modes
    # in one benchmark run, 14-57% off for the other four (chains: 2.3-3.1x). Beside that: on
    # CPU slots the hand-offs share the sides' cores; on one H200 a call's fixed cost is work
    # its side does call after call, not latency a ring hides: over 119
    # trial sets there (calls BE-CG, scripts/gpu/RESULTS.md, scripts/gpu/cycle_model_fit.py)
    # chained ranked the fastest plan first in 74 and was 30% off on split cycles, fixed_hops
    # in 1 and 91% off (it ranked k = 8 or 16 first where k = 2 ran fastest). fixed_hops had
    # fit better (49 of 50 sets) on the earlier code of calls Y-AL, mostly on two H200s.
    # Under every model the planner keeps ring groups as large as the probe's smallest group
    # (the cycle's min_group): fixed_hops carried below it planned k = 32 and 64 on a GPU.
    cycle_model: str = "auto"
    # How results pass between env workers and the policy: driver (the driver submits every
    # call, each result passed on as an object reference: two messages per hand-off), direct
    # (each env worker calls the policy itself, one message, wherever every ring group lies on
    # one env worker and the cycle is pipelined; elsewhere as driver), pipe (each env worker and
    # the policy pass replies and actions over a socket of their own for the whole rollout, no
    # Ray call per step; one node, pipelined), or auto: pipe on a one-node cluster (rollouts
    # 2.7-2.9x faster than driver and 1.9-2.0x faster than direct on the 2-core machine,
    # scripts/handoff_cycle.py), else as before: direct on CPU slots, driver beside
    # accelerators. The trajectories are the same. For a pipe the probe also times rollouts
    # over the pipe, and the model prices the pipe (measure_costs); the trials time each
    # cycle as it runs. The run summary's cycle_handoff and trials.json say which ran.
    cycle_handoff: str = "auto"
    # What the policy acts on in a pipelined cycle over a pipe: ready (whatever parts have
    # replied, in one call) or group (gather a ring group's rows first, unless no env worker
    # has anything left to send: fewer, larger calls). The trajectories are the same. On one
    # H100 at 512 HalfCheetah-v5 envs group made 63 calls a rollout where ready made 153, and
    # its iterations were no faster (scripts/gpu/RESULTS.md, calls ES and ET).
    cycle_batch: str = "ready"
    # Seconds a pipe hand-off waits for the other side before stopping the rollout with an
    # error naming the silent worker (a dead worker is noticed at once, not after this).
    cycle_timeout_s: float = 300.0
    run: RunConfig = field(default_factory=RunConfig)

    def validate(self) -> list[str]:
        p = []
        try:
            check_env_id(self.env.env_id)
        except ConfigError as e:
            p += [f"env.{x}" for x in e.problems]
        if self.ppo.rollout_steps % self.env.num_envs:
            p.append(
                f"ppo.rollout_steps={self.ppo.rollout_steps} is not a multiple of env.num_envs="
                f"{self.env.num_envs}; their ratio is the steps S per env per iteration"
            )
        # Before the policy's check: that builds the CNN on a stand-in image of the run's size,
        # which a frame too large for memory would take down with it.
        mem = memory_problem(self)
        p += [mem] if mem else _check_policy(self)
        if self.groups is not None and not 1 <= self.groups <= self.env.num_envs:
            p.append(f"groups: must be in [1, env.num_envs={self.env.num_envs}], got {self.groups}")
        # A NaN or infinite target is never reached (or, -inf, reached at once): a slip, not a
        # setting; the loader lets inf through, and main() also takes configs built in Python.
        if self.target_return is not None and not finite_in(self.target_return):
            p.append(
                f"target_return: must be a finite number (the mean return to stop at), or null "
                f"to run every step, got {self.target_return}"
            )
        if self.window < 1:
            p.append(f"window: must be >= 1 episode, got {self.window}")
        if self.probe_reps < 1:
            p.append(f"probe_reps: must be >= 1, got {self.probe_reps}")
        if self.auto_trial_steps < 0:
            p.append(
                f"auto_trial_steps: must be >= 0 (0 disables trials), got {self.auto_trial_steps}"
            )
        if not finite_in(self.auto_trial_margin, lambda x: x >= 0):
            p.append(
                f"auto_trial_margin: must be a finite number >= 0 (a fraction of the best "
                f"prediction, e.g. 0.5), got {self.auto_trial_margin}"
            )
        if self.auto_trial_confirm < 0:
            p.append(
                f"auto_trial_confirm: must be >= 0 (0 predicts from the trial's turns), "
                f"got {self.auto_trial_confirm}"
            )
        if self.cycle_batch not in BATCHES:
            p.append(f"cycle_batch: {self.cycle_batch!r} is not one of {', '.join(BATCHES)}")
        if self.cycle_handoff not in HANDOFFS:
            p.append(f"cycle_handoff: {self.cycle_handoff!r} is not one of {', '.join(HANDOFFS)}")
        elif self.cycle_handoff == "pipe" and not self.pipelined:
            p.append(
                "cycle_handoff: 'pipe' runs the ring pipeline, but pipelined=false; set "
                "pipelined: true, or cycle_handoff: driver"
            )
        t = self.cycle_timeout_s
        # A socket's timeout must fit the platform's time_t (1e12 s overflows; inf too).
        if isinstance(t, bool) or not (isinstance(t, (int, float)) and 0 < t <= MAX_TIMEOUT_S):
            p.append(
                f"cycle_timeout_s: {t!r} must be a positive number of seconds, at most "
                f"{MAX_TIMEOUT_S:g}"
            )
        if self.cycle_model not in ("auto", *CYCLE_MODELS):
            p.append(
                f"cycle_model: {self.cycle_model!r} is not one of auto, {', '.join(CYCLE_MODELS)}"
            )
        # Settings of recipes that checkpoint: said here, not silently ignored.
        for key, value, fix in (
            ("checkpoint_every", self.run.checkpoint_every, 0),
            ("max_restarts", self.run.max_restarts, 0),
        ):
            if value != fix:
                p.append(
                    f"run.{key}={value}: the embodied recipe keeps no checkpoints (a run is "
                    f"minutes of simulation; it cannot resume or restart); leave it at {fix}"
                )
        # seed=S on the command line shifts both seeds (prepared()): without it, seed=1 would
        # rerun seed 0's run.
        seed = self.run.seed  # its own range: RunConfig.validate
        if isinstance(self.ppo.seed, int) and seed >= 0 and self.ppo.seed + seed >= 2**64:
            p.append(
                f"run.seed={seed}: ppo.seed + run.seed = {self.ppo.seed + seed} must stay below "
                f"2**64 (torch's seed range); lower one of them"
            )
        # Settings of the LLM recipes that change nothing here: a user who sets them believes
        # the run changed.
        defaults = RunConfig()
        for key, why in (
            (
                "micro_batch",
                "the cycle's batch is env.num_envs, cut into ring groups by the plan; pin them "
                "with groups",
            ),
            ("offload", "the policy worker acts and trains, and stays resident"),
            ("weight_path", "the policy worker acts and trains: no weights are sent"),
            ("weight_bucket_mb", "the policy worker acts and trains: no weights are sent"),
        ):
            value, default = getattr(self.run, key), getattr(defaults, key)
            if value != default:
                p.append(
                    f"run.{key}={value!r}: not used by the embodied recipe ({why}); leave it "
                    f"at {'null' if default is None else default}"
                )
        return p


def _check_policy(cfg: Config) -> list[str]:
    """Problems with ``policy`` and ``policy_kwargs``, all of them: the name's form; for a
    built-in policy, whether it fits the observations, keys it does not take (named with those
    it does), and values it cannot be built with (it is built once on the CPU, on stand-in
    spaces: the run's image size for the CNN). A factory's module is imported, and its
    signature checked, in the policy worker.

    A problem that depends on an env key names it (``env.pixels``) and one that does not,
    does not: where an env key is wrong, ``load_config`` runs this with that key at its default
    and drops the problems that name it, keeping the rest (a typo in ``policy_kwargs`` is
    reported beside the env's problems, not after they are fixed)."""
    from loomrl.workers.policy import BUILT_IN_POLICIES, policy_spec_problems

    policy, kwargs, pixels = cfg.policy, cfg.policy_kwargs, cfg.env.pixels
    if bad := policy_spec_problems(policy):
        return bad
    out = []
    # policy: cnn with env.pixels=false is checked where the env is made: an env whose own
    # observations are images gives them to the CNN (loomrl.envs.vec.image_axes).
    if policy == "mlp" and pixels:
        out.append(
            "policy='mlp': the MLP takes state vectors, but env.pixels=true gives images "
            "[3, H, W]; set policy: auto (or cnn), or env.pixels=false"
        )
    if policy not in BUILT_IN_POLICIES or (not kwargs and not pixels):
        return out
    import difflib
    import inspect

    import gymnasium as gym
    import numpy as np

    from loomrl.policies import CNNActorCritic, MLPActorCritic

    cnn = policy == "cnn" or (policy == "auto" and pixels)
    cls = CNNActorCritic if cnn else MLPActorCritic
    fixed = {
        "seed": "it is ppo.seed",
        "batch_invariant": "the recipe needs each row's result independent of its group, so that "
        "plans and ring groups cannot change a trajectory",
        "obs_dim": "it comes from the env",
        "obs_shape": "it comes from the env",
        "action_space": "it comes from the env",
    }

    def takes(c: type) -> list[str]:
        return [n for n in inspect.signature(c.__init__).parameters if n not in {"self", *fixed}]

    mine, either = takes(cls), list(dict.fromkeys(takes(CNNActorCritic) + takes(MLPActorCritic)))
    # policy: auto picks the class from the env; cnn and mlp name it themselves.
    picked = f"policy='auto', env.pixels={pixels}" if policy == "auto" else f"policy={policy!r}"
    for key in kwargs:
        if key in fixed:
            out.append(f"policy_kwargs.{key}: not settable here; {fixed[key]}")
        elif policy == "auto" and key not in either:  # wrong whatever the env gives
            close = difflib.get_close_matches(str(key), either, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            out.append(
                f"policy_kwargs.{key}: not an argument of either built-in policy (policy='auto'); "
                f"{hint}CNNActorCritic takes {', '.join(takes(CNNActorCritic))}; "
                f"MLPActorCritic takes {', '.join(takes(MLPActorCritic))}"
            )
        elif key not in mine:
            close = difflib.get_close_matches(str(key), mine, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            out.append(
                f"policy_kwargs.{key}: not an argument of {cls.__name__} ({picked}); "
                f"{hint}it takes {', '.join(mine)}"
            )
    for key in ("channels", "hidden"):
        v = kwargs.get(key)
        if v is not None and not (
            isinstance(v, (list, tuple)) and all(type(x) is int and x > 0 for x in v)
        ):
            out.append(f"policy_kwargs.{key}: must be a list of positive layer widths, got {v!r}")
    v = kwargs.get("feature_dim")
    if v is not None and not (type(v) is int and v > 0):
        out.append(f"policy_kwargs.feature_dim: must be a positive width, got {v!r}")
    v = kwargs.get("log_std_init")
    if v is not None and not finite_in(v):  # NaN or inf: every action's log-prob is NaN
        out.append(
            f"policy_kwargs.log_std_init: must be a finite number (the initial log standard "
            f"deviation of actions, e.g. 0.0), got {v!r}"
        )
    if out:
        return out
    size = cfg.env.image_size
    obs = (3, size, size) if cnn else 1
    act = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    extra = {} if cnn else {"hidden": tuple(cfg.ppo.hidden)}
    # Only the CNN's build depends on the env (ppo.hidden is checked in its own section).
    built_on = f" and env.image_size={size}" if cnn else ""
    try:
        cls(obs, act, seed=0, **{**extra, **kwargs})
    except Exception as e:  # noqa: BLE001 - any failure to build is reported, with its cause
        return [
            f"policy={policy!r}: {cls.__name__} cannot be built with policy_kwargs={kwargs}"
            f"{built_on} ({type(e).__name__}: {e})"
        ]
    return []


def memory_problem(cfg: Config, source: MemorySource | None = None) -> str | None:
    """The problem, where the envs and rollout buffers cannot fit the node's memory, from what
    the config fixes (``rollout_memory_problem`` before the envs say their observations; the
    policy's launch checks again once they have). None where they fit, and where the node's
    memory cannot be read."""
    ppo = cfg.ppo
    if not (isinstance(ppo.rollout_steps, int) and ppo.rollout_steps > 0):
        return None  # said by PPOConfig
    return rollout_memory_problem(
        cfg.env, ppo.rollout_steps, ppo.normalize_obs, None, source or NodeMemory()
    )


def check_memory(cfg: Config, source: MemorySource | None = None) -> None:
    """Raise ``ConfigError`` where ``memory_problem`` finds one."""
    if (problem := memory_problem(cfg, source)) is not None:
        raise ConfigError([problem])


@dataclass
class _Iteration:  # what Run.record reads
    measured_s: float
    predicted_s: float | None
    timeline: list[dict[str, Any]]


def prepared(cfg: Config) -> Config:
    """``cfg`` checked, with ``run.seed`` (``seed=S`` on the command line) added to ``env.seed``
    and ``ppo.seed`` and then set to 0: the seeds recorded in config.yaml are those used, so
    running that file again repeats the run. Raises ConfigError naming every problem."""
    import dataclasses

    # Also when main() is called without load_config (a config built in Python, which the
    # loader's checks of each section never saw): fail before any worker starts.
    problems = cfg.validate() + [f"run.{x}" for x in cfg.run.validate()]
    if problems:
        raise ConfigError(problems)
    s = cfg.run.seed
    if not s:
        return cfg
    return dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, seed=cfg.env.seed + s),
        ppo=dataclasses.replace(cfg.ppo, seed=cfg.ppo.seed + s),
        run=dataclasses.replace(cfg.run, seed=0),
    )


def main(cfg: Config) -> dict:
    from loomrl.plots import plot_run

    cfg = prepared(cfg)
    S = cfg.ppo.rollout_steps // cfg.env.num_envs
    run = Run(cfg, cfg.run)
    try:
        if cfg.run.adapt:
            run.logger.echo(
                "run.adapt: not used by the embodied recipe (its cycle is planned once, with "
                "placement=auto timing the close candidates); ignored"
            )
        t_plan = time.time()
        place, probe = plan_cycle(run, cfg, S)
        envs, policy, cycle = start_cycle(run.cluster, cfg, place, probe)
        run.planning_s = time.time() - t_plan  # measuring, searching, trials and the launch
        if cfg.env.pixels:
            paths = sorted({sp["render_path"] for sp in wait(envs.spaces())})
            run.logger.echo(
                "pixels: drawn in one pass per env worker"
                if paths == ["batched"]
                else "pixels: " + " | ".join(paths)
            )
        recent: deque[float] = deque(maxlen=cfg.window)
        metrics: dict[str, Any] = {}
        it = 0
        env_events = getattr(run, "setup_env_events", 0)  # planning's, written as step 0
        for it in range(cfg.run.steps):
            t0 = time.perf_counter()
            run.maybe_inject_failure(it, envs)
            try:
                roll = cycle.collect(S)
            except BaseException:  # the env failures that stopped it are recorded too
                with contextlib.suppress(Exception):  # (the rollout's error is the one to tell)
                    record_env_events(run.dir, it + 1, cycle.failed_events)
                raise
            lr_frac = 1.0 - it / cfg.run.steps if cfg.ppo.anneal_lr else 1.0
            stats = update(policy, lr_frac, run, place.predicted_s)
            took = time.perf_counter() - t0
            run.record(it, _Iteration(took, place.predicted_s, _records(roll.wall_s, took)))
            recent.extend(roll.returns)
            if roll.events:
                env_events += record_env_events(run.dir, it + 1, roll.events)
                e = roll.events[0]
                run.logger.echo(
                    f"step {it + 1}: {len(roll.events)} env event(s), recovered; the first: "
                    f"{e['kind']} in env {e['env_index']}: {str(e['message'])[:200]} "
                    "(all in env_events.jsonl)"
                )
            metrics = {
                "episode_return": statistics.fmean(recent) if recent else float("nan"),
                "episodes": len(roll.returns),
                "env_steps": (it + 1) * S * cfg.env.num_envs,
                "env_steps_per_s": roll.env_steps / took,
                "env_events": len(roll.events),  # this iteration's; all: env_events.jsonl
                "time/collect": roll.wall_s,
                # Where the rollout's time went: seconds inside env steps (per env worker) and
                # inside policy calls; their sum over the wall time is the cycle's overlap.
                "time/env_busy": roll.env_busy_s / cycle.workers,
                "time/policy_busy": roll.policy_busy_s,
                # Per env worker, seconds waiting for actions (pipe and direct hand-offs), and
                # the pipe's span: collect less it is starting and closing the rollout.
                "time/env_wait": roll.env_wait_s / cycle.workers,
                "time/cycle_span": roll.span_s,
                "time/policy_idle": roll.policy_idle_s,
                "time/env_render": roll.env_render_s / cycle.workers,  # pixels: of env_busy
                "env_render_reads": roll.env_render_reads / cycle.workers,
                "policy_calls": roll.policy_calls,
                # Cumulative: one that grows after the first iterations re-records graphs.
                "policy_graph_captures": roll.policy_graph_captures,
                "time/update": took - roll.wall_s,
                **stats,
            }
            run.logger.log(it + 1, metrics)
            if (
                cfg.target_return is not None
                and len(recent) == cfg.window
                and metrics["episode_return"] >= cfg.target_return
            ):
                break
        (sha,), (graphs,) = wait(policy.param_sha256(), policy.graph_status())
        if graphs["failed"]:
            run.logger.echo(f"policy_cuda_graphs: the policy ran eagerly ({graphs['failed']})")
        if graphs["update_failed"]:
            run.logger.echo(
                f"policy_cuda_graphs: the PPO step ran eagerly ({graphs['update_failed']})"
            )
        plot_run(run.dir)
        return run.summary(
            it + 1,
            sha,
            metrics,
            placement=place.describe(),
            cycle_handoff=cycle.handoff,
            probe_workers_reused=probe is not None,
            policy_cuda_graphs=graphs,
            env_steps_per_s=(S * cfg.env.num_envs / run.measured_iteration_s()),
            env_events_total=env_events,
        )
    finally:
        run.close()


def update(policy: Any, lr_frac: float, run: Any, predicted_s: float) -> dict[str, Any]:
    """The policy's PPO update on the rollout just collected, bounded by
    ``run.iteration_timeout_s`` (the rollout itself by ``cycle_timeout_s``)."""
    from loomrl.errors import IterationTimeout
    from loomrl.flow import iteration_limit

    setting = run.rc.iteration_timeout_s
    limit = iteration_limit(setting, predicted_s, max(run.iter_times, default=0.0))
    try:
        return wait(policy.update(lr_frac), timeout=limit)[0]
    except TimeoutError:
        raise IterationTimeout(
            f"the policy's PPO update ran past the iteration's time limit "
            f"(run.iteration_timeout_s={setting!r}: {limit:g} s): it hangs, or is far slower "
            "than planned. If updates really take this long, raise run.iteration_timeout_s or "
            "set it to 'off'"
        ) from None


def record_env_events(run_dir: Any, step: int, events: list[dict[str, Any]]) -> int:
    """Append what went wrong in the envs and was recovered from (an env that raised and was
    reset, one made again) to ``run_dir/env_events.jsonl``, one line each with the step it
    happened in; returns how many."""
    if not events:
        return 0
    with open(Path(run_dir) / "env_events.jsonl", "a") as f:
        for e in events:
            f.write(json.dumps({"step": step, **e}) + "\n")
    return len(events)


def _records(collect_s: float, total_s: float) -> list[dict[str, Any]]:
    return [
        {"component": "env<->policy", "kind": "run", "start": 0.0, "end": collect_s},
        {"component": "actor_train", "kind": "run", "start": collect_s, "end": total_s},
    ]
