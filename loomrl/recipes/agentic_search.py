"""Agentic RL (Search-R1 style): GRPO on a language model that calls a search tool mid-answer.

Run: loomrl run examples/search_grpo_smollm2.yaml

Each response is a multi-turn rollout: the model writes ``<search> query </search>``, a BM25
search worker (bm25s, on CPU, beside the plan) answers with ``<information> ... </information>``,
and the model goes on until it writes ``<answer> ... </answer>`` (``loomrl.agentic``). The reward
is the exact match of that answer; the tool's tokens are masked out of the loss. The workflow is
rollout.generate (with the tool) -> reward.score [-> reference.logprobs] -> actor.train, planned
like the reasoning recipes; the tool's time is part of the rollout's. Inside the rollout, the
agent <-> tool loop is a cycle of its own: ``agent.tool_groups: auto`` times a probe rollout at
a few group sizes before the flow is planned and lets the planner choose the ring groups
(``choose_tool_groups``, written to ``tool_plan.json``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from loomrl.agentic import AgentConfig
from loomrl.config import atomic_write_text
from loomrl.reasoning import common_problems, prompts
from loomrl.run import Run, RunConfig, profile_recipe
from loomrl.runlog import count_lines
from loomrl.worker import wait
from loomrl.workers.reasoning import AlgoConfig, ModelConfig, SamplingConfig, TaskConfig

TOOL_PLAN = "tool_plan.json"  # the ring probe's samples and choice, in the run directory


@dataclass
class Config:
    recipe: str = "agentic_search"
    batch: int = 4  # prompt groups per step (the flow's work items)
    eval_every: int = 5  # steps; 0 = only before and after training
    resume: bool = False
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    task: TaskConfig = field(
        default_factory=lambda: TaskConfig(name="search_qa", instruction="search")
    )
    agent: AgentConfig = field(default_factory=AgentConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def validate(self) -> list[str]:
        p = common_problems(self, min_group=2)
        if self.agent.corpus_path is None and self.task.name != "search_qa":
            p.append(
                f"agent.corpus_path: task {self.task.name!r} has no corpus of its own; give a "
                'JSONL file of {"title", "text"} lines (or use task.name: search_qa)'
            )
        elif self.agent.corpus_path is not None:  # read here, not first in the search workers
            from loomrl.errors import ConfigError
            from loomrl.tools import load_corpus

            try:
                load_corpus(path=self.agent.corpus_path)
            except ConfigError as e:
                p.extend(
                    f"agent.{x}" if x.startswith("corpus_path") else f"agent.corpus_path: {x}"
                    for x in e.problems
                )
            except OSError as e:  # unreadable (permissions, a vanished mount)
                p.append(f"agent.corpus_path: {self.agent.corpus_path!r} cannot be read: {e}")
        # The agent's turns are bounded by its own token budgets; these would be ignored.
        plain = SamplingConfig()
        for key in ("max_new_tokens", "eval_max_new_tokens"):
            if getattr(self.sampling, key) != getattr(plain, key):
                p.append(
                    f"sampling.{key}: not used by the agentic recipe, whose responses are "
                    "bounded by agent.turn_tokens (a turn) and agent.max_response_tokens (the "
                    "whole response, search results included); set those instead"
                )
        return p


def build(flow: Any, cfg: Config, notify: Any = print, reuse: Any = None) -> dict[str, Any]:
    """GRPO's flow with the agent's rollout, and the search workers it calls (beside the plan).
    With ``agent.tool_groups: auto`` the probe runs first (``choose_tool_groups``) and each
    rollout rank plans k from its samples for the rows its calls get (the flow's plan decides
    those); the probe and the choice at its own size are under ``"tool_plan"`` (None otherwise).
    ``reuse``: a ``tool_plan.json`` whose probe stands in for a new one where it exists (a
    resumed run: a new probe's timings could choose another k, and k changes what is sampled)."""
    from loomrl.recipes import reasoning_grpo
    from loomrl.workers.agent import AgentRolloutWorker
    from loomrl.workers.tool import SearchWorker

    s, a = cfg.run.seed, cfg.agent
    tool = flow.cluster.launch(
        SearchWorker,
        a.tool_workers,
        None if a.corpus_path else cfg.task.as_kwargs(s),
        a.corpus_path,
        a.top_k,
        a.doc_chars,
        devices=tool_devices(a.tool_workers, flow.cluster.num_devices),
        name="search",
    )
    choice = None
    if a.tool_groups == "auto":
        choice = reused_tool_plan(reuse, notify) if reuse is not None else None
        choice = choice or choose_tool_groups(flow.cluster, cfg, tool, notify)
    rollout = flow.group(
        AgentRolloutWorker,
        cfg.model,
        cfg.sampling,
        a,
        tool,
        s,
        ring=None if choice is None else choice["samples"],  # k per call size, on each rank
        name="rollout",
    )
    return {**reasoning_grpo.build(flow, cfg, rollout=rollout), "search": tool, "tool_plan": choice}


def reused_tool_plan(path: Any, notify: Any = print) -> dict | None:
    """A resumed run's ``tool_plan.json``, marked ``reused``; None where there is none or it
    cannot be read (said, and the caller probes again)."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        choice = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        notify(f"tool_groups auto: {path} is unreadable ({e}); probing again")
        return None
    # What the rollout ranks and the run's summary read.
    need = ("samples", "rows", "predicted_s", "probe_s")
    missing = [k for k in need if k not in choice] if isinstance(choice, dict) else list(need)
    if missing:
        notify(f"tool_groups auto: {path} lacks {missing}; probing again")
        return None
    notify(f"tool_groups auto: the probe of {path} reused (the run resumes)")
    return {**choice, "reused": True}


def choose_tool_groups(cluster: Any, cfg: Config, tool: Any, notify: Any = print) -> dict:
    """``agent.tool_groups: auto``: a probe rollout worker (on the first device, before the
    flow's workers start) times the first rollout call's rows cut into 1, 2 and 4 ring groups,
    each group rolled out alone (``probe_ring``); the planner prices every k those sizes allow
    as the cycle agent <-> tool and chooses (``loomrl.agentic.plan_tool_groups``). The choice
    reported is for calls of the probe's rows; the rollout's ranks choose again for theirs."""
    import time

    from loomrl.agentic import plan_tool_groups, ring_sizes
    from loomrl.reasoning import Encoder
    from loomrl.tasks import make_task
    from loomrl.workers.agent import AgentRolloutWorker

    s, t0 = cfg.sampling, time.perf_counter()
    task = make_task(**cfg.task.as_kwargs(cfg.run.seed))
    encode = Encoder(cfg.model.path, cfg.task.instruction, cfg.agent.response_prefix)
    items = prompts(task, encode, 0, min(cfg.batch, s.gen_groups))
    rows = [it["prompt_ids"] for it in items for _ in range(s.group_size)]
    agent = replace(cfg.agent, tool_groups=1)
    probe = cluster.launch(
        AgentRolloutWorker, 1, cfg.model, s, agent, tool, cfg.run.seed, devices=1, name="probe"
    )
    try:
        (samples,) = wait(probe.probe_ring(rows, ring_sizes(len(rows))))
    finally:
        probe.kill()
    choice = plan_tool_groups(samples, len(rows))
    choice.update(samples=samples, probe_s=time.perf_counter() - t0, rows=len(rows))
    table = ", ".join(f"k={k}: {v:.2f}s" for k, v in choice["predicted_s"].items())
    notify(
        f"tool_groups auto: k={choice['groups']} for rollout calls of {len(rows)} rows "
        f"(predicted per call {table}; probe {choice['probe_s']:.1f}s; each rollout rank plans "
        "k again for the rows its calls get)"
    )
    return choice


def tool_devices(workers: int, available: int) -> int:
    """How many of the cluster's first devices ``workers`` search workers spread over (their
    cores on a CPU-only node): the most that split evenly, so any worker count can start."""
    return max(d for d in range(1, available + 1) if workers % d == 0 or d % workers == 0)


def main(cfg: Config) -> dict:
    from loomrl.flow import Flow
    from loomrl.reasoning import (
        Encoder,
        check_context,
        fresh_start,
        metrics_of,
        opening_metrics,
        restore,
        save,
        weight_sync,
    )
    from loomrl.tasks import make_task

    run = Run(cfg, cfg.run)
    try:
        task = make_task(**cfg.task.as_kwargs(cfg.run.seed))
        encode = Encoder(cfg.model.path, cfg.task.instruction, cfg.agent.response_prefix)
        # The whole multi-turn response, search results included, shares the window.
        check_context(task, encode, {"agent.max_response_tokens": cfg.agent.max_response_tokens})
        flow = Flow(run.cluster, run.dir, offload=cfg.run.offload)
        reuse = run.dir / TOOL_PLAN if cfg.resume else None
        g = build(flow, cfg, notify=run.logger.echo, reuse=reuse)
        if g["tool_plan"] is not None and not g["tool_plan"].get("reused"):
            atomic_write_text(
                run.dir / TOOL_PLAN, json.dumps(g["tool_plan"], indent=2, default=str)
            )
        run.apply_plan(flow, prompts(task, encode, 0, cfg.batch))
        start = restore(run, g) if cfg.resume else fresh_start(run)
        sync = weight_sync(g["actor"], g["rollout"], cfg=cfg.run)
        sync()
        metrics = opening_metrics(
            run,
            start,
            cfg.run.steps,
            lambda: {
                **evaluate_by_hops(g["rollout"], task, encode, cfg),
                **tool_step(run, g["rollout"], start, "eval/"),
            },
        )
        for step in range(start, cfg.run.steps):
            run.maybe_inject_failure(step, g["rollout"].group)
            try:
                result = flow.run(prompts(task, encode, step, cfg.batch))
            except Exception:  # the failed calls that stopped it are kept too
                keep_tool_events(run, g["rollout"], step + 1)
                raise
            sync()
            run.record(step, result, flow)
            metrics = {**metrics_of(result, sync), **tool_step(run, g["rollout"], step + 1)}
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.run.steps:
                metrics.update(evaluate_by_hops(g["rollout"], task, encode, cfg))
                metrics.update(tool_step(run, g["rollout"], step + 1, "eval/"))
            run.logger.log(step + 1, metrics)
            if cfg.run.checkpoint_every and (step + 1) % cfg.run.checkpoint_every == 0:
                save(run, g, step + 1)
        save(run, g, cfg.run.steps)
        sha = wait(g["actor"].param_sha256())[0]
        used = tool_groups_summary(g, cfg, metrics.get("tool_groups"))
        flow.shutdown()
        from loomrl.plots import plot_run

        plot_run(run.dir)
        failed_calls = count_lines(run.dir / "tool_events.jsonl")
        return run.summary(
            cfg.run.steps, sha, metrics, tool_groups=used, tool_events_total=failed_calls
        )
    finally:
        run.close()


def tool_groups_summary(g: dict, cfg: Config, used: float | None = None) -> dict[str, Any]:
    """``run_summary.json``'s ``tool_groups``: the ring groups used, as set or as chosen.
    ``used``: the last step's ``tool_groups`` metric (the most groups one of its rollout calls
    used); with ``auto``, ``by_rows`` is each rank's choice per call size."""
    choice = g["tool_plan"]
    if choice is None:
        return {"groups": cfg.agent.tool_groups, "source": "config"}
    by_rows: dict[str, int] = {}
    for picks in wait(g["rollout"].ring_choices()):
        by_rows.update({str(n): k for n, k in picks.items()})
    return {
        "groups": None if used is None else int(used),
        "source": "auto",
        "by_rows": dict(sorted(by_rows.items(), key=lambda kv: int(kv[0]))),
        "probe_rows": choice["rows"],
        "predicted_s": choice["predicted_s"],
        "probe_s": choice["probe_s"],
        "probe_reused": bool(choice.get("reused")),
    }


