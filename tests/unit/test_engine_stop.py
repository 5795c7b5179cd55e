"""Stop strings end a response at the token that completes one, on both generation paths."""

from __future__ import annotations

import pytest
import torch

from loomrl.engines import EngineConfig, HFEngine
from loomrl.models import tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("models") / "tiny", hidden=64, layers=2, seed=0)


@pytest.mark.parametrize("impl", ["loop", "hf"])
def test_a_stop_string_cuts_where_it_first_completes(tiny_dir, impl):
    torch.set_num_threads(1)
    eng = HFEngine(EngineConfig(model=str(tiny_dir), trainable=False, generate_impl=impl))
    prompts = [eng.encode_prompt("hello"), eng.encode_prompt("a longer prompt")]
    kw = dict(max_new_tokens=40, temperature=1.0, seed=7, ignore_eos=True)
    free = eng.generate(prompts, **kw)
    texts = [eng.decode(r, skip_special_tokens=False) for r in free.response_ids]
    # A stop string taken from the middle of row 0's own text (three tokens from token 10).
    stop = eng.decode(free.response_ids[0][10:13], skip_special_tokens=False)
    cut = eng.generate(prompts, **kw, stop_strings=(stop,))
    full = free.response_ids[0]
    n = next(t + 1 for t in range(len(full)) if stop in eng.decode(full[: t + 1], False))
    assert n <= 13
    assert cut.response_ids[0] == full[:n] and cut.finish_reasons[0] == "stop"
    assert cut.response_logprobs[0] == pytest.approx(free.response_logprobs[0][:n])
    assert texts[0].startswith(eng.decode(cut.response_ids[0], False))
    # Row 1 draws the same tokens while row 0 is in the batch (after that, from a smaller one).
    assert cut.response_ids[1][:n] == free.response_ids[1][:n]
    if stop not in eng.decode(cut.response_ids[1], False):
        assert cut.finish_reasons[1] == "length" and len(cut.response_ids[1]) == 40


def test_stop_strings_need_text(tiny_dir):
    eng = HFEngine(EngineConfig(model=str(tiny_dir), trainable=False))
    with pytest.raises(ValueError, match="at least one non-empty"):
        eng.generate([eng.encode_prompt("x")], max_new_tokens=2, stop_strings=("",))
