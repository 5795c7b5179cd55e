"""Multi-turn agent rollouts: the policy writes, calls a tool, reads the result, writes on.

One rollout of B prompts runs up to ``max_turns`` generation turns. Every turn samples all rows
still open in one batch; a turn stops at ``</search>`` or ``</answer>`` (stop strings), at EOS,
or at its token budget. Rows that asked a search get the tool's results inserted as
``<information> ... </information>`` tokens and take part in the next turn; the others are done.

A response is every token after the prompt, the inserted ones included; ``response_mask`` marks
which the policy sampled (1) and which a tool wrote (0), so the trainer's loss counts only the
policy's own actions, and the log-probs of inserted tokens are 0. Token ids are kept as sampled
(never re-tokenized from text), so the trainer scores exactly the sequence the rollout saw.

``agent_rollout`` is a pure function of its callables (generate, tool, encode, decode): the
same seed, weights and tool give the same trajectories wherever the rows are split, as long as
the same rows share a call. The tool's failures (a timeout, an error, a dead tool worker) become
results the agent reads ("search failed: ..."), counted per trajectory; ``ToolCaller`` stops the
run with a ``ToolError`` when ``max_tool_failures`` calls in a row fail.

**Planning the ring.** The agent <-> tool loop is a cycle of the planner (``PLANNER.md``): each
group makes S generation calls and S - 1 tool calls (``ends_with`` the agent). With
``tool_groups: auto`` a probe worker times the rows cut into a few group counts, each group
rolled out alone (``AgentRolloutWorker.probe_ring``); ``ring_profile`` fits each side's seconds
per call over the rows of a group (a small batch costs more per row than its share of a large
one, which a plain share of the full batch misses) and ``plan_tool_groups`` lets the planner
choose k for calls of a given number of rows; each rollout rank asks it for the rows its calls
get.

This module never imports torch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from loomrl.tasks.search_qa import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    INFO_CLOSE,
    INFO_OPEN,
    SEARCH_CLOSE,
    SEARCH_OPEN,
)
from loomrl.tools import ToolError, ToolResult

AGENT, TOOL = "agent", "tool"  # component names of the agent <-> tool cycle's profile
MAX_QUERY_CHARS = 200  # a query longer than this is cut: a model can write anything in a tag
FINISHES = ("answer", "eos", "length", "turns", "budget")
PROTOCOL_TAGS = (SEARCH_OPEN, SEARCH_CLOSE, ANSWER_OPEN, ANSWER_CLOSE, INFO_OPEN, INFO_CLOSE)


@dataclass
class AgentConfig:
    max_turns: int = 3  # generation turns per response (at most max_turns - 1 searches are used)
    turn_tokens: int = 32  # new tokens per turn
    max_response_tokens: int = 192  # every turn plus the inserted results
    top_k: int = 2  # documents per search
    doc_chars: int = 300  # characters kept of each document
    # Text the response starts with (part of the prompt, not trained): "<search>" opens every
    # response with a search, which a small model otherwise rarely writes on its own.
    response_prefix: str = ""
    tool_workers: int = 1  # search worker processes (queries of one call are split over them)
    tool_timeout_s: float = 30.0  # a search call without a reply by then counts as failed
    max_tool_failures: int = 3  # failed search calls in a row that stop the run
    # Rows of a rollout call cut into this many groups taking turns: one group's search runs
    # while the others generate (worth it when the tool takes about as long as a turn).
    # "auto": time one-group rollouts at a few group sizes and let the planner choose.
    tool_groups: int | Literal["auto"] = 1
    corpus_path: str | None = None  # JSONL {"title", "text"} lines; None: the task's own corpus

    def validate(self) -> list[str]:
        p = []
        for key in ("max_turns", "turn_tokens", "max_response_tokens", "top_k", "doc_chars"):
            if getattr(self, key) < 1:
                p.append(f"{key}: must be >= 1, got {getattr(self, key)}")
        if self.max_response_tokens < self.turn_tokens:
            p.append(
                f"max_response_tokens={self.max_response_tokens} is below turn_tokens="
                f"{self.turn_tokens}: raise max_response_tokens (it bounds all turns together)"
            )
        if self.tool_workers < 1:
            p.append(f"tool_workers: must be >= 1, got {self.tool_workers}")
        if self.tool_groups != "auto" and self.tool_groups < 1:
            p.append(f"tool_groups: must be >= 1 or 'auto', got {self.tool_groups}")
        if not 0 < self.tool_timeout_s <= 86_400:
            p.append(f"tool_timeout_s: must be in (0, 86400] seconds, got {self.tool_timeout_s}")
        if self.max_tool_failures < 1:
            p.append(f"max_tool_failures: must be >= 1, got {self.max_tool_failures}")
        for tag in (SEARCH_CLOSE, ANSWER_CLOSE):
            if tag in self.response_prefix:
                # The first turn is read with the prefix: every response would search, or
                # answer, before the model wrote a word.
                p.append(
                    f"response_prefix: {self.response_prefix!r} closes {tag}; the prefix may "
                    "open a tag (e.g. '<search>') but the model must close it"
                )
        return p


@dataclass
class Trajectory:
    """One multi-turn response. ``finish``: how it ended (one of ``FINISHES``)."""

    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1 = sampled, 0 = inserted
    logprobs: list[float] = field(default_factory=list)  # 0.0 where inserted
    text: str = ""  # response_prefix + the whole response, tool results included
    searches: int = 0
    tool_failures: int = 0
    finish: str = "length"

    def add(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        self.response_ids.extend(ids)
        self.response_mask.extend([0 if logprobs is None else 1] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


def search_query(turn_text: str) -> str | None:
    """The query of a turn that wrote ``</search>``: the text after the last ``<search>`` before
    it (or all of it, when the tag was not opened); None when the turn asked no search."""
    end = turn_text.find(SEARCH_CLOSE)
    if end < 0:
        return None
    head = turn_text[:end]
    start = head.rfind(SEARCH_OPEN)
    query = head[start + len(SEARCH_OPEN) :] if start >= 0 else head
    return query.strip()[:MAX_QUERY_CHARS]


def information(result: ToolResult) -> str:
    """The text inserted after a search: the tool's results, or what went wrong. The protocol's
    tags are taken out of the results: a document holding "<answer> x </answer>" would be
    scored as the policy's answer, and one holding "</information>" would end the block."""
    body = result.text if result.ok else f"search failed: {result.status}"
    for tag in PROTOCOL_TAGS:
        body = body.replace(tag, "")
    return f"\n{INFO_OPEN} {body} {INFO_CLOSE}\n"


