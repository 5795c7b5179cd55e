"""A prompt plus its response budget past the model's context window: refused with the key, the
window and the fix (engine, recipe start), or ended cleanly where a multi-turn context grows."""

from __future__ import annotations

import json

import pytest

from loomrl.errors import ConfigError
from loomrl.models import context_window, tiny_model


def _shrink_window(directory, positions: int):
    """The tiny model with a window of ``positions`` (its weights do not depend on it)."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config["max_position_embeddings"] = positions
    path.write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def small_window(tmp_path_factory):
    return _shrink_window(tiny_model(tmp_path_factory.mktemp("models") / "tiny", layers=1), 64)


def test_the_window_is_read_from_whichever_key_the_architecture_uses():
    assert context_window({"max_position_embeddings": 2048, "n_positions": 7}) == 2048
    assert context_window({"n_positions": 1024}) == 1024
    assert context_window({"text_config": {"max_position_embeddings": 512}}) == 512
    assert context_window({"hidden_size": 8}) is None


@pytest.mark.parametrize("impl", ["loop", "hf"])
def test_generation_past_the_window_is_refused_naming_the_fix(small_window, impl):
    from loomrl.engines import EngineConfig, HFEngine

    eng = HFEngine(EngineConfig(model=str(small_window), trainable=False, generate_impl=impl))
    assert eng.context_window == 64
    prompt = eng.encode_prompt("x" * 20)  # a RoPE model would sample on past 64 silently
    n = len(prompt)
    with pytest.raises(
        ConfigError, match=rf"max_new_tokens=64 .*\({n} tokens\).* 64 .*at most {64 - n}"
    ):
        eng.generate([prompt], max_new_tokens=64, seed=0)
    out = eng.generate([prompt], max_new_tokens=64 - n, seed=0, ignore_eos=True)
    assert len(out.response_ids[0]) == 64 - n


def test_a_growing_agent_context_ends_at_the_window_instead_of_passing_it():
    from types import SimpleNamespace

    from loomrl.agentic import AgentConfig, agent_rollout, information
    from loomrl.tools import ToolResult

    window = 50
    turns = {"P": ["abcdefgh </search>", "<answer> y </answer>"], "L" * 40: ["never"]}

    said = dict.fromkeys(turns, 0)

    def generate(rows, max_new, seed):  # one character a token; refuses as the engine does
        assert all(len(r) + max_new <= window for r in rows), "asked past the window"
        out = []
        for r in rows:
            prompt = "".join(map(chr, r)).split("|")[0]
            out.append([ord(c) for c in turns[prompt][said[prompt]][:max_new]])
            said[prompt] += 1
        return SimpleNamespace(
            response_ids=out,
            response_logprobs=[[-0.5] * len(x) for x in out],
            finish_reasons=["stop"] * len(out),
        )

    cfg = AgentConfig(max_turns=3, turn_tokens=18, max_response_tokens=400)
    prompts = [[ord(c) for c in f"{p}|"] for p in turns]
    p, long = agent_rollout(
        prompts,
        generate=generate,
        submit=lambda qs: lambda: [ToolResult(f"R({q})") for q in qs],
        encode=lambda text: [ord(c) for c in text],
        decode=lambda ids: "".join(map(chr, ids)),
        cfg=cfg,
        seed=0,
        window=window,
    )
    # The result is cut to leave the last turn its 18 tokens: 50 - 2 - 18 - 18 = 12.
    assert p.searches == 1 and p.response_mask == [1] * 18 + [0] * 12 + [1] * 18
    assert "".join(map(chr, p.response_ids[18:30])) == information(ToolResult("R(abcdefgh)"))[:12]
    assert len(prompts[0]) + len(p.response_ids) == window
    # A prompt that leaves less than one turn ends before it generates.
    assert (long.finish, long.response_ids) == ("length", [])


def test_the_recipes_refuse_a_budget_the_longest_jsonl_prompt_leaves_no_room_for(tmp_path):
    from loomrl.reasoning import Encoder, check_context
    from loomrl.tasks import make_task

    data = tmp_path / "d.jsonl"
    rows = [{"prompt": "1+1", "answer": "2"}] * 9 + [{"prompt": "y" * 30, "answer": "3"}]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    task = make_task("jsonl", path=str(data), eval_fraction=0.01)
    model = _shrink_window(tiny_model(tmp_path / "m", layers=1), 200)
    encode = Encoder(str(model), instruction="direct")
    assert encode.window == 200
    longest = len(encode("y" * 30))
    assert longest > len(encode("1+1"))
    budgets = {"sampling.max_new_tokens": 201 - longest, "sampling.eval_max_new_tokens": 8}
    with pytest.raises(
        ConfigError,
        match=rf"sampling.max_new_tokens={201 - longest}: .*\({longest} tokens\).*window of 200.*at most {200 - longest}",
    ) as e:
        check_context(task, encode, budgets)
    assert len(e.value.problems) == 1  # eval_max_new_tokens fits
    check_context(task, encode, {"sampling.max_new_tokens": 200 - longest})
