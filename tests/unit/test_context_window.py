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
