"""A Hugging Face causal-LM engine: batched sampling, log-probs, training steps, weight sync.

One ``HFEngine`` owns one model (and, when trainable, its AdamW optimizer) on one device, or
sharded over a process group with FSDP2 when several GPUs form the group. Workers wrap it;
the algorithm code supplies the loss function. ``HFValueEngine`` is the same engine with a
scalar value head instead of the LM head (the PPO critic).

Conventions shared by every method:
  * a sample is a prompt (list of token ids, at least one) plus a response (list of ids);
  * per-token outputs refer to response tokens: entry t belongs to response token t and is
    computed from the position just before it (prompt_len + t - 1);
  * rollout log-probs are ``log_softmax(logits / temperature)`` of the sampled token, without
    top-p/top-k renormalisation (see ``loomrl.engines.sampling``); ``logprobs()`` computes the
    same quantity, so at temperature 1.0 both agree up to float rounding.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from loomrl.engines import offload as _offload
from loomrl.engines.batching import (
    distinct_rows,
    left_pad,
    pack_prompt_response,
    plan_micro_batches,
    right_pad,
    slice_batch,
)
from loomrl.engines.sampling import StopText, entropy_from_logits, sample_tokens, token_logprobs
from loomrl.errors import ConfigError, LoomError

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
_STATE_FILE = "engine_state.pt"
_VALUE_HEAD_FILE = "value_head.safetensors"


@dataclass
class EngineConfig:
    """Settings of one engine. ``model`` is anything ``loomrl.models.resolve_model`` accepts."""

    model: str
    dtype: str = "auto"  # compute dtype: "auto" = bfloat16 on GPU, float32 on CPU
    param_dtype: str = "auto"  # stored weights: "auto" = float32 when trainable, else dtype
    device: str = "auto"  # "auto" = the current CUDA device when there is one, else "cpu"
    trainable: bool = True  # False: no optimizer (reference / rollout-only engines)
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0  # max global grad norm; None = no clipping
    warmup_steps: int = 0  # linear warm-up from 0 to lr over this many steps
    micro_batch_size: int | None = 4  # rows per micro-batch (None: only micro_batch_tokens)
    micro_batch_tokens: int | None = None  # padded-token budget per micro-batch
    loss_scale: str = "tokens"  # how micro-batch losses combine: "tokens" | "sequences" | "sum"
    seed: int = 0
    gradient_checkpointing: bool = False
    # Rows that share a prompt (a prompt group's responses) compute it once when scored/trained.
    # None: on CPU engines only (on one H200 the two shorter passes measured slower than one).
    share_prompts: bool | None = None
    compile: bool = False  # torch.compile the forward (pays off on GPU with stable shapes)
    attn_implementation: str = "sdpa"  # "sdpa" | "eager" | "flash_attention_2"
    # "auto": "hf_static" on a single GPU, else "loop". "loop": own KV-cache loop (fastest on
    # CPU). "hf": transformers' generate. "hf_static": generate with a static KV cache, which
    # transformers compiles on GPU (5x faster there; recompiles per new batch/length shape).
    generate_impl: str = "auto"
    value_head: bool = False  # True: a critic with a scalar value head
    offload_dir: str | None = None  # where CPU-only offload parks tensors (default: temp dir)
    # CPU-only offload: "keep" leaves tensors in RAM (host memory is where offloaded state would
    # go anyway, so this costs nothing); "disk" parks them in a file so RSS really drops.
    cpu_offload: str = "keep"
    cache_dir: str | None = None  # converted-model cache (default ~/.cache/loomrl/models)
    num_threads: int | None = None  # torch intra-op threads on CPU (None: torch's default)
    # An update whose gradient norm is not finite is skipped (weights kept); this many in a row
    # end training with an error, as the run has diverged rather than met one bad batch.
    max_nonfinite_updates: int = 3

    def validate(self) -> None:
        problems = []
        if self.share_prompts not in (None, True, False):
            problems.append(
                f"share_prompts={self.share_prompts!r}: use true, false, or leave it unset (CPU only)"
            )
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            problems.append(f"dtype={self.dtype!r}: use 'auto' or one of {sorted(_DTYPES)}")
        if self.param_dtype != "auto" and self.param_dtype not in _DTYPES:
            problems.append(
                f"param_dtype={self.param_dtype!r}: use 'auto' or one of {sorted(_DTYPES)}"
            )
        if self.lr < 0:
            problems.append(f"lr={self.lr}: must be >= 0")
        if self.max_nonfinite_updates < 1:
            problems.append(
                f"max_nonfinite_updates={self.max_nonfinite_updates}: must be >= 1 (updates with "
                "non-finite gradients in a row before training stops)"
            )
        if self.grad_clip is not None and self.grad_clip <= 0:
            problems.append(f"grad_clip={self.grad_clip}: must be > 0, or None to disable clipping")
        if self.micro_batch_size is None and self.micro_batch_tokens is None:
            problems.append(
                "micro_batch_size and micro_batch_tokens are both None: set at least one"
            )
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            problems.append(f"micro_batch_size={self.micro_batch_size}: must be >= 1")
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            problems.append(f"micro_batch_tokens={self.micro_batch_tokens}: must be >= 1")
        if self.loss_scale not in ("tokens", "sequences", "sum"):
            problems.append(f"loss_scale={self.loss_scale!r}: use 'tokens', 'sequences' or 'sum'")
        if self.attn_implementation not in ("sdpa", "eager", "flash_attention_2"):
            problems.append(
                f"attn_implementation={self.attn_implementation!r}: use 'sdpa', 'eager' or 'flash_attention_2'"
            )
        if self.cpu_offload not in ("keep", "disk"):
            problems.append(f"cpu_offload={self.cpu_offload!r}: use 'keep' or 'disk'")
        if self.generate_impl not in ("auto", "loop", "hf", "hf_static"):
            problems.append(
                f"generate_impl={self.generate_impl!r}: use 'auto', 'loop', 'hf' or 'hf_static'"
            )
        if self.warmup_steps < 0:
            problems.append(f"warmup_steps={self.warmup_steps}: must be >= 0")
        if problems:
            raise ConfigError(problems, source="EngineConfig")


@dataclass
class GenerationOutput:
    """Result of ``HFEngine.generate`` for B prompts, in prompt order.

    response_ids[i]: sampled tokens, including the stop token when one ended the response.
    response_logprobs[i]: log softmax(logits / temperature) of each sampled token.
    finish_reasons[i]: "stop" (a stop token was sampled, or a stop string completed) or "length"
    (max_new_tokens reached).
    num_tokens: total sampled tokens. version: weight version that produced them.
    """

    response_ids: list[list[int]]
    response_logprobs: list[list[float]]
    finish_reasons: list[str]
    num_tokens: int
    version: int = 0
    time_s: float = 0.0


class _Net(nn.Module):
    """Root module: the HF causal LM plus an optional value head, one forward for every use.

    Everything goes through this module's forward so that, under FSDP2, the root's hooks
    gather the root-level parameters (embeddings, final norm, heads) for every call.
    """

    def __init__(self, lm: nn.Module, value_head: nn.Module | None):
        super().__init__()
        self.lm = lm
        self.value_head = value_head

    def forward(self, mode: str, **kw):
        if mode == "lm":
            return self.lm(**kw)
        if mode == "shared":
            return self._head(self._shared_prefix_hidden(**kw))
        # mode "response": hidden states at the positions that predict each response token.
        hidden = self.lm.get_decoder()(
            input_ids=kw["input_ids"], attention_mask=kw["attention_mask"], use_cache=False
        ).last_hidden_state  # [b, L, H]
        gather = kw["gather"]  # [b, T]
        h = hidden.gather(1, gather.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))  # [b, T, H]
        return self._head(h)

    def _head(self, h):
        if self.value_head is not None:
            return self.value_head(h).squeeze(-1)  # [b, T]
        return self.lm.get_output_embeddings()(h)  # [b, T, V]

    def _shared_prefix_hidden(
        self, prompt_ids, prompt_mask, prompt_pos, rows, resp_ids, mask, resp_pos
    ):
        """Hidden states predicting each response token when rows share prompts.

        The distinct prompts (left-padded, [k, P]) go through the decoder once; their KV cache
        is copied to the b rows that use them (``rows``: row -> prompt, differentiable, so the
        gradients of all rows flow back into the shared prompt pass); the right-padded
        responses ([b, R]) then attend to it. Position t of the result predicts response token t:
        the prompt's last state for t = 0, the response's state t - 1 after that.
        """
        dec = self.lm.get_decoder()
        first = dec(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=prompt_pos,
            use_cache=True,
        )
        cache = _cache_of(first)
        select_cache_rows(cache, rows)
        last = first.last_hidden_state[:, -1:, :].index_select(0, rows)  # [b, 1, H]
        second = dec(
            input_ids=resp_ids,
            attention_mask=mask,
            position_ids=resp_pos,
            use_cache=True,
            **{_cache_kwarg(dec): cache},
        )
        return torch.cat([last, second.last_hidden_state[:, :-1, :]], dim=1)  # [b, R, H]


def select_cache_rows(cache: Any, rows: torch.Tensor) -> None:
    """Make ``cache`` hold, for each of the b rows, the keys and values of prompt ``rows[i]``
    (differentiably: the rows' gradients add up in the prompt's pass).

    On a CPU by ``index_select`` (the cache's ``reorder_cache``), whose backward adds the rows
    one after another. ``batch_select_indices`` indexes (``keys[rows, ...]``), and the backward
    of that, an accumulating ``index_put_``, adds rows that share a prompt from several threads
    in whichever order they come: with 2 threads, 29 of 30 backward passes over one prompt's keys
    shared by 8 rows gave other last bits, and Adam's first step turns such bits into different
    weights (the GRPO example's runs parted at step 2). torch's notes on determinism list both:
    indexing's backward as nondeterministic on a CPU, ``index_add`` (``index_select``'s
    backward) on CUDA; so on CUDA indexing stays."""
    if rows.device.type == "cpu":
        cache.reorder_cache(rows)
    else:
        cache.batch_select_indices(rows)


def _fsdp_wanted(device: torch.device) -> bool:
    """FSDP2 only when a process group of several ranks drives CUDA devices."""
    import torch.distributed as dist

    return (
        device.type == "cuda"
        and dist.is_available()
        and dist.is_initialized()
        and dist.get_world_size() > 1
    )


def _cache_kwarg(model: nn.Module) -> str:
    """Name of the KV-cache argument: ``cache`` in recent transformers, ``past_key_values`` before."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(out) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly FSDP-sharded DTensor) parameter; a collective when sharded."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class HFEngine:
    """A causal LM engine. See the module docstring for conventions.

    >>> eng = HFEngine(EngineConfig(model="smollm2-135m-instruct", lr=1e-6))
    >>> out = eng.generate([eng.encode_prompt("What is 2 + 3?")], max_new_tokens=16, seed=0)
    """

    is_value_model = False

    def __init__(self, config: EngineConfig | Mapping[str, Any] | str, **overrides):
        if isinstance(config, str):
            config = EngineConfig(model=config)
        elif isinstance(config, Mapping):
            config = EngineConfig(**config)
        if overrides:
            config = dataclasses.replace(config, **overrides)
        if type(self).is_value_model and not config.value_head:
            config = dataclasses.replace(config, value_head=True)
        config.validate()
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.device = self._pick_device(config.device)
        on_gpu = self.device.type == "cuda"
        self.compute_dtype = (
            (torch.bfloat16 if on_gpu else torch.float32)
            if config.dtype == "auto"
            else _DTYPES[config.dtype]
        )
        if config.param_dtype == "auto":
            self.param_dtype = torch.float32 if config.trainable else self.compute_dtype
        else:
            self.param_dtype = _DTYPES[config.param_dtype]

        from loomrl.models import resolve_model

        self.model_dir = resolve_model(config.model, cache_dir=config.cache_dir)
        self.model, self.tokenizer = self._load(self.model_dir)
        value_head = None
        if config.value_head:
            hidden = self.model.config.hidden_size
            gen = torch.Generator().manual_seed(config.seed)
            value_head = nn.Linear(hidden, 1, bias=True)
            with torch.no_grad():
                # Small init: the critic starts near 0 instead of at random large values.
                value_head.weight.copy_(torch.randn(1, hidden, generator=gen) / (hidden**0.5) * 0.1)
                value_head.bias.zero_()
            value_head.to(self.param_dtype)
        self.net = _Net(self.model, value_head).to(self.device)
        self.fsdp = _fsdp_wanted(self.device)
        if self.fsdp:
            self._apply_fsdp()
        self._forward = torch.compile(self.net, dynamic=True) if config.compile else self.net

        self.pad_id, self.eos_ids = self._special_ids()
        self._cache_kw = _cache_kwarg(self.model)
        self.optimizer = self._make_optimizer() if config.trainable else None
        self.step = 0
        self.version = 0
        self.nonfinite_in_a_row = 0  # not checkpointed: a resume counts afresh
        self._gen_calls = 0
        self._offloaded: str | None = None  # None | "host" | "disk"
        self._stash = None

    # ------------------------------------------------------------------ construction

    @staticmethod
    def _pick_device(spec: str) -> torch.device:
        if spec == "auto":
            if torch.cuda.is_available():
                return torch.device("cuda", torch.cuda.current_device())
            return torch.device("cpu")
        dev = torch.device(spec)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                f"device={spec!r} but CUDA is not available here; use 'auto' or 'cpu'"
            )
        return dev

    def _load(self, directory: Path):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        cfg = AutoConfig.from_pretrained(str(directory))
        # RL needs the same function at rollout and at training: no dropout anywhere.
        for name in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop"):
            if isinstance(getattr(cfg, name, None), float):
                setattr(cfg, name, 0.0)
        attn = self.config.attn_implementation
        if attn == "flash_attention_2" and self.device.type != "cuda":
            attn = "sdpa"
        model = AutoModelForCausalLM.from_pretrained(
            str(directory), config=cfg, dtype=self.param_dtype, attn_implementation=attn
        )
        if self.config.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        model.eval()
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(directory))
        except (OSError, ValueError, TypeError):
            tokenizer = None
        return model, tokenizer

    def _special_ids(self) -> tuple[int, set[int]]:
        eos: set[int] = set()
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        for src in (gen_eos, self.model.config.eos_token_id):
            if isinstance(src, int):
                eos.add(src)
            elif isinstance(src, (list, tuple)):
                eos.update(int(x) for x in src)
        tok = self.tokenizer
        if tok is not None and tok.eos_token_id is not None:
            eos.add(int(tok.eos_token_id))
        pad = None
        if tok is not None and tok.pad_token_id is not None:
            pad = tok.pad_token_id
        if pad is None:
            pad = self.model.config.pad_token_id
        if pad is None:
            pad = min(eos) if eos else 0
        return int(pad), eos

    def _make_optimizer(self):
        c = self.config
        decay, no_decay = [], []
        for p in self.net.parameters():
            if not p.requires_grad:
                continue
            # Norm weights and biases are not decayed (standard practice for transformers).
            (no_decay if p.dim() < 2 else decay).append(p)
        groups = [{"params": decay, "weight_decay": c.weight_decay}]
        if no_decay:
            groups.append({"params": no_decay, "weight_decay": 0.0})
        kw = {"lr": c.lr, "betas": tuple(c.betas), "eps": c.eps}
        if self.device.type == "cpu":
            # One fused kernel over all parameters: on CPU the default per-tensor loop took
            # ~0.9 s per step for 135M parameters on two cores, the fused one ~0.2 s. (GPUs keep
            # torch's default, the configuration measured there.)
            try:
                return torch.optim.AdamW(groups, fused=True, **kw)
            except (RuntimeError, TypeError, ValueError):  # older torch, or a device without it
                pass
        return torch.optim.AdamW(groups, **kw)

    def _apply_fsdp(self) -> None:
        """Shard every decoder layer, then the root, over the default process group (FSDP2)."""
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh("cuda", (dist.get_world_size(),))
        mp = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        layers = getattr(self.model.get_decoder(), "layers", None)
        if layers is None:
            raise LoomError(f"FSDP: {type(self.model).__name__} has no decoder .layers to shard")
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(self.net, mesh=mesh, mp_policy=mp)

    # ------------------------------------------------------------------ helpers

    def _check_onloaded(self, what: str) -> None:
        if self._offloaded is not None:
            raise LoomError(f"{what}() called while the engine is offloaded; call onload() first")

    def _autocast(self):
        if self.fsdp or self.compute_dtype == self.param_dtype:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Parameters under their HF names (``model.layers.0...``), value head as ``value_head.*``.

        Tied weights appear once, under the first name (the input embedding).
        """
        for name, p in self.net.named_parameters():
            yield (name[3:] if name.startswith("lm.") else name), p

    def _optimizer_targets(self) -> list[tuple[dict, str]]:
        targets = []
        if self.optimizer is None:
            return targets
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.numel() > 1:
                    targets.append((state, key))
        return targets

    def encode_prompt(
        self, prompt: str | Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of a chat prompt (a string is one user message).

        Uses the tokenizer's chat template; a tokenizer without one gets a plain
        ``role: content`` transcript ending with ``assistant:`` so any model can be prompted.
        """
        if self.tokenizer is None:
            raise LoomError(f"model {self.model_dir} has no tokenizer; pass token ids directly")
        messages = (
            [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        )
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=True
            )
            if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return [int(x) for x in ids]
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        if add_generation_prompt:
            text += "assistant:"
        ids = tok(text, add_special_tokens=True)["input_ids"]
        if not ids:
            raise LoomError("the prompt encodes to zero tokens")
        return [int(x) for x in ids]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if self.tokenizer is None:
            raise LoomError(f"model {self.model_dir} has no tokenizer")
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ generation

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        top_k: int = 0,
        stop_token_ids: Iterable[int] | None = None,
        ignore_eos: bool = False,
        stop_strings: Sequence[str] = (),
    ) -> GenerationOutput:
        """Sample a response for every prompt (batched, KV cache, left padding).

        prompt_ids: B lists of ids, each non-empty. temperature 0 = greedy. A response ends
        at the first stop token (the model's EOS ids, plus ``stop_token_ids``), which it
        includes, or after ``max_new_tokens``. The same seed, prompts and weights give the
        same tokens. With seed None, each call draws the next seed of the engine's sequence.
        ``ignore_eos=True`` keeps sampling past EOS (fixed-length runs for benchmarks).
        ``stop_strings`` also end a response at the token whose text completes one of them (a
        tool call's closing tag; the tokenizer may split a tag over several tokens or merge it
        with what follows, so ids alone cannot say).
        """
        self._check_onloaded("generate")
        if len(prompt_ids) == 0:
            return GenerationOutput([], [], [], 0, self.version)
        for i, p in enumerate(prompt_ids):
            if len(p) == 0:
                raise ConfigError(
                    f"prompt_ids[{i}] is empty; every prompt needs at least one token"
                )
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={max_new_tokens}: must be >= 1")
        longest = max(len(p) for p in prompt_ids)
        window = self.context_window
        if window is not None and longest + max_new_tokens > window:
            # Past the window a learned position table indexes out of range (a CUDA assert on
            # GPU) and a RoPE model samples on untrained positions without a word.
            raise ConfigError(
                f"max_new_tokens={max_new_tokens} plus the longest prompt ({longest} tokens) "
                f"is {longest + max_new_tokens} positions, past the model's context window of "
                f"{window} ({self.model_dir}/config.json); lower max_new_tokens to at most "
                f"{max(0, window - longest)} or shorten the prompts"
            )
        if not 0.0 < top_p <= 1.0:
            raise ConfigError(f"top_p={top_p}: must be in (0, 1]")
        stop_text = StopText(self.tokenizer, stop_strings) if stop_strings else None
        if seed is None:
            seed = self.config.seed * 1_000_003 + self._gen_calls
        self._gen_calls += 1
        stops = set() if ignore_eos else set(self.eos_ids)
        stops |= {int(x) for x in (stop_token_ids or ())}
        t0 = time.perf_counter()
        was_training = self.net.training
        self.net.eval()
        try:
            with self._autocast():
                impl = self.generate_impl
                if impl in ("hf", "hf_static"):
                    out = self._generate_hf(
                        prompt_ids,
                        max_new_tokens,
                        temperature,
                        top_p,
                        top_k,
                        seed,
                        stops,
                        static=impl == "hf_static",
                        stop_text=stop_text,
                    )
                else:
                    out = self._generate_loop(
                        prompt_ids,
                        max_new_tokens,
                        temperature,
                        top_p,
                        top_k,
                        seed,
                        stops,
                        stop_text,
                    )
        finally:
            self.net.train(was_training)
        out.time_s = time.perf_counter() - t0
        return out

    def _generate_loop(
        self, prompts, max_new, temperature, top_p, top_k, seed, stops, stop_text=None
    ) -> GenerationOutput:
        dev = self.device
        gen = torch.Generator(device=dev).manual_seed(int(seed))
        # Prompt groups (GRPO samples G responses per prompt) repeat each prompt: prefill every
        # distinct prompt once, then give each row a copy of its prompt's KV cache and logits.
        distinct, source = distinct_rows(prompts)
        ids, mask, pos = left_pad(distinct, self.pad_id, dev)
        n = len(prompts)
        responses: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        reasons = ["length"] * n
        alive = list(range(n))  # original row of each current batch row
        out = self._forward(
            "lm",
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = _cache_of(out)
        logits = out.logits[:, -1, :]
        if len(distinct) < n:
            rows = torch.tensor(source, device=dev)
            cache.batch_select_indices(rows)
            logits, mask, pos = logits[rows], mask[rows], pos[rows]
        next_pos = pos[:, -1] + 1
        for step in range(max_new):
            tokens, lp = sample_tokens(logits, temperature, top_p, top_k, gen)
            tok_list, lp_list = tokens.tolist(), lp.tolist()
            keep = []
            for j, row in enumerate(alive):
                responses[row].append(tok_list[j])
                logps[row].append(lp_list[j])
                if tok_list[j] in stops or (stop_text and stop_text.ends(responses[row])):
                    reasons[row] = "stop"
                else:
                    keep.append(j)
            if not keep or step == max_new - 1:
                break
            if len(keep) < len(alive):
                # Drop finished rows from the batch and the cache: later steps cost less.
                idx = torch.tensor(keep, device=dev)
                cache.batch_select_indices(idx)
                mask, tokens, next_pos = mask[idx], tokens[idx], next_pos[idx]
                alive = [alive[j] for j in keep]
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            out = self._forward(
                "lm",
                input_ids=tokens.unsqueeze(-1),
                attention_mask=mask,
                position_ids=next_pos.unsqueeze(-1),
                use_cache=True,
                **{self._cache_kw: cache},
            )
            cache = _cache_of(out)
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1
        total = sum(len(r) for r in responses)
        return GenerationOutput(responses, logps, reasons, total, self.version)

    @property
    def context_window(self) -> int | None:
        """The most positions (prompt plus response) the model takes; None where its config
        names no window."""
        from loomrl.models import context_window

        return context_window(self.model.config)

    @property
    def generate_impl(self) -> str:
        """The generation path in use (``EngineConfig.generate_impl`` with "auto" resolved)."""
        impl = self.config.generate_impl
        if self.fsdp:
            return "loop"  # generate() would bypass the FSDP root module's hooks
        if impl == "auto":
            if self.device.type != "cuda":
                return "loop"
            # The static cache takes the weights' dtype; a trainable engine keeps fp32 weights
            # under bf16 autocast, which the static cache cannot mix: use plain generate there.
            return "hf_static" if self.param_dtype == self.compute_dtype else "hf"
        return impl

    def _generate_hf(
        self, prompts, max_new, temperature, top_p, top_k, seed, stops, static=False, stop_text=None
    ) -> GenerationOutput:
        dev = self.device
        width = None
        if static:
            # Round the prompt width up so that the compiled static-cache step is reused
            # across batches whose longest prompt differs by a few tokens.
            width = -(-max(len(p) for p in prompts) // 64) * 64
        ids, mask, _ = left_pad(prompts, self.pad_id, dev, width=width)
        greedy = temperature <= 0
        kwargs = dict(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new,
            do_sample=not greedy,
            eos_token_id=sorted(stops) or None,
            min_new_tokens=0 if stops else max_new,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        if not greedy:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k or None)
        if static:
            kwargs.update(cache_implementation="static")
        if stop_text:
            kwargs.update(stop_strings=list(stop_text.strings), tokenizer=self.tokenizer)
        devices = [dev] if dev.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(int(seed))
            res = self.model.generate(**kwargs)
        new = res.sequences[:, ids.shape[1] :]
        logits = torch.stack(res.logits, dim=1)  # raw logits [B, T, V]
        lp = token_logprobs(logits, new, 1.0 if greedy else temperature)
        responses, logps, reasons = [], [], []
        for i in range(len(prompts)):
            row = new[i].tolist()
            cut, reason = len(row), "length"
            for t, tok in enumerate(row):
                if tok in stops or (stop_text and stop_text.ends(row[: t + 1])):
                    cut, reason = t + 1, "stop"
                    break
            responses.append(row[:cut])
            logps.append(lp[i, :cut].tolist())
            reasons.append(reason)
        return GenerationOutput(responses, logps, reasons, sum(map(len, responses)), self.version)

    # ------------------------------------------------------------------ scoring

    def _response_forward(self, prompts, responses, temperature: float, want_entropy: bool):
        """Forward one micro-batch. Returns (output [b, T], entropy [b, T] | None, mask [b, T]).

        Rows that share a prompt (the G responses of a prompt group) pass that prompt through
        the model once (``_Net._shared_prefix_hidden``): with a prompt of P tokens and responses
        of R, a group of G rows costs P + G*R token positions instead of G*(P + R).
        """
        distinct, source = distinct_rows(prompts)
        share = self.config.share_prompts
        shared = (
            (share if share is not None else self.device.type == "cpu")
            and len(distinct) < len(prompts)
            and any(len(r) for r in responses)
            and not self.fsdp  # one root forward with two decoder passes: kept off under FSDP
            and not self.config.gradient_checkpointing
        )
        if shared:
            out, resp, rmask = self._shared_forward(distinct, source, responses)
        else:
            ids, mask, gather, resp, rmask = pack_prompt_response(
                prompts, responses, self.pad_id, self.device
            )
            with self._autocast():
                out = self._forward("response", input_ids=ids, attention_mask=mask, gather=gather)
        if self.net.value_head is not None:
            return out.float(), None, rmask
        logp = token_logprobs(out, resp, temperature)
        ent = entropy_from_logits(out, temperature) if want_entropy else None
        return logp, ent, rmask

    def _shared_forward(self, distinct, source, responses):
        """Outputs [b, T] of rows sharing prompts (``_Net._shared_prefix_hidden``), the right-
        padded responses and their mask."""
        dev = self.device
        p_ids, p_mask, p_pos = left_pad(distinct, self.pad_id, dev)
        rows = torch.tensor(source, device=dev)
        resp, rmask = right_pad(responses, self.pad_id, dev)
        plen = torch.tensor([len(distinct[k]) for k in source], device=dev)
        r_pos = plen.unsqueeze(1) + torch.arange(resp.shape[1], device=dev).unsqueeze(0)
        mask = torch.cat([p_mask.index_select(0, rows), rmask.long()], dim=1)
        with self._autocast():
            out = self._forward(
                "shared",
                prompt_ids=p_ids,
                prompt_mask=p_mask,
                prompt_pos=p_pos,
                rows=rows,
                resp_ids=resp,
                mask=mask,
                resp_pos=r_pos,
            )
        return out, resp, rmask

    @torch.no_grad()
    def _score(self, prompt_ids, response_ids, micro_batch_size, temperature, entropy):
        self._check_onloaded("logprobs")
        if len(prompt_ids) != len(response_ids):
            raise ConfigError(
                f"{len(prompt_ids)} prompts but {len(response_ids)} responses; they must pair up"
            )
        lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids, strict=True)]
        if micro_batch_size is not None:
            plan = plan_micro_batches(lengths, micro_batch_size, groups=prompt_ids)
        else:
            plan = plan_micro_batches(
                lengths, self.config.micro_batch_size, self.config.micro_batch_tokens, prompt_ids
            )
        outs: list[torch.Tensor | None] = [None] * len(prompt_ids)
        ents: list[torch.Tensor | None] = [None] * len(prompt_ids)
        was_training = self.net.training
        self.net.eval()
        try:
            for rows in plan:
                val, ent, _ = self._response_forward(
                    [prompt_ids[i] for i in rows],
                    [response_ids[i] for i in rows],
                    temperature,
                    entropy,
                )
                val = val.cpu()
                ent = ent.cpu() if ent is not None else None
                for j, i in enumerate(rows):
                    n = len(response_ids[i])
                    outs[i] = val[j, :n].clone()
                    if ent is not None:
                        ents[i] = ent[j, :n].clone()
        finally:
            self.net.train(was_training)
        return outs, ents

    def logprobs(
        self,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        micro_batch_size: int | None = None,
        temperature: float = 1.0,
        entropy: bool = False,
    ) -> list[torch.Tensor] | tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-token log-probs (float32, CPU, one 1-D tensor per sample) of the responses.

        No gradients. ``entropy=True`` also returns the per-token entropies: (logps, entropies).
        """
        if self.net.value_head is not None:
            raise LoomError("logprobs() on a value engine; use values()")
        outs, ents = self._score(prompt_ids, response_ids, micro_batch_size, temperature, entropy)
        return (outs, ents) if entropy else outs

    def values(
        self,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        micro_batch_size: int | None = None,
    ) -> list[torch.Tensor]:
        """Per-token values V(s_t) of the state before each response token (value engines only)."""
        if self.net.value_head is None:
            raise LoomError(
                "values() needs a value engine (EngineConfig.value_head=True / HFValueEngine)"
            )
        outs, _ = self._score(prompt_ids, response_ids, micro_batch_size, 1.0, False)
        return outs

    # ------------------------------------------------------------------ training

    def _lr_at(self, step: int) -> float:
        w = self.config.warmup_steps
        if w and step < w:
            return self.config.lr * (step + 1) / w
        return self.config.lr

    def train_step(
        self,
        batch: Mapping[str, Any],
        loss_fn: Callable[[torch.Tensor, dict[str, Any]], tuple[torch.Tensor, Mapping[str, Any]]],
        micro_batch_size: int | None = None,
        micro_batch_tokens: int | None = None,
        entropy: bool = False,
        temperature: float = 1.0,
        loss_scale: str | None = None,
    ) -> dict[str, float]:
        """One optimizer step over ``batch`` with gradient accumulation.

        batch: ``prompt_ids`` and ``response_ids`` (B token lists) plus any per-token or
        per-sequence fields (see ``batching.slice_batch``), e.g. ``old_logprobs``,
        ``advantages``, ``ref_logprobs``; an optional per-token ``response_mask`` excludes
        tokens from the loss.

        loss_fn(output, mb) -> (loss, stats): ``output`` is the per-token log-probs [b, T]
        (values [b, T] for a value engine, with grad); ``mb`` holds the sliced fields as
        tensors, ``mask`` [b, T] (1 = token counts), ``entropy`` [b, T] when ``entropy=True``,
        and the whole batch's ``total_tokens`` / ``total_sequences``.

        Combining micro-batches (``loss_scale``): "tokens" weights each micro-batch's loss by
        its share of the batch's mask tokens, so a token-mean loss becomes the token-mean over
        the whole batch; "sequences" weights by its share of sequences (for sequence-mean
        losses); "sum" adds the losses as returned (loss_fn normalises by the totals itself).
        Either way the update does not depend on how the batch is split, up to rounding.

        Returns loss, grad_norm, lr, tokens, sequences, micro_batches, pad_fraction, time_s,
        plus loss_fn's stats averaged with the same weights.
        """
        self._check_onloaded("train_step")
        if self.optimizer is None:
            raise LoomError("train_step() on an engine built with trainable=False")
        t0 = time.perf_counter()
        scale = loss_scale or self.config.loss_scale
        if scale not in ("tokens", "sequences", "sum"):
            raise ConfigError(f"loss_scale={scale!r}: use 'tokens', 'sequences' or 'sum'")
        prompts, responses = batch["prompt_ids"], batch["response_ids"]
        n = len(responses)
        if n == 0 or len(prompts) != n:
            raise ConfigError(
                f"train_step needs matching non-empty prompt_ids/response_ids (got {len(prompts)}/{n})"
            )
        data = dict(batch)
        lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
        if micro_batch_size is None and micro_batch_tokens is None:
            micro_batch_size, micro_batch_tokens = (
                self.config.micro_batch_size,
                self.config.micro_batch_tokens,
            )
        plan = plan_micro_batches(lengths, micro_batch_size, micro_batch_tokens, groups=prompts)

        # Token counts per row under the loss mask, for the batch-wide normalisation.
        row_tokens = []
        for i, r in enumerate(responses):
            if "response_mask" in data:
                m = data["response_mask"][i]
                m = torch.as_tensor(m, dtype=torch.float32).reshape(-1)[: len(r)]
                row_tokens.append(float(m.sum()))
            else:
                row_tokens.append(float(len(r)))
        total_tokens, total_seqs = sum(row_tokens), float(n)
        world = 1
        if self.fsdp:
            import torch.distributed as dist

            world = dist.get_world_size()
            t = torch.tensor(
                [total_tokens, total_seqs, len(plan)], device=self.device, dtype=torch.float64
            )
            counts = t.clone()
            dist.all_reduce(t)
            dist.all_reduce(counts, op=dist.ReduceOp.MAX)
            total_tokens, total_seqs = float(t[0]), float(t[1])
            # Every rank must run the same number of forward/backward passes under FSDP.
            while len(plan) < int(counts[2]):
                plan.append([])

        self.net.train()
        self.optimizer.zero_grad(set_to_none=True)
        total_loss = 0.0
        stat_sums: dict[str, float] = {}
        padded = 0
        try:
            for k, rows in enumerate(plan):
                dummy = not rows
                rows = rows or [0]
                if self.fsdp and hasattr(self.net, "set_requires_gradient_sync"):
                    self.net.set_requires_gradient_sync(k == len(plan) - 1)
                mb_p = [prompts[i] for i in rows]
                mb_r = [responses[i] for i in rows]
                out, ent, rmask = self._response_forward(mb_p, mb_r, temperature, entropy)
                t_max = rmask.shape[1]
                mb = slice_batch(data, rows, t_max, self.device)
                mask = rmask
                if "response_mask" in mb:
                    mask = mask * mb["response_mask"].float()
                mb["mask"] = mask
                if ent is not None:
                    mb["entropy"] = ent
                mb["total_tokens"], mb["total_sequences"] = total_tokens, total_seqs
                padded += len(rows) * max(lengths[i] for i in rows) - sum(lengths[i] for i in rows)
                loss, stats = loss_fn(out, mb)
                if scale == "tokens":
                    weight = float(mask.sum()) / max(total_tokens, 1.0)
                elif scale == "sequences":
                    weight = len(rows) / total_seqs
                else:
                    weight = 1.0
                if dummy:
                    weight = 0.0
                # FSDP averages gradients over ranks; undo that so the global normalisation holds.
                (loss * (weight * world)).backward()
                total_loss += float(loss.detach()) * weight
                stat_w = weight if scale != "sum" else 1.0 / len(plan)
                for key, value in (stats or {}).items():
                    try:
                        stat_sums[key] = stat_sums.get(key, 0.0) + float(value) * stat_w
                    except (TypeError, ValueError):
                        continue
        finally:
            self.net.eval()

        params = [p for p in self.net.parameters() if p.grad is not None]
        max_norm = self.config.grad_clip if self.config.grad_clip is not None else float("inf")
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(params, max_norm) if params else torch.tensor(0.0)
        )
        grad_norm = float(_full(grad_norm))
        lr = self._lr_at(self.step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            self.optimizer.step()
            self.step += 1
            self.version += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.nonfinite_in_a_row = self.nonfinite_in_a_row + 1 if skipped else 0
        if self.nonfinite_in_a_row >= self.config.max_nonfinite_updates:
            from loomrl.errors import TrainingError

            raise TrainingError(
                f"{self.nonfinite_in_a_row} updates in a row had a non-finite gradient norm "
                f"({grad_norm}; loss {total_loss}) and were skipped (max_nonfinite_updates="
                f"{self.config.max_nonfinite_updates}): training has diverged. The weights are "
                f"those of update {self.step}, the last finite one. Lower the learning rate, or "
                "check the rewards and advantages for NaN or infinite values"
            )
        result = {
            "loss": total_loss,
            "grad_norm": grad_norm,
            "lr": lr,
            "tokens": total_tokens,
            "sequences": total_seqs,
            "micro_batches": float(len(plan)),
            "pad_fraction": padded / max(sum(lengths) + padded, 1),
            "skipped": float(skipped),
            "time_s": time.perf_counter() - t0,
        }
        for key, value in stat_sums.items():
            result.setdefault(key, value)
        return result

    # ------------------------------------------------------------------ weights

    @torch.no_grad()
    def param_sha256(self) -> str:
        """SHA-256 over every parameter (name, dtype, shape, raw bytes) in sorted-name order.

        Equal hashes mean bit-identical weights. A collective under FSDP (all ranks call it).
        """
        self._check_onloaded("param_sha256")
        h = hashlib.sha256()
        for name, p in sorted(self.named_parameters(), key=lambda kv: kv[0]):
            t = _full(p.detach()).to("cpu").contiguous()
            h.update(name.encode())
            h.update(str(t.dtype).encode())
            h.update(str(tuple(t.shape)).encode())
            h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    @torch.no_grad()
    def get_weights_buckets(
        self,
        bucket_mb: float = 256,
        device: str | None = None,
        dtype: torch.dtype | str | None = None,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Yield the parameters as dicts of at most ~``bucket_mb`` MB each (one oversized tensor
        forms its own bucket), in ``named_parameters`` order.

        ``device``: where the yielded tensors live (default: where the weights are, so CUDA IPC
        can share them); ``dtype``: cast before yielding (e.g. bfloat16 for a rollout engine).
        Tensors are detached views/copies; do not modify them. Under FSDP every rank must iterate.
        """
        self._check_onloaded("get_weights_buckets")
        if isinstance(dtype, str):
            dtype = _DTYPES[dtype]
        limit = int(bucket_mb * 1024 * 1024)
        bucket: dict[str, torch.Tensor] = {}
        size = 0
        for name, p in self.named_parameters():
            t = _full(p.detach())
            if dtype is not None:
                t = t.to(dtype)
            if device is not None:
                t = t.to(device)
            nbytes = t.numel() * t.element_size()
            if bucket and size + nbytes > limit:
                yield bucket
                bucket, size = {}, 0
            bucket[name] = t
            size += nbytes
        if bucket:
            yield bucket

    @torch.no_grad()
    def set_weights(
        self,
        named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        version: int | None = None,
    ) -> int:
        """Copy tensors into the parameters of the same names (any dtype/device; cast on copy).

        Call once per bucket; pass ``version`` (the trainer's step) with the last bucket, or
        with every bucket. Returns how many tensors were set. Unknown names raise LoomError.
        """
        self._check_onloaded("set_weights")
        params = dict(self.named_parameters())
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        count = 0
        unknown = []
        for name, tensor in items:
            p = params.get(name)
            if p is None:
                unknown.append(name)
                continue
            if tuple(tensor.shape) != tuple(p.shape):
                raise LoomError(
                    f"set_weights: {name} has shape {tuple(tensor.shape)}, expected {tuple(p.shape)}"
                )
            if hasattr(p, "full_tensor"):
                from torch.distributed.tensor import distribute_tensor

                src = distribute_tensor(
                    tensor.to(self.device, p.dtype), p.device_mesh, p.placements
                )
                p.copy_(src)
            else:
                p.copy_(tensor.to(device=p.device, dtype=p.dtype))
            count += 1
        if unknown:
            sample = ", ".join(unknown[:5])
            raise LoomError(
                f"set_weights: {len(unknown)} name(s) not in this model (e.g. {sample}); the sender "
                "and receiver must hold the same architecture"
            )
        if version is not None:
            self.version = int(version)
        return count

    # ------------------------------------------------------------------ state

    def _rng_state(self) -> dict[str, Any]:
        import numpy as np

        state = {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "gen_calls": self._gen_calls,
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def _set_rng_state(self, state: Mapping[str, Any]) -> None:
        import numpy as np

        torch.set_rng_state(state["torch"])
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        self._gen_calls = int(state.get("gen_calls", 0))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])

    def _model_state(self) -> dict[str, torch.Tensor]:
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
            )

            full = get_model_state_dict(
                self.net, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
            return {(k[3:] if k.startswith("lm.") else k): v for k, v in full.items()}
        return {name: p.detach().to("cpu").clone() for name, p in self.named_parameters()}

    def state_dict(self) -> dict[str, Any]:
        """Weights (CPU copies, HF names), optimizer state, step, version and RNG state."""
        self._check_onloaded("state_dict")
        optim = None
        if self.optimizer is not None:
            if self.fsdp:
                from torch.distributed.checkpoint.state_dict import (
                    StateDictOptions,
                    get_optimizer_state_dict,
                )

                optim = get_optimizer_state_dict(
                    self.net,
                    self.optimizer,
                    options=StateDictOptions(full_state_dict=True, cpu_offload=True),
                )
            else:
                optim = self.optimizer.state_dict()
        return {
            "model": self._model_state(),
            "optimizer": optim,
            "step": self.step,
            "version": self.version,
            "rng": self._rng_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned (weights bit-exact, optimizer, counters, RNG)."""
        self._check_onloaded("load_state_dict")
        self.set_weights(state["model"])
        if state.get("optimizer") is not None and self.optimizer is not None:
            if self.fsdp:
                from torch.distributed.checkpoint.state_dict import (
                    StateDictOptions,
                    set_optimizer_state_dict,
                )

                set_optimizer_state_dict(
                    self.net,
                    self.optimizer,
                    state["optimizer"],
                    options=StateDictOptions(full_state_dict=True, cpu_offload=True),
                )
            else:
                self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state.get("step", 0))
        self.version = int(state.get("version", 0))
        if state.get("rng") is not None:
            self._set_rng_state(state["rng"])

    def save(self, directory: str | os.PathLike) -> Path:
        """Write an HF model directory (weights + tokenizer, loadable as ``EngineConfig(model=dir)``)
        plus ``engine_state.pt`` (optimizer, step, version, RNG) and the value head if any.

        Under FSDP every rank must call it; rank 0 writes.
        """
        self._check_onloaded("save")
        directory = Path(directory)
        state = self.state_dict()
        import torch.distributed as dist

        if self.fsdp and dist.get_rank() != 0:
            return directory
        weights = state.pop("model")
        head = self._save_pretrained(directory, weights)
        if head:
            from safetensors.torch import save_file

            save_file(
                {k: v.contiguous() for k, v in head.items()}, str(directory / _VALUE_HEAD_FILE)
            )
        state["config"] = dataclasses.asdict(self.config)
        torch.save(state, directory / _STATE_FILE)
        (directory / "loomrl_engine.json").write_text(
            json.dumps(
                {"step": self.step, "version": self.version, "value_head": bool(head)}, indent=1
            )
        )
        return directory

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write the language model's weights and the tokenizer as a Hugging Face model
        directory (no optimizer or engine state: a model to use, not a run to continue)."""
        self._check_onloaded("save_pretrained")
        directory = Path(directory)
        self._save_pretrained(directory, self._model_state())
        return directory

    def _save_pretrained(self, directory: Path, weights: Mapping[str, torch.Tensor]) -> dict:
        """Save the LM part of ``weights`` and the tokenizer; return the value head's part."""
        directory.mkdir(parents=True, exist_ok=True)
        lm_weights = {k: v for k, v in weights.items() if not k.startswith("value_head.")}
        self.model.save_pretrained(str(directory), state_dict=lm_weights, safe_serialization=True)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(directory))
        return {k: v for k, v in weights.items() if k.startswith("value_head.")}

    def load(self, directory: str | os.PathLike) -> None:
        """Restore weights, optimizer, counters and RNG written by ``save``."""
        self._check_onloaded("load")
        from safetensors.torch import load_file

        directory = Path(directory)
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise LoomError(f"load: no .safetensors files in {directory}")
        weights: dict[str, torch.Tensor] = {}
        for f in files:
            weights.update(load_file(str(f)))
        params = dict(self.named_parameters())
        missing = [k for k in params if k not in weights]
        if missing:
            raise LoomError(
                f"load: {directory} lacks {len(missing)} parameter(s), e.g. {missing[:3]}"
            )
        state_path = directory / _STATE_FILE
        state: dict[str, Any] = {"model": {k: weights[k] for k in params}}
        if state_path.is_file():
            extra = torch.load(state_path, map_location="cpu", weights_only=False)
            state.update({k: v for k, v in extra.items() if k != "config"})
        self.load_state_dict(state)

    # ------------------------------------------------------------------ memory

    def offload(self, optimizer: bool = True, weights: bool = True) -> dict[str, float]:
        """Free the device memory held by weights (and optimizer state).

        GPU: tensors move to pinned host memory. CPU-only: their bytes go to one file under
        ``offload_dir`` and the tensors become empty, so RSS drops by their size (gradients are
        dropped too). Returns rss_before/rss_after in MB and seconds taken.
        """
        t0 = time.perf_counter()
        before = _offload.rss_bytes()
        if self.device.type != "cuda" and self.config.cpu_offload == "keep":
            return {"rss_before_mb": before / 2**20, "rss_after_mb": before / 2**20, "time_s": 0.0}
        if self._offloaded is not None:
            return {"rss_before_mb": before / 2**20, "rss_after_mb": before / 2**20, "time_s": 0.0}
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        targets: list = []
        if weights:
            targets += [(p, None) for _, p in self.named_parameters()]
        if optimizer:
            targets += self._optimizer_targets()
        if self.device.type == "cuda":
            if self.fsdp and weights:
                self.net.to("cpu")
                targets = [t for t in targets if t[1] is not None]
            _offload.move_to(targets, "cpu", pin=True)
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            self._offloaded = "host"
            self._stash = (weights, optimizer)
        else:
            self._stash = _offload.stash_to_disk(targets, self.config.offload_dir)
            self._offloaded = "disk"
        import gc

        gc.collect()
        _offload.release_host_memory()
        after = _offload.rss_bytes()
        return {
            "rss_before_mb": before / 2**20,
            "rss_after_mb": after / 2**20,
            "time_s": time.perf_counter() - t0,
        }

    def onload(self) -> dict[str, float]:
        """Undo ``offload``: the weights and optimizer state come back bit-identical."""
        t0 = time.perf_counter()
        if self._offloaded == "disk":
            self._stash.restore()
        elif self._offloaded == "host":
            weights, optimizer = self._stash
            targets: list = []
            if weights:
                if self.fsdp:
                    self.net.to(self.device)
                else:
                    targets += [(p, None) for _, p in self.named_parameters()]
            if optimizer:
                targets += self._optimizer_targets()
            _offload.move_to(targets, self.device)
            torch.cuda.synchronize(self.device)
        self._offloaded = None
        self._stash = None
        return {"rss_mb": _offload.rss_bytes() / 2**20, "time_s": time.perf_counter() - t0}

    @property
    def offloaded(self) -> bool:
        return self._offloaded is not None

    def num_parameters(self) -> int:
        return sum(p.numel() for _, p in self.named_parameters())


class HFValueEngine(HFEngine):
    """The PPO critic: the LM's backbone with a scalar value head (``values()``; ``train_step``
    hands loss_fn the values [b, T] instead of log-probs)."""

    is_value_model = True


__all__ = ["EngineConfig", "GenerationOutput", "HFEngine", "HFValueEngine"]