def _left(t: Trajectory, context: Sequence[int], cfg: AgentConfig, window: int | None) -> int:
    """Tokens ``t`` may still add: its response budget, and the model's context window past
    which its ``context`` (prompt and response so far) cannot grow."""
    left = cfg.max_response_tokens - len(t.response_ids)
    return left if window is None else min(left, window - len(context))


def _room(t: Trajectory, context: Sequence[int], cfg: AgentConfig, window: int | None) -> int:
    """Tokens a tool result may take in ``t`` and still leave one whole turn."""
    return _left(t, context, cfg, window) - cfg.turn_tokens


def agent_rollout(
    prompts: Sequence[Sequence[int]],
    *,
    generate: Callable[[list[list[int]], int, int], Any],
    submit: Callable[[list[str]], Callable[[], list[ToolResult]]],
    encode: Callable[[str], list[int]],
    decode: Callable[[Sequence[int]], str],
    cfg: AgentConfig,
    seed: int,
    window: int | None = None,
) -> list[Trajectory]:
    """Run the turns for every prompt (see the module docstring).

    generate(rows, max_new_tokens, seed) -> an object with ``response_ids``,
    ``response_logprobs`` and ``finish_reasons`` per row, stopping at ``</search>`` and
    ``</answer>``; submit(queries) starts a tool call and returns what waits for its results
    (one ToolResult per query); encode(text) -> token ids without special tokens;
    decode(ids) -> text. ``window``: the model's context window (prompt plus response); a
    row never asks for a position past it: a prompt that leaves no whole turn ends at once
    ("length"), and a search with no room left for its result and another turn ends the row
    ("budget"), as the response budget does.

    With ``cfg.tool_groups`` = k > 1 the prompts are cut into k contiguous groups that take
    turns: a group's search runs while the next groups generate, and the group waits for it
    only when its own next turn comes (a ring, as env and policy groups in embodied RL). A
    group's rows generate together; the trajectories depend on k (smaller batches, a seed per
    group and turn), not on how long the tool takes.
    """
    n = len(prompts)
    if cfg.tool_groups == "auto":
        raise ValueError("agent_rollout: tool_groups='auto' must be resolved to a count first")
    k = max(1, min(cfg.tool_groups, n))
    trajs = [Trajectory() for _ in prompts]
    contexts = [list(p) for p in prompts]
    open_rows = [list(r) for r in ring_cut(n, k)]
    pending: list[tuple[list[tuple[int, str]], Callable[[], list[ToolResult]]] | None] = [None] * k
    for turn in range(cfg.max_turns):
        for g in range(k):
            if pending[g] is not None:
                asking, results = pending[g]
                pending[g] = None
                open_rows[g] = _insert_results(
                    trajs, contexts, asking, results(), encode, cfg, window
                )
            if not open_rows[g]:
                continue
            asking = _turn(
                trajs, contexts, open_rows[g], turn, g, generate, decode, cfg, seed, window
            )
            open_rows[g] = []
            if asking:
                pending[g] = (asking, submit([q for _, q in asking]))
        if not any(pending):
            break
    for t in trajs:
        t.text = cfg.response_prefix + decode(t.response_ids)
    return trajs


