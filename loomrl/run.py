"""What every recipe's run shares: the run directory, the cluster, the flow's plan, the summary.

A recipe's config embeds ``RunConfig`` (placement, steps, seed, output_dir, ...). ``Run`` starts
the cluster, opens the logger, applies the plan, records each iteration's measured timeline beside
the prediction, and writes ``run_summary.json`` with the fields tools outside loomrl read:
``plan`` (mode and assignment), ``steps``, ``param_sha256``, ``predicted_iteration_s``,
``measured_iteration_s`` (median after warm-up) and ``metrics`` (the last logged values), with
``status`` ``"finished"``. ``wall_s`` and ``iteration_s`` cover this attempt (``replans`` and
``adapt`` the whole run, as adapt.jsonl keeps it, with ``adapt.per_attempt``); a resumed run (by
``loomrl resume`` or a restart after a dead worker) lists its earlier ``attempts`` (status,
error, steps done, wall time, median iteration) and sums every attempt's wall time in
``wall_s_total``; one killed outright, with no summary written, is listed with ``status``
``"killed"`` (from ``.attempt.json``, which a running attempt keeps). A resumed run that adapted
before starts on the plan and refreshed profile its adaptation last settled on (``adapted.json``,
``loomrl.adapt.read_adapted``), planned again from that profile where the plan cannot run as it
is, and says which in ``adapt_start`` (null when the run had not adapted); on the same cluster
its adaptation starts with the times each plan ran since the costs last moved (how many plans:
``adapt_start.carried_plans``), so that it does not return to a plan measured slower. Both record
``fixed_on_resume``, the config's values of the keys its checkpoints depend on
(``FIXED_ON_RESUME``), which ``loomrl resume`` checks config.yaml against. A run that stops on an
error, Ctrl-C or SIGTERM writes one too, with ``status`` ``"failed"`` or ``"interrupted"`` (and
then the ``signal``, ``"SIGINT"`` or ``"SIGTERM"``), the ``error``, and what it had done (``steps_done``, the plan, the iterations measured, the last
metrics logged), so tools find every run's outcome in one file.

A plan searched on a profile measured in this run predicts, after its first three warm
iterations, from those iterations' measured components (the profile timed only a few items of
each; see ``loomrl.flow.Flow.run``): ``predicted_iteration_s`` is the prediction then, and
``planned_iteration_s`` the one the plan was chosen with (null with ``profile=calibrate``, whose
plan predicts nothing until its second iteration has run; ``predicted_iteration_s`` and the
``predicted_s`` of metrics.jsonl and timeline.jsonl are null too until then).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loomrl.runlog import RunLogger, count_lines, say

PLACEMENT_HELP = "auto | temporal | spatial | hybrid | path to a plan file"


@dataclass
class RunConfig:
    placement: str = "auto"
    steps: int = 10
    seed: int = 0
    output_dir: str = "runs/latest"
    devices: int | None = None  # None: every device of the cluster (CPU cores when no GPU)
    num_gpus: int | None = None  # logical GPUs for the embedded Ray (None: the real ones)
    micro_batch: int | None = None  # pin the micro-batch size (None: the planner chooses)
    # A workload profile file to plan from instead of profiling, or "calibrate" (temporal only:
    # start from the cost-free default plan and take its costs from the second iteration, the
    # first being warm-up).
    profile: str | None = None
    # Profiling's timed calls may cost this share of each component's part of one iteration
    # (two calls on all its devices are made whatever the budget).
    profile_budget: float = 0.1
    threads: int | None = None  # pin threads per worker (bit-identical results across plans)
    # Pin GPU-node workers that reserve CPU cores (simulators) to cores of their own.
    pin_cores: bool = True
    checkpoint_every: int = 0  # steps; 0 = only at the end
    max_restarts: int = 0  # a worker that dies restarts the run from the last complete checkpoint
    # Fault injection (tests): kill a worker once at this step.
    kill_worker_at_step: int | None = None
    keep_checkpoints: int | None = 2  # None: keep all
    tensorboard: bool = True
    wandb: str = "off"
    progress: bool = True
    # Run-time adaptation (loomrl.adapt): when adapt_window iterations in a row miss the
    # prediction by more than adapt_threshold, refresh the profile, re-plan, redeploy if it pays.
    adapt: bool = False
    adapt_threshold: float = 0.15
    adapt_window: int = 3
    adapt_max_replans: int = 3  # per run: a restart's re-plans count with the earlier ones
    adapt_min_gain: float = 0.05  # a new plan must be predicted this share faster to move to it
    # Trainer -> rollout weight sync (loomrl.weights): bucket size, and the route ("auto" picks
    # CUDA IPC / shared memory / NCCL / Gloo per receiving rank; naming one forces it).
    weight_bucket_mb: float = 256
    weight_path: str = "auto"
    # Time-shared stages: "auto" offloads only when a device cannot hold everything placed on
    # it (by the profile's memory; a calibrated plan measured none, so it offloads), "never"
    # keeps every component resident, "always" offloads between phases.
    offload: str = "auto"
    # How long one iteration of the flow may run before the run stops with an error naming the
    # stage still running (a hang): seconds, "off", or "auto" (10x the plan's prediction or the
    # slowest iteration so far, and at least 30 minutes).
    # (Any: checked by validate, whose message lists what the key takes.)
    iteration_timeout_s: Any = "auto"
    # How long starting the workers may take (their constructors: model loads, simulators)
    # before the run stops with an error naming the ones still starting; null: no limit.
    launch_timeout_s: float | None = 1800.0

    def validate(self) -> list[str]:
        p = []
        from loomrl.errors import ConfigError
        from loomrl.flow import check_iteration_timeout

        try:
            self.iteration_timeout_s = check_iteration_timeout(self.iteration_timeout_s)
        except ConfigError as e:
            p.extend(e.problems)
        if self.steps < 1:
            p.append(f"steps: must be >= 1, got {self.steps}")
        # From about 2**43 the engine's per-call sampling seeds (seed x 1,000,003 + call) leave
        # the 64 bits torch takes (mid-run, "Overflow when unpacking long long"); 2**32 keeps
        # clear of it. The embodied recipe adds it to env seeds, which gymnasium wants >= 0.
        if not 0 <= self.seed < 2**32:
            p.append(f"seed: must be a whole number in [0, 2**32), got {self.seed}")
        t = self.launch_timeout_s
        if t is not None and not (math.isfinite(t) and t > 0):
            p.append(
                f"launch_timeout_s: {t} is not a number of seconds > 0; give one, or null for "
                "no limit"
            )
        k = self.kill_worker_at_step
        if k is not None and not 0 <= k < self.steps:
            p.append(
                f"kill_worker_at_step: {k} is not a step of this run (0 to steps-1 = "
                f"{self.steps - 1}); leave it unset to kill no worker"
            )
        if self.placement not in ("auto", "temporal", "spatial", "hybrid"):
            if not Path(self.placement).exists():
                p.append(f"placement: {self.placement!r} is not {PLACEMENT_HELP} (no such file)")
            else:  # a plan file that is not one is said before Ray starts, not after
                from loomrl.errors import PlanError
                from loomrl.plan.plan import Plan

                try:
                    Plan.load(self.placement)
                except PlanError as e:
                    p.append(f"placement: {e}")
                if self.adapt:
                    # A plan file is run as it is (no profile is read beside it): the run would
                    # record drift it could never act on, and say nothing.
                    p.append(
                        f"adapt: true needs a profile to refresh and re-plan from, but "
                        f"placement={self.placement!r} is a plan file, which runs as it is; set "
                        "run.adapt=false to keep that plan, or placement=auto with "
                        "run.profile=FILE to adapt"
                    )
        if self.wandb not in ("off", "offline", "online"):
            p.append(f"wandb: expected 'off', 'offline' or 'online', got {self.wandb!r}")
        elif self.wandb != "off":
            import importlib.util

            if importlib.util.find_spec("wandb") is None:
                p.append(
                    f"wandb: {self.wandb!r} needs the wandb package, which is not installed: "
                    "pip install wandb, or set run.wandb=off"
                )
        if self.profile not in (None, "calibrate") and not Path(self.profile).exists():
            p.append(f"profile: no such file {self.profile!r}")
        # inf is no "unlimited": the profiler divides it into a count of items to time
        if not (self.profile_budget > 0 and math.isfinite(self.profile_budget)):
            p.append(
                f"profile_budget: must be > 0 and finite (a share of one iteration, e.g. 0.1), "
                f"got {self.profile_budget}"
            )
        if self.max_restarts < 0:
            p.append(f"max_restarts: must be >= 0, got {self.max_restarts}")
        if self.checkpoint_every < 0:
            p.append(
                f"checkpoint_every: must be >= 0 steps (0: only at the end), got "
                f"{self.checkpoint_every}"
            )
        if self.keep_checkpoints is not None and self.keep_checkpoints < 1:
            p.append(
                f"keep_checkpoints: must be >= 1 (the run's last checkpoint is its trained model; "
                f"null keeps all), got {self.keep_checkpoints}"
            )
        if self.threads is not None and self.threads < 1:
            p.append(
                f"threads: must be >= 1 per worker (null: the library's default), got {self.threads}"
            )
        if self.micro_batch is not None and self.micro_batch < 1:
            p.append(
                f"micro_batch: must be >= 1 (null: the planner chooses), got {self.micro_batch}"
            )
        if self.num_gpus is not None and self.num_gpus < 0:
            p.append(
                f"num_gpus: must be >= 0 logical GPUs (null: the real ones), got {self.num_gpus}"
            )
        if self.devices is not None and self.devices < 1:
            p.append(f"devices: must be >= 1, got {self.devices}")
        p += self.adapt_config().problems(prefix="adapt_")
        from loomrl.weights import PATHS

        if self.weight_path not in PATHS:
            p.append(f"weight_path: {self.weight_path!r} is not one of {list(PATHS)}")
        if self.offload not in ("auto", "always", "never"):
            p.append(f"offload: {self.offload!r} is not one of 'auto', 'always', 'never'")
        if not self.weight_bucket_mb > 0:
            p.append(f"weight_bucket_mb: must be > 0, got {self.weight_bucket_mb}")
        return p

    def flow_problems(self) -> list[str]:
        """What only recipes that plan a Flow check (the embodied cycle measures its costs
        under profile=calibrate instead): calibrate plans a temporal plan alone."""
        if self.profile == "calibrate" and self.placement in ("auto", "spatial", "hybrid"):
            return [
                f"run.profile: 'calibrate' plans only placement=temporal (got "
                f"{self.placement!r}): other modes need measured costs to split devices; set "
                "run.profile=null to measure them, or run.placement=temporal"
            ]
        return []

    def adapt_config(self) -> Any:
        from loomrl.adapt import AdaptConfig

        return AdaptConfig(
            threshold=self.adapt_threshold,
            window=self.adapt_window,
            max_replans=self.adapt_max_replans,
            min_gain=self.adapt_min_gain,
        )


class Run:
    """Run directory + cluster + logger for one ``loomrl run``."""

    def __init__(self, cfg: Any, run_cfg: RunConfig, total_steps: int | None = None):
        from loomrl.adapt import adapt_totals
        from loomrl.cluster import Cluster

        self.cfg, self.rc = cfg, run_cfg
        self.dir = Path(run_cfg.output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        if run_cfg.threads:
            os.environ["LOOMRL_THREADS"] = str(run_cfg.threads)
        self._sigterm_before = signal.getsignal(signal.SIGTERM)
        self.cluster = Cluster.start(
            num_gpus=run_cfg.num_gpus,
            num_devices=run_cfg.devices,
            log_to_driver=False,
            pin_cores=run_cfg.pin_cores,
        )
        self.cluster.launch_timeout_s = run_cfg.launch_timeout_s
        from loomrl.weights import cluster_problem

        # has_cuda asks the machine for its GPUs: only for the routes that need them.
        gpu_route = run_cfg.weight_path in ("nccl", "cuda_ipc")
        wrong = gpu_route and cluster_problem(run_cfg.weight_path, self.cluster.has_cuda)
        if wrong:  # before any worker starts or model loads
            from loomrl.errors import ConfigError

            self.cluster.shutdown()
            raise ConfigError([wrong])
        # ray.init made SIGTERM dump a native stack and sys.exit(15): the run would stop as
        # "failed". It stops as on Ctrl-C instead (workers stopped, summary, resume command).
        stop_on_sigterm()
        resuming = bool(getattr(cfg, "resume", False))
        # config.yaml is what `loomrl run DIR/config.yaml` starts again and `loomrl resume`
        # continues (adding resume=true itself): it never says resume.
        if resuming and dataclasses.is_dataclass(cfg):
            saved = dataclasses.replace(cfg, resume=False)
        else:
            saved = cfg
        self.logger = RunLogger(
            self.dir,
            saved,
            use_tensorboard=run_cfg.tensorboard,
            wandb=run_cfg.wandb,  # type: ignore[arg-type]
            total_steps=total_steps or run_cfg.steps,
            progress=run_cfg.progress,
            continues=resuming,
        )
        self.iter_times: list[float] = []
        self.plan_start = 0  # first iteration of the current plan (it changes on a re-plan)
        # First iteration run under the current prediction (calibrated, refreshed, re-planned).
        self.prediction_start = 0
        self.replans = 0  # this attempt's re-plans (the summary's count the whole run's)
        # adapt.jsonl's rows of this attempt; the summary's "adapt" counts them with those of
        # the earlier attempts (read below) that a restart or resume kept.
        self.adapt_rows: list[dict[str, Any]] = []
        self.planning_s: float | None = None  # profiling + search + launch, when a flow planned
        self.profiling: dict[str, Any] | None = None  # loomrl.profiler.ProfileRun.summary()
        self.plan: Any = None
        self.planned_s: float | None = None  # the plan's prediction when it was chosen
        self.t_start = time.time()
        self._steps_done = 0  # iterations completed (counting those before a resume)
        self.summarised = False
        # A resume (by hand, or the CLI's restart after a dead worker) continues a run whose
        # earlier attempts' timing the summary keeps beside this attempt's own.
        self.attempts = earlier_attempts(self.dir) if resuming else []
        # A resume or restart cut adapt.jsonl back to its checkpoint already (prepare_run_dir):
        # what is left are the earlier attempts' decisions for the steps this one keeps.
        self.adapt_rows_before = read_rows(self.dir / "adapt.jsonl") if resuming else []
        # max_replans is per run: a restart's Flow starts counting at 0, the run does not.
        self.replans_before = adapt_totals(self.adapt_rows_before)["replans"]
        self.resuming = resuming
        # How this attempt's plan relates to what adaptation settled on before (apply_plan):
        # None when the run had not adapted (or is not resumed).
        self.adapt_start: dict[str, Any] | None = None
        self.fixed = fixed_on_resume(cfg)  # what a resume of this run must keep
        self._mark_attempt()

    @property
    def steps_done(self) -> int:
        return self._steps_done

    @steps_done.setter
    def steps_done(self, n: int) -> None:
        # a resume's restore sets it too: a kill before the next step still says how far it got
        self._steps_done = n
        self._mark_attempt()

    def apply_plan(self, flow: Any, sample: list[Any], **kw: Any) -> Any:
        t = time.time()
        if self.rc.profile:
            kw.setdefault("profile", self.rc.profile)
        kw.setdefault("profile_budget", self.rc.profile_budget)
        kw.setdefault("notify", self.logger.echo)
        flow.iteration_timeout_s = self.rc.iteration_timeout_s  # checked by the flow
        flow.profile_run = None
        self.plan = self._adapted_start(flow, sample) if self.resuming else None
        if self.plan is None:
            self.plan = flow.plan(
                self.rc.placement, sample=sample, micro_batch=self.rc.micro_batch, **kw
            )
        took = time.time() - t
        self.planning_s = took
        self._save_plan(flow)
        done = "incl. profiling" if flow.profile_run is not None else "incl. starting the workers"
        self.logger.echo(f"plan ({took:.1f}s {done}):\n{describe_plan(self.plan)}")
        # a cost-free plan predicts nothing when chosen: null, not 0 s
        self.planned_s = None if _predicts_nothing(self.plan) else self.plan.predicted_s
        if flow.profile_run is not None:
            pr, se = flow.profile_run, flow.prediction_se
            self.profiling = pr.summary(self.plan.predicted_s, se)
            self.logger.echo(f"profiling: {pr.describe(self.plan.predicted_s, se or 0.0)}")
        return self.plan

    def _adapted_start(self, flow: Any, sample: list[Any]) -> Any:
        """A resumed run (a restart after a dead worker, or ``loomrl resume``) that adapted
        before starts on the plan and refreshed profile adaptation last settled on
        (``ADAPTED_FILE``), not on those of its start: it would run ``adapt_window`` slow
        iterations to find the same drift again. Where that plan cannot run as it is (another
        device count, mode or micro-batch), it plans again from the refreshed profile. Returns
        the plan, or None to plan as at the start: the run did not adapt, ``run.adapt`` is off
        (the placement asked for runs as it is), or the record is missing or cannot be used.
        Each case but the first is said and kept in the summary's ``adapt_start``."""
        from loomrl.adapt import (
            ADAPTED_FILE,
            carries_measured,
            carry_problems,
            plan_id,
            read_adapted,
        )
        from loomrl.errors import ConfigError, PlanError

        path = self.dir / ADAPTED_FILE
        rc = self.rc
        as_at_start = f"placement={rc.placement}" + (
            f" with run.profile={rc.profile}" if rc.profile else " on a new profile"
        )
        if not path.exists():
            if self.adapt_rows_before:
                self._adapt_start(
                    "configured",
                    f"adapt: {path} is missing, though earlier attempts adapted "
                    f"({len(self.adapt_rows_before)} decision(s) in adapt.jsonl): planning as at "
                    f"the start ({as_at_start})",
                )
            return None
        try:
            a = read_adapted(path)
        except PlanError as e:
            self._adapt_start(
                "configured",
                f"adapt: the adapted plan cannot be used: {e}; planning as at the start "
                f"({as_at_start}); delete {path} to start so without this line",
            )
            return None
        where = f"the plan adapted at step {a.step} (attempt {a.attempt}, plan {plan_id(a.plan)})"
        if not rc.adapt:
            self._adapt_start(
                "configured",
                f"adapt: run.adapt is false: {where} is not taken up; running {as_at_start}",
                a,
            )
            return None
        want = len(sample)
        memory = _memory_gb(flow.cluster)
        devices = flow.cluster.num_devices
        moved = carry_problems(a, rc.placement, rc.micro_batch, devices, memory)
        # The plans' measured times and the last window's cost baseline count on the cluster
        # they were measured on only (carries_measured says why); restored once the plan is
        # applied, so that "never return to a slower plan" holds across attempts.
        same_cluster = carries_measured(a, devices, memory)
        carried = a.measured if same_cluster else {}
        kept = (
            f"; the times {len(carried)} plan(s) ran since the costs last moved still count"
            if carried
            else ""
        )
        try:
            if not moved:
                plan = flow.resume_plan(
                    a.plan, a.profile, rc.placement, batch=want, micro_batch=rc.micro_batch
                )
            else:
                prof = a.profile.with_devices(devices)
                if memory is not None:
                    prof = dataclasses.replace(prof, device_memory_gb=memory)
                plan = flow.plan(
                    rc.placement, sample=sample, profile=prof, micro_batch=rc.micro_batch
                )
        except (PlanError, ConfigError) as e:
            self._adapt_start(
                "configured",
                f"adapt: {where} cannot be resumed ({'; '.join(moved) or e}): "
                + (f"no plan from its refreshed profile ({e}); " if moved else "")
                + f"planning as at the start ({as_at_start})",
                a,
            )
            return None
        if same_cluster:
            flow.restore_measured(a.measured, a.baseline)
        if not moved:
            self._adapt_start(
                "adapted",
                f"adapt: resuming on {where}, with the profile it refreshed: {plan.mode} "
                f"{plan.assignment()}, {plan.predicted_s:.3f}s per iteration predicted" + kept,
                a,
                carried,
            )
            return plan
        self._adapt_start(
            "replanned",
            f"adapt: {where} cannot run as it is ({'; '.join(moved)}): planned again from the "
            f"profile it refreshed: {plan.mode} {plan.assignment()}, {plan.predicted_s:.3f}s "
            "per iteration predicted" + kept,
            a,
            carried,
        )
        # The next resume on this cluster starts on this plan, not on another re-plan.
        self._keep_adapted(a.step, flow, devices)
        return plan

    def _adapt_start(
        self,
        start: str,
        said: str,
        adapted: Any = None,
        carried: dict[str, list[float]] | None = None,
    ) -> None:
        """Say how this attempt's plan relates to the one adaptation settled on before, and keep
        it for the summary (``adapt_start``): ``start`` is ``adapted`` (that plan),
        ``replanned`` (planned again from its refreshed profile) or ``configured`` (as at the
        run's start); ``carried_plans``, how many plans' measured times (since the costs last
        moved, by earlier attempts on this cluster) this attempt's adaptation starts with."""
        from loomrl.adapt import plan_id

        self.adapt_start = {
            "start": start,
            "adapted_step": adapted.step if adapted is not None else None,
            "adapted_attempt": adapted.attempt if adapted is not None else None,
            "adapted_plan_id": plan_id(adapted.plan) if adapted is not None else None,
            "said": said,
            "carried_plans": len(carried or {}),
        }
        self.logger.echo(said)

    def record(self, step: int, result: Any, flow: Any = None) -> None:
        """Keep an iteration's measured time and timeline (for the summary and ``loomrl report``).
        An iteration run on the cost-free plan of ``profile=calibrate`` had no prediction: its
        ``result.predicted_s`` (the plan's 0 s) becomes None, in timeline.jsonl and in the
        metrics the recipe logs from ``result`` next."""
        if _predicts_nothing(self.plan):
            result.predicted_s = None
        moved = flow is not None and flow.plan_ is not self.plan
        if moved:
            # A calibrated plan replaced the cost-free default after the second iteration, or the
            # profiled plan's prediction was refreshed from its first warm iterations.
            if flow.plan_.method == "calibrated" and self.plan.method == "calibrate":
                self.logger.echo(
                    f"step {step}: plan calibrated from this iteration's measured phases:"
                    f" {flow.plan_.predicted_s:.3f}s per iteration predicted"
                    f" (this one took {result.measured_s:.3f}s)"
                )
            elif flow.plan_.method == "refreshed" and not flow.adapt_events:
                warm = [*self.iter_times[self.plan_start + 1 :], result.measured_s]
                self.logger.echo(
                    f"step {step}: prediction refreshed from the measured components of the"
                    f" warm iterations so far: {flow.plan_.predicted_s:.3f}s per iteration"
                    f" (planned {self.plan.predicted_s:.3f}s, measured"
                    f" {statistics.median(warm):.3f}s)"
                )
            self._save_plan(flow)
        self.iter_times.append(result.measured_s)
        if moved:  # this iteration ran under the prediction just replaced
            self.prediction_start = len(self.iter_times)
        self.steps_done = step + 1
        with open(self.dir / "timeline.jsonl", "a") as f:
            f.write(
                json.dumps(
                    {
                        "step": step,
                        "measured_s": result.measured_s,
                        "predicted_s": result.predicted_s,
                        "records": result.timeline,
                    }
                )
                + "\n"
            )
        if self.rc.adapt and flow is not None:
            self._adapt(step, result, flow)

    def _adapt(self, step: int, result: Any, flow: Any) -> None:
        from loomrl.adapt import plan_id

        judged = flow.plan_
        ev = flow.adapt(
            result,
            self.rc.steps - step - 1,
            self.rc.adapt_config(),
            replans_before=self.replans_before,
        )
        if ev is None:
            return
        # Which attempt decided, and the plan it judged and the one that runs next: the summary
        # counts the whole run's decisions and returns to a plan from these rows.
        ev = {
            "step": step,
            "attempt": len(self.attempts),
            "plan_from": plan_id(judged),
            "plan_to": plan_id(flow.plan_),
            **ev,
        }
        self.adapt_rows.append(ev)
        with open(self.dir / "adapt.jsonl", "a") as f:
            f.write(json.dumps(ev, default=str) + "\n")
        self._keep_adapted(step, flow)
        self.prediction_start = len(self.iter_times)
        errs = ", ".join(f"{100 * e:+.0f}%" for e in ev["errors"])
        if ev["action"] == "replan":
            self.plan_start = len(self.iter_times)
            self.replans += 1
            self.logger.echo(
                f"adapt: step {step}: measured off the prediction ({errs}); re-planned to "
                f"{ev['mode']} {ev['assignment']} (predicted {ev['best_s']:.3f}s vs "
                f"{ev['refreshed_s']:.3f}s refreshed), redeploy took {ev['stall_s']:.1f}s"
            )
        else:
            self.logger.echo(
                f"adapt: step {step}: measured off the prediction ({errs}); profile refreshed, "
                f"plan kept (predicted {ev['refreshed_s']:.3f}s, best other {ev['best_s']:.3f}s)"
            )
        self._save_plan(flow)

    def _keep_adapted(self, step: int, flow: Any, devices: int | None = None) -> None:
        """Write ``ADAPTED_FILE``, what a restart or resume of this run starts from: whole or
        not at all (a kill while it is written leaves the one before). ``devices``: the cluster
        the plan runs on (default the run's)."""
        from loomrl.adapt import ADAPTED_FILE, adapted_record
        from loomrl.config import atomic_write_text

        # The plans' measured times and the cost baseline go with it, with the cluster they were
        # measured on (loomrl.adapt.carries_measured): a later attempt keeps to "never return
        # to a slower plan". Written at adapt events only: times of the running plan since the
        # last event are not kept (the next attempt measures that plan again), and costs do
        # not roll back with a checkpoint: the latest record counts.
        cluster = self.cluster
        state = flow.measured_state()
        rec = adapted_record(
            flow.plan_,
            flow.profile_,
            step,
            len(self.attempts),
            self.rc.placement,
            self.rc.micro_batch,
            devices or cluster.num_devices,
            measured=state["measured"],
            baseline=state["baseline"],
            device_memory_gb=_memory_gb(cluster),
        )
        try:
            atomic_write_text(self.dir / ADAPTED_FILE, json.dumps(rec, default=str) + "\n")
        except OSError as e:  # the run goes on; only a restart would plan as at the start
            self.logger.echo(f"adapt: {ADAPTED_FILE} not written ({e}): a restart plans anew")

    def _save_plan(self, flow: Any) -> None:
        """The flow's current plan (and profile) become the run's, on disk too."""
        self.plan = flow.plan_
        self.plan.save(self.dir / "plan.json")
        if flow.profile_ is not None:
            (self.dir / "profile.json").write_text(
                json.dumps(flow.profile_.to_dict(), indent=2, default=str)
            )

    def maybe_inject_failure(self, step: int, group: Any) -> None:
        """Kill one worker process at ``run.kill_worker_at_step`` (once per run directory): lets
        tests check that a dead worker ends in a restart from the last checkpoint, not a hang."""
        marker = self.dir / ".failure-injected"
        if self.rc.kill_worker_at_step != step or marker.exists():
            return
        import ray

        marker.write_text(str(step))
        ray.kill(group.actors[0])

    def measured_iteration_s(self) -> float | None:
        """Median iteration time of the current plan after its first (warm-up) iteration."""
        mine = self.iter_times[self.plan_start :]
        warm = mine[1:] or mine or self.iter_times
        return statistics.median(warm) if warm else None

    def measured_since_prediction_s(self) -> float | None:
        """Median iteration time since the current prediction was made (the plan's first,
        warm-up, iteration left out): what ``predicted_iteration_s`` is judged against once a
        run's costs moved. A run whose responses shorten as it learns refreshes its prediction
        (``run.adapt``) while ``measured_iteration_s`` still holds the slower early steps: the
        GRPO example's 20 steps ended at 7.7 s predicted, 10.3 s measured over the plan and 7.2 s
        over the four steps since. None when no iteration ran on it yet."""
        since = self.iter_times[self.prediction_start :]
        if self.prediction_start == self.plan_start:
            since = since[1:]
        return statistics.median(since) if since else None

    def summary(
        self, steps: int, param_sha256: str | None, metrics: dict[str, Any], **extra: Any
    ) -> dict:
        s = {"status": "finished", **self._record(), "steps": steps}
        s.update(steps_done=self.steps_done, param_sha256=param_sha256)
        s.update(metrics=metrics, **extra)
        self.logger.write_summary(s)
        self.summarised = True
        self._unmark_attempt()
        return s

    def _mark_attempt(self) -> None:
        """Keep ``ATTEMPT_FILE`` saying what this attempt has done so far. An attempt killed
        outright (SIGKILL, out of memory) writes no summary; a resume then lists it from this
        file (``earlier_attempts``)."""
        mark = {
            "started": self.t_start,
            "updated": time.time(),
            "steps_done": self._steps_done,
            "measured_iteration_s": self.measured_iteration_s(),
            # the attempts before it, which no summary lists if this one is killed too
            "earlier": self.attempts,
            "fixed_on_resume": self.fixed,
            "metrics_restarted_at": self.logger.metrics_restarted_at,
        }
        path = self.dir / ATTEMPT_FILE
        tmp = self.dir / ATTEMPT_TMP  # one writer: the run directory is locked
        try:
            # Whole or not at all, and no fsync each step: a killed process loses no written
            # page; only a machine that stops may lose the last step's update.
            tmp.write_text(json.dumps(mark, default=str) + "\n")
            os.replace(tmp, path)
        except OSError as e:  # the run itself does not depend on it
            tmp.unlink(missing_ok=True)
            self.logger.echo(f"{ATTEMPT_FILE} not written ({e}): a killed attempt goes unlisted")

    def _unmark_attempt(self) -> None:
        """This attempt wrote its summary: no longer one to list as killed."""
        try:
            (self.dir / ATTEMPT_FILE).unlink(missing_ok=True)
        except OSError as e:  # the summary's attempt_started names it: not listed twice
            self.logger.echo(f"{ATTEMPT_FILE} not removed ({e})")

    def _record(self) -> dict[str, Any]:
        """What the summary of a finished or a failed run says of its plan and timing."""
        plan = self.plan
        wall = time.time() - self.t_start
        adapt = self._adapt_record()
        return {
            "plan": {
                "mode": getattr(plan, "mode", None),
                "assignment": plan.assignment() if plan is not None else {},
                "micro_batch": getattr(plan, "micro_batch", None),
                "placement": self.rc.placement,
            },
            "predicted_iteration_s": None
            if _predicts_nothing(plan)
            else getattr(plan, "predicted_s", None),
            "planned_iteration_s": self.planned_s,
            "measured_iteration_s": self.measured_iteration_s(),
            "measured_since_prediction_s": self.measured_since_prediction_s(),
            "iteration_s": self.iter_times,
            "replans": adapt["replans"] if adapt else 0,  # the whole run's, as "adapt" counts
            "adapt": adapt,
            "adapt_start": self.adapt_start,
            "planning_s": self.planning_s,
            "profiling": self.profiling,
            "wall_s": wall,
            "attempt_started": self.t_start,  # the ATTEMPT_FILE of this attempt says the same
            "wall_s_total": wall + sum(a.get("wall_s") or 0.0 for a in self.attempts),
            "attempts": self.attempts,
            "restarts": count_lines(self.dir / "restarts.jsonl"),
            "fixed_on_resume": self.fixed,
        }

    def _adapt_record(self) -> dict[str, Any] | None:
        """What run-time adaptation did over the whole run, every attempt (None without
        ``run.adapt`` and no adapt.jsonl row): its decisions (adapt.jsonl's rows), re-plans,
        returns to a plan that ran before, the seconds its redeploys stalled the run, and the
        same per attempt (``per_attempt``; ``loomrl.adapt.adapt_totals``)."""
        rows = [*self.adapt_rows_before, *self.adapt_rows]
        if not self.rc.adapt and not rows:
            return None
        from loomrl.adapt import adapt_totals

        return adapt_totals(rows, attempts=len(self.attempts) + 1)

    def close(self) -> None:
        # Recipes call this in ``finally``: an exception on its way out is the run's failure.
        error = sys.exc_info()[1]
        # A second Ctrl-C while the workers stop says so; a third forces the way out.
        before = _patient_interrupts() if isinstance(error, KeyboardInterrupt) else None
        try:
            if not self.summarised and error is not None:
                self._write_failure(error)
        finally:
            try:
                self.logger.close()
            finally:
                try:
                    self.cluster.shutdown()
                finally:
                    if before is not None:
                        signal.signal(signal.SIGINT, before[0])
                    put_back_sigterm(self._sigterm_before)

    def _write_failure(self, error: BaseException) -> None:
        """The summary of a run that stopped on ``error``: the finished summary's fields (its
        ``steps`` the steps done; no ``param_sha256``), how it ended and why."""
        from loomrl.errors import RemoteError

        try:
            interrupted = isinstance(error, KeyboardInterrupt)
            remote = isinstance(error, RemoteError)
            said = error.headline if remote else str(error) or "interrupted (Ctrl-C)"
            name = type(error).__name__
            if terminated(error):  # also the plain KeyboardInterrupt a Ray wait raised for it
                name, said = Terminated.__name__, SIGTERM_SAID
            s = {
                "status": "interrupted" if interrupted else "failed",
                "error": f"{name}: {said}"[:4000],
            }
            if interrupted:
                s["signal"] = "SIGTERM" if terminated(error) else "SIGINT"
            s |= {
                **self._record(),
                "steps": self.steps_done,
                "steps_done": self.steps_done,
                "param_sha256": None,
                "metrics": self.logger.last_metrics,
            }
            if remote:
                s["traceback"] = error.remote_traceback[-8000:]
            for events in ("env_events", "tool_events"):  # what went wrong on the way
                if (self.dir / f"{events}.jsonl").exists():
                    s[f"{events}_total"] = count_lines(self.dir / f"{events}.jsonl")
            self.logger.write_summary(s)
        except Exception as e:  # the run's own error is the one to report
            self.logger.echo(f"run_summary.json of the failed run not written: {e}")
        else:
            self._unmark_attempt()


