"""The agent's rollout worker: multi-turn generation that calls a search tool between turns.

``AgentRolloutWorker`` is a ``RolloutWorker`` whose responses come from
``loomrl.agentic.agent_rollout``: it holds the search worker group it was given (a view that
can call, not kill) and calls it through a ``ToolCaller`` with the config's deadline. Its items
carry, beside the reasoning rollout's columns, ``response_masks`` (1 = sampled, 0 = inserted by
the tool), ``searches``, ``tool_failures`` and ``answered`` per response.
"""

from __future__ import annotations

from typing import Any

from loomrl.agentic import AgentConfig, ToolCaller, agent_rollout
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
    ):
        super().__init__(model, sampling, seed)
        self.agent = agent
        self.tool = ToolCaller(tool, agent.tool_timeout_s, agent.max_tool_failures)

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

    def _rollout(self, prompts: list[list[int]], seed: int, temperature: float, top_p: float):
        eng = self.engine
        return agent_rollout(
            prompts,
            generate=lambda rows, n, turn_seed: self._generate(
                rows, n, turn_seed, temperature, top_p
            ),
            submit=self.tool.submit,
            encode=lambda text: eng.tokenizer.encode(text, add_special_tokens=False),
            decode=eng.decode,
            cfg=self.agent,
            seed=seed,
        )

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
        """What the search tool did since the last call of this method: its calls, the seconds
        the rollout sat waiting for results (ring groups hide the rest of a call), and the
        failed calls (``events``)."""
        t = self.tool
        log = {"calls": t.calls, "wait_s": t.wait_s, "events": t.events}
        t.calls, t.wait_s, t.events = 0, 0.0, []
        return log