def evaluate_by_hops(rollout: Any, task: Any, encode: Any, cfg: Config) -> dict[str, float]:
    """Held-out accuracy, and per number of look-ups a question needs when the task says
    (``eval_accuracy/hops1``, ``/hops2``)."""
    from loomrl.reasoning import eval_scores

    scored = eval_scores(rollout, task, encode, cfg)
    out = {"eval_accuracy": sum(s for _, s in scored) / max(1, len(scored))}
    hops = sorted({e.meta["hops"] for e, _ in scored if "hops" in e.meta})
    for h in hops if len(hops) > 1 else []:
        mine = [s for e, s in scored if e.meta.get("hops") == h]
        out[f"eval_accuracy/hops{h}"] = sum(mine) / len(mine)
    return out


def tool_step(
    run: Run, rollout: Any, step: int, prefix: str = "", timeout: float | None = None
) -> dict[str, float]:
    """The search tool's part of a step's phase (training, or evaluation with ``prefix``
    "eval/"): its failed calls appended to ``tool_events.jsonl`` under ``step``, the row of
    ``metrics.jsonl`` they belong to, the seconds the rollout waited for results
    (``time/tool_wait``) and the most ring groups one of its rollout calls used
    (``tool_groups``). Called after each phase, so one phase's calls never count in
    another's."""
    logs = wait(rollout.tool_log(), timeout=timeout)
    events = [e for log in logs for e in log["events"]]
    phase = "eval" if prefix else "train"
    if events:
        with open(run.dir / "tool_events.jsonl", "a") as f:
            for e in events:
                f.write(json.dumps({"step": step, "phase": phase, **e}) + "\n")
        run.logger.echo(
            f"step {step} ({phase}): {len(events)} search call(s) failed (tool_events.jsonl)"
        )
    out = {f"{prefix}time/tool_wait": sum(log["wait_s"] for log in logs)}
    ks = [k for log in logs for _, k in log["ring_calls"]]
    if ks:  # the most ring groups one rollout call of the phase used
        out[f"{prefix}tool_groups"] = float(max(ks))
    return out


def keep_tool_events(run: Run, rollout: Any, step: int) -> None:
    """After a training phase failed (too many failed searches stop it): its failed calls still
    reach ``tool_events.jsonl``, if the rollout workers answer within a few seconds."""
    try:
        tool_step(run, rollout, step, timeout=5.0)
    except Exception as e:  # dead or stuck workers: the run's own error is the one to report
        run.logger.echo(f"tool events of the failed step not read: {type(e).__name__}")


def profile(cfg: Config) -> str:
    """`loomrl profile CONFIG`: measure the components, fit, save the profile, show the plans."""
    from loomrl.reasoning import Encoder
    from loomrl.tasks import make_task

    return profile_recipe(
        cfg,
        build,
        lambda: prompts(
            make_task(**cfg.task.as_kwargs(cfg.run.seed)),
            Encoder(cfg.model.path, cfg.task.instruction, cfg.agent.response_prefix),
            0,
            cfg.batch,
        ),
    )