def _memory_gb(cluster: Any) -> float | None:
    """A cluster's device memory as adaptation's record keeps it: None without GPUs."""
    return cluster.device_memory_gb if cluster.has_cuda else None


def _predicts_nothing(plan: Any) -> bool:
    """Whether ``plan`` is ``profile=calibrate``'s cost-free one, whose 0 s predicts nothing
    (calibrated from the iterations it runs, it is replaced by one that does)."""
    return getattr(plan, "method", None) == "calibrate"


def describe_plan(plan: Any) -> str:
    """``str(plan)``, but for a cost-free plan (``_predicts_nothing``) without its 0 s
    prediction and 0 GB peak memory, which would read as measured."""
    if not _predicts_nothing(plan):
        return str(plan)
    return (
        f"plan ({plan.mode}) on {plan.devices} devices: micro-batch {plan.micro_batch} "
        f"({plan.num_micro_batches} micro-batches of batch {plan.batch}); no prediction yet "
        "(profile=calibrate: no costs measured yet; the prediction comes from the phases the"
        " second iteration measures, the first being warm-up)\n" + plan.tree.pretty(1)
    )


ATTEMPT_FILE = ".attempt.json"  # a running attempt's progress; gone once it writes its summary
ATTEMPT_TMP = ".attempt.json.tmp"
KILLED = (
    "ended without writing a summary (killed outright: SIGKILL, out of memory, or its machine "
    "stopped); its wall time runs to its last completed step"
)


