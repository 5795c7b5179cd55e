"""The agent <-> search tool loop on Ray: a scripted policy (the tiny model's tokens, chosen by
rule) with the real search worker, reward and actor; tool timeouts, errors and dead tools."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import pytest

from loomrl import wait
from loomrl.agentic import AgentConfig
from loomrl.errors import RemoteError
from loomrl.reasoning import Encoder, prompts
from loomrl.tasks import make_task
from loomrl.workers.agent import AgentRolloutWorker
from loomrl.workers.reasoning import (
    ActorWorker,
    AlgoConfig,
    ModelConfig,
    RewardWorker,
    SamplingConfig,
)
from loomrl.workers.tool import SearchWorker

TASK = {"name": "search_qa", "seed": 0, "people": 200, "hops": 1, "eval_size": 8}
MODEL = ModelConfig(path="tiny-llama", lr=1e-3, train_micro_batch=4)
SAMPLING = SamplingConfig(group_size=4, gen_groups=1)


@dataclass
class _Out:
    response_ids: list
    response_logprobs: list
    finish_reasons: list


# Where the first result states what each kind of question asks.
QUESTION = r"Question: (?:In \w+ \w+ was (.+?) born|What was the profession of (.+?))\?"
READ = {"city": r"city of (\w+)", "year": r"born in (\d+)", "profession": r"was an? (\w+) born"}


class ScriptedAgent(AgentRolloutWorker):
    """Writes by rule instead of sampling: turn 1 searches the question's name, turn 2 answers
    with what the first result says (rows 0 and 1 of a group) or with a wrong answer (2, 3)."""

    def _generate(self, rows, max_new, seed, temperature, top_p):
        tok, out = self.engine.tokenizer, []
        for r, row in enumerate(rows):
            text = tok.decode(row)
            reply = text.rsplit("assistant", 1)[1]  # the prompt's worked example has tags too
            if "<information>" not in reply:
                asked = re.findall(QUESTION, text)[-1]
                name = asked[0] or asked[1]
                line = f" {name} </search>"
            else:
                info = reply.rsplit("<information>", 1)[1]
                question = re.findall(r"Question: (.+)\?", text)[-1]
                rule = next(v for k, v in READ.items() if k in question)
                found = re.search(rule, info)  # None when the search failed
                said = found.group(1) if found and r % 4 < 2 else "Nowhere"
                line = f"<answer> {said} </answer>"
            out.append(tok.encode(line, add_special_tokens=False)[:max_new])
        return _Out(out, [[-1.0] * len(x) for x in out], ["stop"] * len(out))


class ScriptedSearch(SearchWorker):
    """The search tool, misbehaving as a test sets it (``behave``): "slow" sleeps 2 s every
    call, "once_slow" 5 s in the first call after it is set, "lagged" 0.2 s every call,
    "broken" raises. One agent process (seconds to start: torch, the model) serves several
    behaviours in turn."""

    mode, calls = "plain", 0

    def behave(self, mode: str) -> None:
        self.mode, self.calls = mode, 0

    def search(self, queries):
        self.calls += 1
        if self.mode == "broken":
            raise RuntimeError("index corrupted")
        delay = {"slow": 2.0, "once_slow": 5.0 if self.calls == 1 else 0.0, "lagged": 0.2}
        time.sleep(delay.get(self.mode, 0.0))
        return super().search(queries)


AGENT = AgentConfig(
    max_turns=2, turn_tokens=40, max_response_tokens=400, response_prefix="<search>"
)


def _items(n: int = 2) -> list[dict]:
    task = make_task(**{**TASK, "name": "search_qa"})
    return prompts(task, Encoder("tiny-llama", "search", "<search>"), 0, n)


def _tool(cluster, cls=SearchWorker, n=1):
    return cluster.launch(cls, n, TASK, None, 2, 300, name=f"search-{cls.__name__}")


def test_tool_results_reach_the_policy_and_only_its_tokens_train(cluster):
    from loomrl.cluster import GroupLaunch

    tool = _tool(cluster, n=2)  # queries split over two search ranks
    # Started together: their imports and model loads overlap.
    agent, reward, actor = cluster.launch_many(
        [
            GroupLaunch(ScriptedAgent, 1, (MODEL, SAMPLING, AGENT, tool, 0), name="agent"),
            GroupLaunch(RewardWorker, 1, (TASK, AlgoConfig(), 4), name="reward"),
            GroupLaunch(ActorWorker, 1, (MODEL, SAMPLING, AlgoConfig(), 0), name="actor"),
        ]
    )
    try:
        items = _items()
        (rolled,) = wait(agent.generate(items))
        for it in rolled:
            assert it["searches"] == [1] * 4 and it["answered"] == [1] * 4
            for ids, mask, text in zip(
                it["response_ids"], it["response_masks"], it["texts"], strict=True
            ):
                assert len(mask) == len(ids) and 0 < sum(mask) < len(ids)
                assert it["answer"] in text  # the tool's result names the city
            assert it["gen_tokens"] == sum(map(sum, it["response_masks"]))
        (scored,) = wait(reward.score(rolled))
        assert [g["rewards"] for g in scored] == [[1.0, 1.0, 0.0, 0.0]] * 2
        (trained,) = wait(actor.train(scored))
        stats = trained[-1]
        sampled = sum(it["gen_tokens"] for it in rolled)
        total = sum(len(r) for it in rolled for r in it["response_ids"])
        assert stats["tokens"] == sampled < total  # inserted results are not in the loss
        assert stats["searches"] == 1.0 and stats["answered"] == 1.0
        assert stats["reward_mean"] == 0.5 and stats["grad_norm"] > 0
        assert sum(wait(tool.documents())) == 2 * len(make_task(**TASK).corpus())
    finally:
        for g in (tool, agent, reward, actor):
            g.kill()


SLOW = AgentConfig(**{**AGENT.__dict__, "tool_timeout_s": 0.5, "max_tool_failures": 2})


def _outcome(call):
    """``call()``'s result, or the exception it raised."""
    try:
        return call()
    except Exception as e:
        return e


