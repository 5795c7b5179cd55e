"""PPO with a learned critic on a language model with verifiable math rewards.

Run: loomrl run examples/ppo_math_smollm2.yaml      (tiny, seconds a step: examples/tiny_ppo.yaml)

The workflow is one chain, each component once:

    rollout.generate -> reward.score [-> reference.logprobs] -> critic.values
        -> advantage.compute -> critic_train.train -> actor.train

``critic`` values every response token with an inference copy of the value model; ``advantage``
turns the outcome reward (on the last token, minus a KL penalty when ``ppo.kl_coef > 0``) and the
values into GAE advantages and returns; ``critic_train`` passes the items on while buffering them
and takes its value-loss steps on the last micro-batch; ``actor`` takes its PPO steps on the whole
batch. Both trainers thus learn once per iteration from the same data. After the iteration the
driver syncs actor -> rollout and critic_train -> critic (why the value model is two components:
``loomrl/workers/critic.py``). The plan decides where each component runs and how batches stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loomrl.reasoning import common_problems, prompts
from loomrl.run import Run, RunConfig
from loomrl.worker import wait
from loomrl.workers.critic import (
    AdvantageWorker,
    CriticConfig,
    CriticWorker,
    PPOActorWorker,
    PPOConfig,
)
from loomrl.workers.reasoning import (
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
    recipe: str = "ppo"
    batch: int = 8  # prompt groups per step (the flow's work items)
    eval_every: int = 5  # steps; 0 = only before and after training
    resume: bool = False
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def validate(self) -> list[str]:
        return common_problems(self, min_group=1)


def build(flow: Any, cfg: Config) -> dict[str, Any]:
    s = cfg.run.seed
    # The reward worker's group advantages are GRPO's; PPO ignores them and uses the critic.
    g = {
        "rollout": flow.group(RolloutWorker, cfg.model, cfg.sampling, s, name="rollout"),
        "reward": flow.group(
            RewardWorker,
            cfg.task.as_kwargs(s),
            AlgoConfig(),
            cfg.sampling.group_size,
            name="reward",
            valid_devices=[1],
        ),
        "critic": flow.group(
            CriticWorker, cfg.model, cfg.critic, cfg.ppo, s, trainable=False, name="critic"
        ),
        "advantage": flow.group(AdvantageWorker, cfg.ppo, name="advantage", valid_devices=[1]),
        "critic_train": flow.group(
            CriticWorker,
            cfg.model,
            cfg.critic,
            cfg.ppo,
            s,
            name="critic_train",
            single_process=True,
        ),
        "actor": flow.group(
            PPOActorWorker, cfg.model, cfg.sampling, cfg.ppo, s, name="actor", single_process="cpu"
        ),
    }
    stages = [g["rollout"].generate, g["reward"].score]
    if cfg.ppo.kl_coef > 0:
        g["reference"] = flow.group(ReferenceWorker, cfg.model, cfg.sampling, s, name="reference")
        stages.append(g["reference"].logprobs)
    stages += [
        g["critic"].values,
        g["advantage"].compute,
        g["critic_train"].train,
        g["actor"].train,
    ]
    flow.chain(*stages)
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
        sampling_budgets,
        weight_sync,
    )
    from loomrl.tasks import make_task

    run = Run(cfg, cfg.run)
    try:
        task = make_task(**cfg.task.as_kwargs(cfg.run.seed))
        encode = Encoder(cfg.model.path, cfg.task.instruction)
        check_context(task, encode, sampling_budgets(cfg.sampling))
        flow = Flow(run.cluster, run.dir, offload=cfg.run.offload)
        g = build(flow, cfg)
        run.apply_plan(flow, prompts(task, encode, 0, cfg.batch))
        start = restore(run, g) if cfg.resume else fresh_start(run)
        syncs = [
            weight_sync(g["actor"], g["rollout"], cfg=cfg.run),
            weight_sync(g["critic_train"], g["critic"], cfg=cfg.run),
        ]
        for sync in syncs:
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
            for sync in syncs:
                sync()
            run.record(step, result, flow)
            metrics = metrics_of(result, *syncs)
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.run.steps:
                metrics["eval_accuracy"] = evaluate(g["rollout"], task, encode, cfg)
            run.logger.log(step + 1, metrics)
            if cfg.run.checkpoint_every and (step + 1) % cfg.run.checkpoint_every == 0:
                save(run, g, step + 1)
        save(run, g, cfg.run.steps)
        sha = wait(g["actor"].param_sha256())[0]
        critic_sha = wait(g["critic_train"].param_sha256())[0]
        flow.shutdown()
        from loomrl.plots import plot_run

        plot_run(run.dir)
        return run.summary(cfg.run.steps, sha, metrics, critic_param_sha256=critic_sha)
    finally:
        run.close()


def save(run: Any, g: dict[str, Any], step: int) -> None:
    """Actor and critic (weights, optimizers) plus the driver's RNG, as one checkpoint."""
    from loomrl.checkpoint import capture_rng, save_checkpoint

    state = {
        "actor": wait(g["actor"].save_state())[0],
        "critic": wait(g["critic_train"].save_state())[0],
        "step": step,
        "rng": capture_rng(),
    }
    save_checkpoint(run.dir, step, state, keep=run.rc.keep_checkpoints)


def restore(run: Any, g: dict[str, Any]) -> int:
    from loomrl.checkpoint import latest_checkpoint, load_checkpoint, restore_rng

    path = latest_checkpoint(run.dir)
    if path is None:
        return 0
    state = load_checkpoint(path, weights_only=False)
    wait(g["actor"].load_state(state["actor"]))
    wait(g["critic_train"].load_state(state["critic"]))
    restore_rng(state["rng"])
    run.steps_done = int(state["step"])
    return run.steps_done