# What a checkpoint's state depends on: a resume that changes one would load it into another
# model or recipe, or continue on other prompts (a key, or a section and every key under it).
FIXED_ON_RESUME = ("model.path", "batch", "sampling.group_size", "task", "recipe")


def fixed_on_resume(cfg: Any) -> dict[str, Any]:
    """The values of ``FIXED_ON_RESUME`` in ``cfg`` (those it has), as JSON writes them: what
    the summary and ``ATTEMPT_FILE`` record, and ``loomrl resume`` compares."""
    from loomrl.config import to_dict

    if not dataclasses.is_dataclass(cfg):
        return {}
    tree, out = to_dict(cfg), {}
    for key in FIXED_ON_RESUME:
        node: Any = tree
        for part in key.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is not _ABSENT:
            out[key] = json.loads(json.dumps(node, default=str))
    return out


_ABSENT = object()


def recorded_fixed_on_resume(run_dir: Path) -> dict[str, Any] | None:
    """``fixed_on_resume`` of the config the run directory's last attempt ran (None where no
    attempt recorded it: a run directory of an earlier version)."""
    summary = _read_json(Path(run_dir) / "run_summary.json")
    latest = pending_attempt(Path(run_dir), summary) or summary or {}
    fixed = latest.get("fixed_on_resume")
    return fixed if isinstance(fixed, dict) else None


