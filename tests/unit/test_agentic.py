"""Multi-turn agent rollouts on a scripted policy (characters as tokens): turns, tool calls,
masks, budgets and failures, checked by hand."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from loomrl.agentic import AgentConfig, agent_rollout, information, search_query
from loomrl.tools import ToolResult


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids) -> str:
    return "".join(chr(i) for i in ids)


@dataclass
class Out:
    response_ids: list
    response_logprobs: list
    finish_reasons: list


class Scripted:
    """Row r's turn t writes SCRIPT[prompt][t], cut like the engine: after the first stop
    string, or at max_new tokens; a script line that ends first ends at EOS."""

    STOPS = ("</search>", "</answer>")

    def __init__(self, scripts: dict[str, list[str]]):
        self.scripts, self.calls, self.turns = scripts, [], dict.fromkeys(scripts, 0)

    def __call__(self, rows, max_new, seed):
        self.calls.append((len(rows), max_new, seed))
        ids, lps, reasons = [], [], []
        for row in rows:
            text = decode(row)
            prompt = text.split("|", 1)[0]
            line = self.scripts[prompt][self.turns[prompt]]
            self.turns[prompt] += 1
            cut, reason = len(line), "stop"
            for s in self.STOPS:
                k = line.find(s)
                if k >= 0 and k + len(s) <= cut:
                    cut = k + len(s)
            if cut > max_new:
                cut, reason = max_new, "length"
            ids.append(encode(line[:cut]))
            lps.append([-0.5] * cut)
            reasons.append(reason)
        return Out(ids, lps, reasons)


class Tool:
    def __init__(self, status: str = "ok"):
        self.queries, self.status = [], status

    def __call__(self, queries):
        self.queries.append(list(queries))
        return [ToolResult(f"R({q})", self.status) for q in queries]


def _run(scripts, cfg, tool=None, seed=1):
    gen, tool = Scripted(scripts), tool or Tool()
    prompts = [encode(f"{p}|") for p in scripts]
    out = agent_rollout(
        prompts, generate=gen, tool=tool, encode=encode, decode=decode, cfg=cfg, seed=seed
    )
    return out, gen, tool


CFG = AgentConfig(max_turns=3, turn_tokens=40, max_response_tokens=400, response_prefix="<search>")


def test_search_then_answer_masks_the_inserted_result():
    first, answer = " Ann Lee </search>", "<answer> Drun </answer> more"
    (t,), gen, tool = _run({"P": [first, answer]}, CFG)
    assert tool.queries == [["Ann Lee"]]
    info = information(ToolResult("R(Ann Lee)"))
    assert info == "\n<information> R(Ann Lee) </information>\n"
    said = "<answer> Drun </answer>"  # the turn ends at the stop string
    assert decode(t.response_ids) == first + info + said
    assert t.response_mask == [1] * len(first) + [0] * len(info) + [1] * len(said)
    assert t.logprobs == [-0.5] * len(first) + [0.0] * len(info) + [-0.5] * len(said)
    assert t.text == "<search>" + first + info + said
    assert (t.searches, t.tool_failures, t.finish) == (1, 0, "answer")
    # One generate call per turn, each with its own seed.
    assert [c[0] for c in gen.calls] == [1, 1] and gen.calls[0][2] != gen.calls[1][2]


def test_rows_end_their_own_way_and_only_searchers_continue():
    scripts = {
        "A": ["<answer> x </answer>"],  # answers at once (the prefix's search left unclosed)
        "B": ["q1 </search>", "q2 </search>", "q3 </search>"],  # searches every turn
        "C": ["rambling on and on and on and on and on and on"],  # no tag, runs out
        "D": ["short"],  # ends at EOS
    }
    cfg = AgentConfig(max_turns=3, turn_tokens=20, max_response_tokens=400, response_prefix="")
    (a, b, c, d), gen, tool = _run(scripts, cfg)
    assert (a.finish, c.finish, d.finish) == ("answer", "length", "eos")
    # B searched in turns 1 and 2; its third search has no turn left to read the result.
    assert (b.searches, b.finish) == (2, "turns")
    assert tool.queries == [["q1"], ["q2"]]
    assert [n for n, _, _ in gen.calls] == [4, 1, 1]
    assert len(c.response_ids) == 20 and sum(c.response_mask) == 20


def test_the_response_budget_bounds_turns_and_results():
    # 20 tokens of search, then a result cut to leave the next turn its 10 tokens.
    cfg = AgentConfig(max_turns=3, turn_tokens=10, max_response_tokens=45, response_prefix="")
    scripts = {"P": ["abcdefgh </search>", "<answer> y </answer>"]}
    (t,), _, _ = _run(scripts, cfg)
    first = "abcdefgh </search>"[:10]  # the turn's 10 tokens end before the closing tag
    assert decode(t.response_ids) == first and t.finish == "length" and t.searches == 0
    cfg = AgentConfig(max_turns=3, turn_tokens=18, max_response_tokens=45, response_prefix="")
    (t,), _, _ = _run(scripts, cfg)
    # The result is cut to what leaves the next turn its 18 tokens: 45 - 18 - 18 = 9.
    assert t.searches == 1 and len(t.response_ids) == 45
    assert t.response_mask == [1] * 18 + [0] * 9 + [1] * 18
    assert decode(t.response_ids[18:27]) == information(ToolResult("R(abcdefgh)"))[:9]
    assert t.finish == "length"  # "<answer> y </answer>" is 20 tokens
    # No room for a result and another turn: the tool is not called.
    cfg = AgentConfig(max_turns=3, turn_tokens=18, max_response_tokens=30, response_prefix="")
    (t,), _, tool = _run(scripts, cfg)
    assert (t.searches, t.finish, len(t.response_ids), tool.queries) == (0, "budget", 18, [])


def test_a_failed_search_is_read_as_a_failure():
    (t,), _, tool = _run({"P": [" who </search>", "<answer> ? </answer>"]}, CFG, Tool("timeout"))
    assert t.tool_failures == 1 and t.searches == 1
    assert "<information> search failed: timeout </information>" in t.text


def test_same_inputs_same_trajectories():
    scripts = {"A": [" a </search>", "<answer> 1 </answer>"], "B": ["<answer> 2 </answer>"]}
    one, _, _ = _run(scripts, CFG, seed=5)
    two, _, _ = _run(scripts, CFG, seed=5)
    assert one == two


@pytest.mark.parametrize(
    "turn, query",
    [
        ("<search> Ann Lee </search>", "Ann Lee"),
        ("think first <search>x</search>", "x"),
        ("no open tag </search>", "no open tag"),
        ("<search> a </search> <search> b </search>", "a"),
        ("<answer> z </answer>", None),
        ("<search> " + "w" * 500 + " </search>", "w" * 200),
    ],
)
def test_the_query_is_the_text_in_the_first_search_tag(turn, query):
    assert search_query(turn) == query


def test_agent_config_reports_every_problem():
    p = AgentConfig(
        max_turns=0, turn_tokens=64, max_response_tokens=32, tool_timeout_s=0, max_tool_failures=0
    ).validate()
    text = "\n".join(p)
    assert "max_turns: must be >= 1" in text and "max_response_tokens=32" in text
    assert "tool_timeout_s" in text and "max_tool_failures" in text


@pytest.mark.parametrize(
    "workers, available, want", [(1, 2, 2), (2, 2, 2), (3, 2, 1), (3, 8, 6), (4, 8, 8), (5, 1, 1)]
)
def test_search_workers_spread_over_devices_they_split_evenly(workers, available, want):
    from loomrl.recipes.agentic_search import tool_devices

    assert tool_devices(workers, available) == want