def _turn(
    trajs, contexts, rows, turn, group, generate, decode, cfg, seed, window
) -> list[tuple[int, str]]:
    """One generation turn of ``rows``: record what each wrote and how it ended; return the
    rows that asked a search, with their queries."""
    if window is not None:
        # Only a prompt can leave less than a turn in the window: a result is cut to leave one.
        kept = []
        for i in rows:
            if window - len(contexts[i]) < cfg.turn_tokens:
                trajs[i].finish = "length"
            else:
                kept.append(i)
        rows = kept
        if not rows:
            return []
    budgets = {i: _left(trajs[i], contexts[i], cfg, window) for i in rows}
    out = generate(
        [contexts[i] for i in rows],
        min(cfg.turn_tokens, max(budgets.values())),
        (seed * 1_000_003 + turn + 7919 * group) & 0x7FFFFFFF,
    )
    asking: list[tuple[int, str]] = []
    for j, i in enumerate(rows):
        t = trajs[i]
        ids = list(out.response_ids[j][: budgets[i]])
        t.add(ids, list(out.response_logprobs[j][: len(ids)]))
        contexts[i].extend(ids)
        text = (cfg.response_prefix if turn == 0 else "") + decode(ids)
        query = search_query(text)
        if ANSWER_CLOSE in text and (
            query is None or text.find(ANSWER_CLOSE) < text.find(SEARCH_CLOSE)
        ):
            t.finish = "answer"
        elif query is not None and turn + 1 == cfg.max_turns:
            t.finish = "turns"  # asked, with no turn left to read the answer
        elif query is not None and _room(t, contexts[i], cfg, window) <= 0:
            t.finish = "budget"  # no tokens left for a result and another turn
        elif query is not None:
            asking.append((i, query))
        elif len(ids) >= budgets[i]:
            t.finish = "budget" if budgets[i] < cfg.turn_tokens else "length"
        else:
            t.finish = "eos" if out.finish_reasons[j] == "stop" else "length"
    return asking