def earlier_attempts(run_dir: Path) -> list[dict[str, Any]]:
    """The attempts before this one of a resumed run: how each ended, its steps done, its wall
    time and median iteration (its ``iteration_s`` and ``wall_s`` covered that attempt alone).

    From the summary the last attempt wrote, or, when that attempt was killed outright and
    wrote none, from the ``ATTEMPT_FILE`` it left: it is listed with status ``"killed"`` after
    the attempts it listed itself (so attempts killed one after another are all kept).
    """
    prev = _read_json(run_dir / "run_summary.json")
    mark = pending_attempt(run_dir, prev)
    if mark is None:
        return _summary_attempts(prev)
    earlier = mark.get("earlier")
    if isinstance(earlier, list):
        out = [a for a in earlier if isinstance(a, dict)]
    else:  # not written by this version: the summary is all there is of the ones before
        out = _summary_attempts(prev)
    started, updated, done = (_number(mark.get(k)) for k in ("started", "updated", "steps_done"))
    median = _number(mark.get("measured_iteration_s"))
    killed = {
        "status": "killed",
        "error": KILLED,
        "wall_s": updated - started if started is not None and updated is not None else None,
        "measured_iteration_s": median,
        "steps_done": int(done) if done is not None else None,
    }
    return [*out, killed]