@pytest.fixture(scope="module")
def tight_timeout(cluster):
    """An agent with tool_timeout_s=0.5 and max_tool_failures=2: two rollouts while the tool's
    first call takes 5 s, then two while every call takes 2 s (the failed calls in a row go
    back to 0 with the answered one in between)."""
    tool = _tool(cluster, ScriptedSearch)
    agent = cluster.launch(ScriptedAgent, 1, MODEL, SAMPLING, SLOW, tool, 0, name="agent-slow")
    out = {}
    try:
        wait(tool.behave("once_slow"))
        (out["first"],) = wait(agent.generate(_items(1)))
        (out["second"],) = wait(agent.generate(_items(1)))
        (out["once_log"],) = wait(agent.tool_log())
        wait(tool.behave("slow"))
        (out["slow"],) = wait(agent.generate(_items(1)))
        (out["slow_log"],) = wait(agent.tool_log())
        out["stopped"] = _outcome(lambda: wait(agent.generate(_items(1))))
    finally:
        tool.kill()
        agent.kill()
    return out


def test_a_slow_tool_times_out_then_stops_the_run(tight_timeout):
    rolled, log = tight_timeout["slow"], tight_timeout["slow_log"]
    assert rolled[0]["tool_failures"] == [1] * 4
    assert all("search failed: timeout" in t for t in rolled[0]["texts"])
    events = log["events"]
    assert [e["event"] for e in events] == ["tool_timeout"] and log["calls"] == 1
    assert "tool_timeout_s=0.5" in events[0]["cause"]
    stopped = tight_timeout["stopped"]
    assert isinstance(stopped, RemoteError), stopped
    assert re.search("ToolError: the search tool failed 2 calls in a row", str(stopped))


def test_one_slow_search_does_not_hold_back_the_calls_after_it(tight_timeout):
    """The first call sleeps 5 s and times out; the next, made while it still runs, is
    answered: one failure, not a run stopped by calls queued behind the slow one."""
    first, second = tight_timeout["first"], tight_timeout["second"]
    assert first[0]["tool_failures"] == [1] * 4 and second[0]["tool_failures"] == [0] * 4
    assert [e["event"] for e in tight_timeout["once_log"]["events"]] == ["tool_timeout"]


@pytest.fixture(scope="module")
def default_agent(cluster):
    """An agent with the default AGENT config and one tool worker: the ring probe and a
    rollout with the tool lagging 0.2 s a call, a rollout with the tool raising, one
    answered, and a rollout after the tool was killed."""
    from loomrl.agentic import ring_sizes

    tool = _tool(cluster, ScriptedSearch)
    agent = cluster.launch(ScriptedAgent, 1, MODEL, SAMPLING, AGENT, tool, 0, name="agent-probe")
    out = {}
    try:
        wait(tool.behave("lagged"))
        out["rows"] = rows = [it["prompt_ids"] for it in _items(2) for _ in range(4)]
        (out["samples"],) = wait(agent.probe_ring(rows, ring_sizes(len(rows)), 2))
        (out["probe_log"],) = wait(agent.tool_log())
        wait(agent.set_tool_groups(2))
        wait(agent.generate(_items(2)))
        (out["ring_log"],) = wait(agent.tool_log())
        wait(agent.set_tool_groups(1))
        wait(tool.behave("broken"))
        (out["broken"],) = wait(agent.generate(_items(1)))
        (out["broken_log"],) = wait(agent.tool_log())
        wait(tool.behave("plain"))
        wait(agent.generate(_items(1)))  # answered: no failed call in a row before the next
        wait(agent.tool_log())
        tool.kill()  # a view inside the agent cannot kill it; the driver's group can
        (out["dead"],) = wait(agent.generate(_items(1)))
        (out["dead_log"],) = wait(agent.tool_log())
    finally:
        tool.kill()
        agent.kill()
    return out