def _insert_results(trajs, contexts, asking, results, encode, cfg, window) -> list[int]:
    """Insert each search's result after its row's turn; return the rows, open again."""
    rows = []
    for (i, _), res in zip(asking, results, strict=True):
        t = trajs[i]
        t.searches += 1
        t.tool_failures += not res.ok
        # Cut to leave the next turn its tokens (the closing tag may go: the model still reads).
        info = encode(information(res))[: _room(t, contexts[i], cfg, window)]
        t.add(info, None)
        contexts[i].extend(info)
        rows.append(i)
    return rows


class ToolCaller:
    """Calls a search worker group with a deadline and turns failures into results.

    A call that gets no reply within ``timeout_s``, raises, or finds its worker dead gives every
    query a failed ``ToolResult`` (status "timeout" or "error") and is counted in ``events``;
    ``max_failures`` failed calls in a row raise ``ToolError`` naming the last cause. Queries are
    split over the group's ranks in contiguous chunks.
    """

    def __init__(self, group: Any, timeout_s: float, max_failures: int):
        self.group, self.timeout_s, self.max_failures = group, timeout_s, max_failures
        self.failures_in_row = 0
        self.events: list[dict[str, Any]] = []
        self.calls = 0
        self.wait_s = 0.0  # seconds the rollout sat waiting for results

    def submit(self, queries: list[str]) -> Callable[[], list[ToolResult]]:
        """Start a search of ``queries``; the returned callable waits for its results, at most
        until ``timeout_s`` after this call."""
        self.calls += 1
        start = time.perf_counter()
        handle = self.group.search(queries)

        def results() -> list[ToolResult]:
            return self._collect(handle, queries, start)

        return results

    def _collect(self, handle: Any, queries: list[str], start: float) -> list[ToolResult]:
        from loomrl.errors import RemoteError, WorkerDiedError
        from loomrl.worker import wait

        t0 = time.perf_counter()
        try:
            left = max(0.0, self.timeout_s - (t0 - start))
            results, cause = _joined(wait(handle, timeout=left), len(queries))
            status = "error" if cause else "ok"
        except TimeoutError:
            status, cause = "timeout", f"no reply within tool_timeout_s={self.timeout_s:g}"
            _cancel(handle)
        except (RemoteError, WorkerDiedError) as e:
            status, cause = "error", str(e).splitlines()[0]
        self.wait_s += time.perf_counter() - t0  # blocked: what ring groups are there to hide
        if status == "ok":
            self.failures_in_row = 0
            return results
        self.failures_in_row += 1
        self.events.append(
            {
                "event": f"tool_{status}",
                "queries": len(queries),
                "cause": cause,
                "time": time.time(),
            }
        )
        if self.failures_in_row >= self.max_failures:
            raise ToolError(
                f"the search tool failed {self.failures_in_row} calls in a row (last: {cause}); "
                "check the tool workers, or raise agent.tool_timeout_s / agent.max_tool_failures"
            )
        return [ToolResult(f"search failed: {status}", status) for _ in queries]


def _joined(parts: list[Any], asked: int) -> tuple[list[ToolResult], str]:
    """The ranks' replies to ``asked`` queries as one list, and what is wrong with them ("" when
    nothing): the rollout inserts one result per query and reads its ``text`` and ``status``,
    so a reply of another shape is a failed call, not a crash of the rollout."""
    for part in parts:
        if not isinstance(part, (list, tuple)):
            return (
                [],
                f"the tool returned {type(part).__name__} {part!r:.80}, not a list of results",
            )
    results = [r for part in parts for r in part]
    if len(results) != asked:
        return [], f"the tool returned {len(results)} result(s) for {asked} queries"
    for r in results:
        if not (isinstance(r, ToolResult) and isinstance(r.text, str)):
            return [], f"the tool returned {type(r).__name__} {r!r:.80}, not a ToolResult"
    return results, ""


def _cancel(handle: Any) -> None:
    """Drop a call given up on where it has not started (Ray cannot stop a running call of a
    threaded actor: that one ends by itself, beside the next calls)."""
    import contextlib

    import ray

    for ref in handle.refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref)