def pending_attempt(run_dir: Path, summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``ATTEMPT_FILE`` of an attempt that has written no summary (still running, or
    killed outright), else None; one left by the attempt that wrote ``summary`` (killed
    between writing it and removing the file) is no such attempt."""
    mark = _read_json(Path(run_dir) / ATTEMPT_FILE)
    if mark is not None and summary is not None:
        if _same(mark.get("started"), summary.get("attempt_started")):
            return None
    return mark


def listed_attempts(summary: Any) -> list[dict[str, Any]]:
    """The earlier attempts a run summary lists: a list of objects as a run writes it; anything
    else there is damage, read as none."""
    listed = summary.get("attempts")
    return [a for a in listed if isinstance(a, dict)] if isinstance(listed, list) else []


def _summary_attempts(prev: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The attempts a summary lists, then the one that wrote it."""
    if prev is None:
        return []
    out = listed_attempts(prev)
    last = {k: prev.get(k) for k in ("status", "error", "wall_s", "measured_iteration_s")}
    last["steps_done"] = prev.get("steps_done", prev.get("steps"))
    return [*out, last]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines record (``[]`` when it does not exist); a line cut short by
    a killed attempt, or not an object, is skipped."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def _number(v: Any) -> float | None:
    """A finite number read from a file written by a run, else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _same(a: Any, b: Any) -> bool:
    x, y = _number(a), _number(b)
    return x is not None and x == y


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a scheduler's time limit) while a run runs. A ``KeyboardInterrupt``,
    so that the run stops as on Ctrl-C: its workers stopped, its summary ``interrupted`` (with
    ``signal`` ``"SIGTERM"``), the command that resumes it said; the CLI exits 143."""


SIGTERM_SAID = "SIGTERM (kill, or a scheduler's time limit)"
# Whether the handler stop_on_sigterm installed last has raised Terminated.
_SIGTERM_SEEN: list[bool] = []


def terminated(error: BaseException | None) -> bool:
    """Whether ``error`` is how SIGTERM stops a command: a ``Terminated``, or the plain
    ``KeyboardInterrupt`` that Ray's waits (``ray.get``, ``ray.wait``) raise in place of the
    exception a signal handler raised while they blocked."""
    if isinstance(error, Terminated):
        return True
    return isinstance(error, KeyboardInterrupt) and bool(_SIGTERM_SEEN)


def stop_on_sigterm() -> Any:
    """Make SIGTERM raise ``Terminated`` in the main thread. A second SIGTERM, while the
    workers stop, is told and not raised: it would cut their shutdown short, and SIGKILL is the
    way to leave at once. Returns the handler it replaced; None off the main thread (no handler
    can be set there) or where that handler was installed outside Python."""
    if not _on_main_thread():
        return None
    before = signal.getsignal(signal.SIGTERM)
    if before is None:  # installed outside Python: nothing that could be put back
        return None
    # Installed as a command starts or goes on, never while one stops: a SIGTERM seen before
    # (a command run earlier in this process) says nothing of the interrupts to come.
    _SIGTERM_SEEN.clear()
    told: list[bool] = []

    def on_term(signum: int, frame: Any) -> None:
        if told:
            say("loomrl: stopping the workers after SIGTERM; SIGKILL leaves now", sys.stderr)
            return
        told.append(True)
        _SIGTERM_SEEN.append(True)
        raise Terminated(SIGTERM_SAID)

    signal.signal(signal.SIGTERM, on_term)
    return before


def put_back_sigterm(before: Any) -> None:
    """Reinstate ``before``, the SIGTERM handler ``signal.getsignal`` gave before a command
    changed it (None, installed outside Python, and off the main thread: nothing to do)."""
    if before is not None and _on_main_thread():
        signal.signal(signal.SIGTERM, before)


def _on_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _patient_interrupts() -> tuple[Any] | None:
    """While a run's workers stop after Ctrl-C: the next Ctrl-C says what is going on, the one
    after raises as usual. Returns (the handler to put back,); None off the main thread."""
    if not _on_main_thread():
        return None
    before = signal.getsignal(signal.SIGINT)
    if before is None:  # installed outside Python: nothing that could be put back
        return None
    told = []

    def on_interrupt(signum: int, frame: Any) -> None:
        if told:
            raise KeyboardInterrupt
        told.append(True)
        say("loomrl: stopping the workers; Ctrl-C again to leave now", sys.stderr)

    signal.signal(signal.SIGINT, on_interrupt)
    return (before,)


@contextlib.contextmanager
def finish_first(what: str) -> Iterator[None]:
    """Ctrl-C or SIGTERM while ``what`` runs (a checkpoint being written) waits for it to end,
    then acts as it would have; a second Ctrl-C leaves at once. A large model's save takes
    tens of seconds, and an interrupt in them would drop the checkpoint of a finished step."""
    before = (
        {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        if _on_main_thread()
        else {}
    )
    if any(h is None for h in before.values()):  # installed outside Python: cannot be put back
        before = {}
    # A signal the process ignores (a job started in the background ignores SIGINT) stays so.
    before = {s: h for s, h in before.items() if h is not signal.SIG_IGN}
    if not before:
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        if held and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not held:
            say(f"loomrl: finishing {what} first; Ctrl-C again to leave now without it", sys.stderr)
        held.append(signum)

    for s in before:
        signal.signal(s, hold)
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    if held:
        signal.raise_signal(held[0])  # now handled as it would have been


PROFILE_FILE = "profile.yaml"  # what `loomrl profile` writes into run.output_dir


def profile_recipe(cfg: Any, build: Any, sample: Any) -> str:
    """Profile a recipe's flow on one iteration's items: fit report, profile file, plan per mode."""
    from loomrl.cluster import Cluster
    from loomrl.config import atomic_write_text
    from loomrl.errors import LoomError
    from loomrl.flow import Flow
    from loomrl.plan.search import search_all
    from loomrl.profiler import profile_flow

    out = Path(cfg.run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    sigterm_before = signal.getsignal(signal.SIGTERM)
    cluster = Cluster.start(
        num_gpus=cfg.run.num_gpus,
        num_devices=cfg.run.devices,
        log_to_driver=False,
        pin_cores=cfg.run.pin_cores,
    )
    cluster.launch_timeout_s = cfg.run.launch_timeout_s
    # As in Run: ray.init made SIGTERM dump a native stack and abort; it stops the profile as
    # Ctrl-C does instead (workers stopped, exit 143, no profile file written).
    stop_on_sigterm()
    try:
        flow = Flow(cluster)
        build(flow, cfg)
        t = time.time()
        prof = profile_flow(
            flow,
            sample(),
            micro_batch=cfg.run.micro_batch,
            budget=cfg.run.profile_budget,
            notify=lambda line: say(f"loomrl profile: {line}", sys.stderr),
        )
        took = time.time() - t
        import yaml

        path = out / PROFILE_FILE
        raw = prof.to_dict()
        for name, n, x, secs, peak in flow.profile_run.samples:  # what the fit was made from
            rows = raw["components"].get(name, {}).setdefault("samples", [])
            rows.append([n, x, round(secs, 6), round(peak, 4)])
        # Whole or not at all: `run.profile=` of a file cut short by a kill would plan from it.
        unwritten: OSError | None = None
        try:
            atomic_write_text(path, yaml.safe_dump(raw, sort_keys=False, default_flow_style=None))
        except OSError as e:  # a full disk, say: the measuring is done, so show what it found
            unwritten = e
        plans = search_all(prof)
        best = plans.get("best")
        if best is not None:
            flow.profile_run.keep(best.assignment())
        lines = [f"profiled {len(flow.stages)} component(s) in {took:.1f}s -> {path}"]
        desc = flow.profile_run.describe(best.predicted_s if best is not None else None)
        lines += [f"  time: {desc}"]
        lines += [f"  {r}" for r in getattr(prof, "fit_reports", ())]
        for mode, plan in plans.items():
            lines.append(
                f"{mode}: "
                + ("no feasible plan" if plan is None else f"{plan.predicted_s:.3f}s\n{plan}")
            )
        if unwritten is not None:
            say("\n".join(lines))
            raise LoomError(
                f"could not write the profile to {path}: {unwritten.strerror or unwritten}; "
                "the fit and the plans it gives are printed above. Free space there (or pass "
                "output_dir=DIR) and profile again"
            )
        lines.append(f"pin it: loomrl run CONFIG run.profile={path} placement=auto")
        return "\n".join(lines)
    finally:
        try:
            cluster.shutdown()
        finally:
            put_back_sigterm(sigterm_before)