def test_a_failing_or_dead_tool_is_a_recorded_failure(default_agent):
    rolled, log = default_agent["broken"], default_agent["broken_log"]
    assert all("search failed: error" in t for t in rolled[0]["texts"])
    assert "index corrupted" in log["events"][0]["cause"]
    rolled, log = default_agent["dead"], default_agent["dead_log"]
    assert rolled[0]["tool_failures"] == [1] * 4
    assert log["events"][0]["event"] == "tool_error" and "died" in log["events"][0]["cause"]


def test_the_ring_probe_times_both_sides_and_the_planner_chooses(default_agent):
    from loomrl.agentic import plan_tool_groups

    rows, samples = default_agent["rows"], default_agent["samples"]
    # Per pass every group of every size: 1 of 8 rows, 2 of 4, 4 of 2, each rolled out
    # alone: a search turn and an answer turn, one tool call in between.
    assert samples["turns"] == [2] * 14 and samples["tool_failures"] == 0
    sizes = [m for m, _ in samples["agent"]]
    assert sizes == ([8] * 2 + [4] * 4 + [2] * 8) * 2
    assert len(samples["tool"]) == 14
    assert all(s >= 0.2 for _, s in samples["tool"])  # the tool's latency is in its calls
    log = default_agent["probe_log"]
    assert log["calls"] == 0 and log["gen_calls"] == []  # the probe's calls are its own
    # The run's rollouts log each generation call: a rollout call per question (gen_groups
    # 1) of 4 rows, cut into 2 groups of 2, each making 2 turns and 1 search.
    log = default_agent["ring_log"]
    assert [m for m, _ in log["gen_calls"]] == [2] * 8 and log["calls"] == 4
    choice = plan_tool_groups(samples, len(rows))
    # The scripted policy takes milliseconds and one tool worker answers calls one after
    # the other: every extra group is another 0.2 s call, so one group is best.
    p = choice["predicted_s"]
    assert choice["groups"] == 1 and choice["turns"] == 2
    assert sorted(p) == [1, 2, 4] and p[1] < p[2] < p[4]
    assert p[2] - p[1] >= 0.2 * 0.9


def test_tool_groups_auto_plans_k_for_the_rows_each_call_gets(cluster):
    # Probe samples as a probe of this cost would give: 0.1 s a row per turn, a 1 s search.
    ring = {
        "agent": [(m, 0.1 * m) for m in (4, 8, 20) for _ in range(2)],
        "tool": [(m, 1.0) for m in (4, 8, 20)],
        "turns": [2, 2, 2],
    }
    auto = AgentConfig(**{**AGENT.__dict__, "tool_groups": "auto"})
    sampling = SamplingConfig(group_size=4, gen_groups=5)
    tool = _tool(cluster)
    agent = cluster.launch(
        ScriptedAgent, 1, MODEL, sampling, auto, tool, 0, ring=ring, name="agent-auto"
    )
    try:
        # 20 rows a call: 2 groups of 10 hide a search (4.0 s planned against 5.0 s); 8 rows:
        # groups of 4 would wait on the one tool worker (2.8 s against 2.6 s), so k = 1.
        (rolled,) = wait(agent.generate(_items(5)))
        assert len(rolled) == 5
        (log,) = wait(agent.tool_log())
        assert log["ring_calls"] == [(20, 2)] and log["calls"] == 2
        wait(agent.generate(_items(2)))
        (log,) = wait(agent.tool_log())
        assert log["ring_calls"] == [(8, 1)] and log["calls"] == 1
        (choices,) = wait(agent.ring_choices())
        assert choices == {20: 2, 8: 1}
    finally:
        tool.kill()
        agent.kill()
    with pytest.raises(Exception, match="no probe samples were given"):
        bad = cluster.launch(ScriptedAgent, 1, MODEL, sampling, auto, tool, 0, name="agent-bad")
        wait(bad.tool_log())
