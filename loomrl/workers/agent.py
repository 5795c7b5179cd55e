"""The agent's rollout worker: multi-turn generation that calls a search tool between turns.

``AgentRolloutWorker`` is a ``RolloutWorker`` whose responses come from
``loomrl.agentic.agent_rollout``: it holds the search worker group it was given (a view that
can call, not kill) and calls it through a ``ToolCaller`` with the config's deadline. Its items
carry, beside the reasoning rollout's columns, ``response_masks`` (1 = sampled, 0 = inserted by
the tool), ``searches``, ``tool_failures`` and ``answered`` per response.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from loomrl.agentic import AGENT, TOOL, AgentConfig, ToolCaller, agent_rollout, ring_cut
from loomrl.tasks.search_qa import ANSWER_CLOSE, SEARCH_CLOSE
from loomrl.weights import resident
from loomrl.worker import dispatch
from loomrl.workers.reasoning import ModelConfig, RolloutWorker, SamplingConfig


class AgentRolloutWorker(RolloutWorker):
    def __init__(
        self,
        model: ModelConfig,
        sampling: SamplingConfig,
        agent: AgentConfig,
        tool: Any,
        seed: int = 0,
        ring: dict | None = None,
    ):
        super().__init__(model, sampling, seed)
        if agent.tool_groups == "auto" and ring is None:
            raise ValueError(
                "AgentRolloutWorker: agent.tool_groups is 'auto' but no probe samples were "
                "given: pass ring=<probe_ring's result> or set tool_groups to a count"
            )
        self.agent = agent
        self.ring = ring  # probe_ring's samples: with tool_groups auto, k is planned per call size
        self.ring_choice: dict[int, int] = {}  # rows per call -> k the planner chose
        self.tool = ToolCaller(tool, agent.tool_timeout_s, agent.max_tool_failures)
        self.gen_calls: list[tuple[int, float]] = []  # (rows, seconds) per generation call
        self.ring_calls: list[tuple[int, int]] = []  # (rows, k) per rollout call

    def _generate(
        self, rows: list[list[int]], max_new: int, seed: int, temperature: float, top_p: float
    ) -> Any:
        """One turn for ``rows``: sampled until a tool tag closes, EOS, or ``max_new`` tokens."""
        return self.engine.generate(
            rows,
            max_new_tokens=max_new,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop_strings=(SEARCH_CLOSE, ANSWER_CLOSE),
        )

    def _rollout(
        self,
        prompts: list[list[int]],
        seed: int,
        temperature: float,
        top_p: float,
        generate: Any = None,
        submit: Any = None,
        cfg: AgentConfig | None = None,
    ):
        eng = self.engine
        cfg = cfg or self.agent
        if cfg.tool_groups == "auto":
            cfg = replace(cfg, tool_groups=self._ring_groups(len(prompts)))
        if generate is None:  # the run's own rollouts (a probe brings its own timing)
            self.ring_calls.append((len(prompts), int(cfg.tool_groups)))
            generate = self._timed_generate(self.gen_calls, temperature, top_p)
        return agent_rollout(
            prompts,
            generate=generate,
            submit=submit or self.tool.submit,
            encode=lambda text: eng.tokenizer.encode(text, add_special_tokens=False),
            decode=eng.decode,
            cfg=cfg,
            seed=seed,
            window=eng.context_window,
        )

    def _timed_generate(self, log: list, temperature: float, top_p: float) -> Any:
        """``agent_rollout``'s generate(rows, n, seed), appending (rows, seconds) per call to
        ``log``."""

        def generate(rows, n, seed):
            t = time.perf_counter()
            out = self._generate(rows, n, seed, temperature, top_p)
            log.append((len(rows), time.perf_counter() - t))
            return out

        return generate

    def _ring_groups(self, rows: int) -> int:
        """``tool_groups: auto``: the planner's k for rollout calls of ``rows`` rows, from the
        probe's samples. Per call size, since the plan decides how many rows a call gets (a
        rollout over n ranks hands each a share, and evaluation calls in chunks of its own)."""
        if rows not in self.ring_choice:
            from loomrl.agentic import plan_tool_groups

            self.ring_choice[rows] = plan_tool_groups(self.ring, rows)["groups"]
        return self.ring_choice[rows]

    def ring_choices(self) -> dict[int, int]:
        """``tool_groups: auto``: the k chosen so far per rows of a rollout call."""
        return dict(self.ring_choice)

    def set_tool_groups(self, k: int) -> None:
        """Use k ring groups from the next rollout on, whatever the config said."""
        self.agent = replace(self.agent, tool_groups=int(k))

    @dispatch("rank0")
    def probe_ring(self, prompts: list[list[int]], sizes: list[int], reps: int = 1) -> dict:
        """Time the rows of a rollout call as ring groups of each size m in ``sizes``, each
        group rolled out alone (k = 1), one after the other: every group of every size, since
        groups differ (their questions, how long their searches and answers run) and the ring's
        cost is all of its groups'. One untimed rollout of the smallest group comes first
        (kernels, caches), then ``reps`` timed passes.

        Returns samples for ``loomrl.agentic.ring_profile``: ``agent``, each generation call as
        (m, seconds); ``tool``, each tool call as (m, seconds from its start to its results,
        which a single group waits for at once); ``turns``, generation calls per group. The
        probe calls the tool through a caller of its own and ``tool_log`` is left as it was.
        """
        s = self.sampling
        caller = ToolCaller(
            self.tool.group, self.agent.tool_timeout_s, self.agent.max_tool_failures
        )
        cfg = replace(self.agent, tool_groups=1)
        out: dict[str, list] = {AGENT: [], TOOL: [], "turns": []}
        n = len(prompts)
        groups = [  # as agent_rollout cuts
            [prompts[r.start : r.stop] for r in ring_cut(n, k)]
            for k in sorted({max(1, n // m) for m in sizes})
        ]
        runs = [(prompts[: min(sizes)], False)]
        runs += [(rows, True) for _ in range(reps) for cut in groups for rows in cut]
        with resident(self.engine):
            for r, (rows, timed) in enumerate(runs):
                gen_s: list[tuple[int, float]] = []
                tool_s: list[float] = []
                generate = self._timed_generate(gen_s, s.temperature, s.top_p)

                def submit(queries, tool_s=tool_s):
                    t = time.perf_counter()
                    results = caller.submit(queries)

                    def wait_results():
                        res = results()
                        tool_s.append(time.perf_counter() - t)
                        return res

                    return wait_results

                self._rollout(
                    rows, self.seed + 7 * r, s.temperature, s.top_p, generate, submit, cfg
                )
                if timed:
                    m = len(rows)
                    out[AGENT] += [(m, x) for _, x in gen_s]  # by group size
                    out[TOOL] += [(m, x) for x in tool_s]
                    out["turns"].append(len(gen_s))
        out["tool_failures"] = len(caller.events)
        return out

    def _responses(self, prompts: list[list[int]], seed: int) -> dict[str, list]:
        s = self.sampling
        trajs = self._rollout(prompts, seed, s.temperature, s.top_p)
        return {
            "response_ids": [t.response_ids for t in trajs],
            "response_masks": [t.response_mask for t in trajs],
            "logprobs": [t.logprobs for t in trajs],
            "texts": [t.text for t in trajs],
            "searches": [t.searches for t in trajs],
            "tool_failures": [t.tool_failures for t in trajs],
            "answered": [int(t.finish == "answer") for t in trajs],
        }

    @dispatch("split")
    def evaluate(self, examples: list[dict]) -> list[str]:
        """Greedy multi-turn responses to held-out prompts (the driver scores them)."""
        texts: list[str] = []
        with resident(self.engine):
            for i in range(0, len(examples), 16):
                chunk = [e["prompt_ids"] for e in examples[i : i + 16]]
                texts.extend(t.text for t in self._rollout(chunk, 0, 0.0, 1.0))
        return texts

    def tool_log(self) -> dict[str, Any]:
        """What the ring did since the last call of this method: the search tool's calls, the
        seconds the rollout sat waiting for results (ring groups hide the rest of a call), the
        failed calls (``events``), each generation call as (rows, seconds) (``gen_calls``), and
        each rollout call as (rows, ring groups k) (``ring_calls``)."""
        t = self.tool
        log = {
            "calls": t.calls,
            "wait_s": t.wait_s,
            "events": t.events,
            "gen_calls": self.gen_calls,
            "ring_calls": self.ring_calls,
        }
        t.calls, t.wait_s, t.events, self.gen_calls, self.ring_calls = 0, 0.0, [], [], []
        return log