def ring_cut(rows: int, k: int) -> list[range]:
    """The rows of a rollout call cut into k ring groups, in order and as even as rows allow."""
    return [range(g * rows // k, (g + 1) * rows // k) for g in range(k)]


def ring_sizes(rows: int, most_groups: int = 4) -> list[int]:
    """Group sizes a probe times for a rollout call of ``rows`` rows: rows / k for k = 1 ..
    ``most_groups`` dividing rows, largest first."""
    return [rows // k for k in range(1, min(most_groups, rows) + 1) if rows % k == 0]


def ring_profile(samples: dict[str, list], rows: int) -> Any:
    """The workload profile of one rollout call of ``rows`` rows as the cycle agent <-> tool.

    ``samples`` (``AgentRolloutWorker.probe_ring``): ``agent`` and ``tool`` as (group rows,
    seconds per call), ``turns`` as generation calls per rollout. Each side's cost is a line
    fitted over the group sizes (the agent's through its mean call per size); the cycle runs
    the median number of turns and ends with the agent. The agent holds the device; the tool
    runs on host cores beside it (0 devices), in its own process. Ring groups are kept at or
    above the smallest size probed.
    """
    from loomrl.plan import load_profile
    from loomrl.plan.profile import fit_line

    problems = [f"samples[{key!r}] is empty" for key in (AGENT, "turns") if not samples.get(key)]
    if problems:
        raise ValueError(f"ring_profile: {'; '.join(problems)} (a probe of no rollouts)")
    turns = max(1, round(statistics.median(samples["turns"])))
    # The mean call per group size, not fit_line's median: a rollout's turns differ (a later
    # one reads a longer context) and the ring's agent time is the sum of all of its calls.
    by_m: dict[int, list[float]] = {}
    for m, x in samples[AGENT]:
        by_m.setdefault(int(m), []).append(float(x))
    a_alpha, a_per = fit_line([(m, statistics.fmean(xs)) for m, xs in by_m.items()])
    # No tool call in any probe rollout (every row answered at once): the tool costs nothing.
    t_alpha, t_per = fit_line(samples[TOOL]) if samples.get(TOOL) else (0.0, 0.0)
    tiny = 0.01  # GB: the choice of k does not depend on memory
    return load_profile(
        {
            "devices": 1,
            "device_memory_gb": 1000.0,
            "batch": rows,
            "granularities": [rows],
            "components": {
                AGENT: {
                    "valid_devices": [1],
                    "time": {"alpha": a_alpha, "per_item": {1: a_per}},
                    "memory_gb": tiny,
                },
                TOOL: {
                    "valid_devices": [0],
                    "time": {"alpha": t_alpha, "per_item": {0: t_per}},
                    "memory_gb": tiny,
                },
            },
            "edges": [[AGENT, TOOL], [TOOL, AGENT]],
            "cycles": [
                {
                    "members": [AGENT, TOOL],
                    "steps": turns,
                    "ends_with": AGENT,
                    "min_group": min(int(x) for x, _ in samples[AGENT]),
                }
            ],
        }
    )


def plan_tool_groups(samples: dict[str, list], rows: int) -> dict[str, Any]:
    """The planner's choice of ``tool_groups`` for rollout calls of ``rows`` rows: ``groups``
    (k), ``predicted_s`` per k it may use (seconds per rollout call), ``turns`` and the
    ``profile`` it planned on."""
    from loomrl.plan import cycle, fixed_plan, search

    prof = ring_profile(samples, rows)
    cyc = prof.cycles[0]
    predicted = {
        k: fixed_plan(prof, cycle(AGENT, TOOL, 1, split=(1, 0), groups=k), rows).predicted_s
        for k in cyc.group_counts(rows)
    }
    best = search(prof)
    return {
        "groups": int(best.tree.groups),
        "predicted_s": predicted,
        "turns": cyc.steps,
        "profile": prof.to_dict(),
    }
