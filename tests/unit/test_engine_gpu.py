"""HFEngine on a CUDA device (bf16 compute): run with a GPU, skipped elsewhere."""

from __future__ import annotations

import pytest
import torch

from loomrl.engines import EngineConfig, HFEngine
from loomrl.models import tiny_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("gpu") / "tiny", hidden=128, layers=2)


def _loss(logp, mb):
    m = mb["mask"]
    return -(logp * m).sum() / m.sum(), {}


@pytest.mark.parametrize("impl", ["loop", "hf", "hf_static"])
def test_gpu_generate_logprobs_consistent(tiny_dir, impl):
    eng = HFEngine(EngineConfig(model=str(tiny_dir), trainable=False, generate_impl=impl))
    assert eng.device.type == "cuda" and eng.compute_dtype == torch.bfloat16
    prompts = [eng.encode_prompt("hi"), eng.encode_prompt("what is 2+3?")]
    out = eng.generate(prompts, max_new_tokens=16, seed=0)
    again = eng.generate(prompts, max_new_tokens=16, seed=0)
    assert again.response_ids == out.response_ids
    rec = eng.logprobs(prompts, out.response_ids)
    for got, want in zip(rec, out.response_logprobs, strict=True):
        # bf16 compute: batched decode and full recompute round differently.
        assert (got - torch.tensor(want)).abs().mean() < 0.05


def test_gpu_train_offload_roundtrip(tiny_dir):
    eng = HFEngine(EngineConfig(model=str(tiny_dir), lr=1e-3))
    assert eng.param_dtype == torch.float32
    batch = {"prompt_ids": [[1, 5, 6], [1, 7]], "response_ids": [[8, 9, 10], [11, 12]]}
    stats = eng.train_step(batch, _loss)
    assert stats["grad_norm"] > 0
    h = eng.param_sha256()
    used = torch.cuda.memory_allocated()
    eng.offload()
    assert torch.cuda.memory_allocated() < used
    eng.onload()
    assert eng.param_sha256() == h
    assert next(eng.model.parameters()).device.type == "cuda"
    eng.train_step(batch, _loss)


@pytest.mark.parametrize("impl", ["loop", "hf", "hf_static"])
def test_gpu_stop_strings_cut_where_the_string_completes(tiny_dir, impl):
    eng = HFEngine(EngineConfig(model=str(tiny_dir), trainable=False, generate_impl=impl))
    prompts = [eng.encode_prompt("hi")]
    kw = dict(max_new_tokens=32, seed=3, ignore_eos=True)
    free = eng.generate(prompts, **kw).response_ids[0]
    stop = eng.decode(free[8:11], skip_special_tokens=False)
    cut = eng.generate(prompts, **kw, stop_strings=(stop,))
    n = next(t + 1 for t in range(len(free)) if stop in eng.decode(free[: t + 1], False))
    assert cut.response_ids[0] == free[:n] and cut.finish_reasons == ["stop"]
