"""GRPO on a language model with verifiable math rewards.

Run: loomrl run examples/grpo_math_smollm2.yaml

The workflow is rollout.generate -> reward.score [-> reference.logprobs] -> actor.train; the plan
(auto, temporal, spatial, hybrid or a pinned file) decides where each runs and how batches stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loomrl.reasoning import common_problems, prompts
from loomrl.run import Run, RunConfig, profile_recipe
from loomrl.worker import wait
from loomrl.workers.reasoning import (
    ActorWorker,
    AlgoConfig,
    ModelConfig,
    ReferenceWorker,
    RewardWorker,
    RolloutWorker,
    SamplingConfig,
    TaskConfig,
)


@dataclass
class Config:
    recipe: str = "grpo"
    batch: int = 8  # prompt groups per step (the flow's work items)
    eval_every: int = 5  # steps; 0 = only before and after training
    resume: bool = False
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def validate(self) -> list[str]:
        # GRPO normalises rewards within a group: it needs at least two responses per prompt.
        return common_problems(self, min_group=2)


def build(flow: Any, cfg: Config, rollout: Any = None) -> dict[str, Any]:
    """The GRPO flow; ``rollout`` replaces the plain rollout group (an agent's, for one)."""
    s = cfg.run.seed
    if rollout is None:
        rollout = flow.group(RolloutWorker, cfg.model, cfg.sampling, s, name="rollout")
    g = {
        "rollout": rollout,
        "reward": flow.group(
            RewardWorker,
            cfg.task.as_kwargs(s),
            cfg.algo,
            cfg.sampling.group_size,
            name="reward",
            valid_devices=[1],
        ),
        "actor": flow.group(
            ActorWorker, cfg.model, cfg.sampling, cfg.algo, s, name="actor", single_process="cpu"
        ),
    }
    stages = [g["rollout"].generate, g["reward"].score]
    if cfg.algo.kl_coef > 0:
        g["reference"] = flow.group(ReferenceWorker, cfg.model, cfg.sampling, s, name="reference")
        stages.append(g["reference"].logprobs)
    flow.chain(*stages, g["actor"].train)
    return g


def main(cfg: Config) -> dict:
    from loomrl.flow import Flow
    from loomrl.reasoning import (
        Encoder,
        check_context,
        evaluate,
        fresh_start,
        metrics_of,
        opening_metrics,
        restore,
        sampling_budgets,
        save,
        weight_sync,
    )
    from loomrl.tasks import make_task

    run = Run(cfg, cfg.run)
    try:
        task, encode = (
            make_task(**cfg.task.as_kwargs(cfg.run.seed)),
            Encoder(cfg.model.path, cfg.task.instruction),
        )
        check_context(task, encode, sampling_budgets(cfg.sampling))
        flow = Flow(run.cluster, run.dir, offload=cfg.run.offload)
        g = build(flow, cfg)
        run.apply_plan(flow, prompts(task, encode, 0, cfg.batch))
        start = restore(run, g) if cfg.resume else fresh_start(run)
        sync = weight_sync(g["actor"], g["rollout"], cfg=cfg.run)
        sync()
        metrics = opening_metrics(
            run,
            start,
            cfg.run.steps,
            lambda: {"eval_accuracy": evaluate(g["rollout"], task, encode, cfg)},
        )
        for step in range(start, cfg.run.steps):
            run.maybe_inject_failure(step, g["rollout"].group)
            result = flow.run(prompts(task, encode, step, cfg.batch))
            sync()
            run.record(step, result, flow)
            metrics = metrics_of(result, sync)
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.run.steps:
                metrics["eval_accuracy"] = evaluate(g["rollout"], task, encode, cfg)
            run.logger.log(step + 1, metrics)
            if cfg.run.checkpoint_every and (step + 1) % cfg.run.checkpoint_every == 0:
                save(run, g, step + 1)
        save(run, g, cfg.run.steps)
        sha = wait(g["actor"].param_sha256())[0]
        flow.shutdown()
        from loomrl.plots import plot_run

        plot_run(run.dir)
        return run.summary(cfg.run.steps, sha, metrics)
    finally:
        run.close()


def profile(cfg: Config) -> str:
    """`loomrl profile CONFIG`: measure the components, fit, save the profile, show the plans."""
    from loomrl.reasoning import Encoder
    from loomrl.tasks import make_task

    return profile_recipe(
        cfg,
        build,
        lambda: prompts(
            make_task(**cfg.task.as_kwargs(cfg.run.seed)),
            Encoder(cfg.model.path, cfg.task.instruction),
            0,
            cfg.batch,
        ),
    )
