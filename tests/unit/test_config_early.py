"""Mistakes a worker would find only after Ray starts are found with the config instead,
before a run directory's earlier records are set aside."""

from __future__ import annotations

from pathlib import Path

import pytest

from loomrl.cli import _normalise_overrides, load_recipe_config
from loomrl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples/tiny_grpo.yaml"
SEARCH = ROOT / "examples/tiny_search.yaml"


def problems(config: Path, *overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_recipe_config(config, _normalise_overrides(list(overrides)))
    return e.value.problems


def test_the_tasks_own_checks_run_with_the_config_and_name_the_full_key():
    found = problems(
        TINY,
        "task.name=arithmetic",
        "task.level=9",
        "task.options={format_reward: 2, formt: 1}",
    )
    assert "task.level=9: must be one of [1, 2, 3, 4]" in found
    assert "task.options.format_reward=2: must be in [0, 1)" in found
    assert any(
        p.startswith("task.options.formt: task 'arithmetic' has no such option") for p in found
    )
    assert len(found) == 3


def test_task_options_may_not_stand_in_for_the_tasks_own_keys():
    found = problems(TINY, "task.options={name: arithmetic, seed: 5, level: 3}")
    assert [p.split(" (")[0] for p in found] == [
        "task.options.level: set task.level instead",
        "task.options.name: set task.name instead",
        "task.options.seed: set run.seed instead",
    ]


def test_a_task_option_of_the_wrong_type_is_a_problem_not_a_traceback():
    # format_reward compared with a number: text there raises TypeError inside the task
    (p,) = problems(TINY, "task.name=arithmetic", "task.options={format_reward: fast}")
    assert p.startswith("task.options: the task 'arithmetic' cannot be built (TypeError")


def test_options_of_a_registered_task_that_is_no_dataclass_are_read_from_its_signature():
    from loomrl.tasks import _REGISTRY, register_task
    from loomrl.workers.reasoning import TaskConfig

    class Plain:  # make_task builds any class; only dataclasses had their options checked
        def __init__(self, name="plain_test_task", seed=0, path="x"):
            self.name, self.seed, self.path = name, seed, path

    register_task("plain_test_task", Plain)
    try:
        assert TaskConfig(name="plain_test_task", options={"path": "y"}).validate() == []
        (p,) = TaskConfig(name="plain_test_task", options={"pth": "y"}).validate()
        assert p.startswith("options.pth: task 'plain_test_task' has no such option")
    finally:
        del _REGISTRY["plain_test_task"]


def test_a_model_dtype_the_engine_does_not_know_is_refused():
    from loomrl.engines.hf import _DTYPES
    from loomrl.workers.reasoning import ModelConfig

    assert set(ModelConfig.DTYPES) == {"auto", *_DTYPES}  # the engine's names, no more
    (p,) = problems(TINY, "model.dtype=fp8")
    assert p.startswith("model.dtype: 'fp8' is not one of auto, bf16")


def test_wandb_without_the_package_and_calibrate_beside_auto_are_refused(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    found = problems(TINY, "run.wandb=offline", "run.profile=calibrate", "placement=auto")
    assert any(p.startswith("run.wandb: 'offline' needs the wandb package") for p in found)
    assert any(
        p.startswith("run.profile: 'calibrate' plans only placement=temporal") for p in found
    )


def test_the_agentic_corpus_is_read_with_the_config_and_ignored_budgets_are_refused(tmp_path):
    found = problems(SEARCH, f"agent.corpus_path={tmp_path / 'none.jsonl'}")
    assert found == [f"agent.corpus_path: {str(tmp_path / 'none.jsonl')!r} does not exist"]
    bad = tmp_path / "corpus.jsonl"
    bad.write_text('{"title": 1}\n')
    (p,) = problems(SEARCH, f"agent.corpus_path={bad}")
    assert p.startswith("agent.corpus_path: ") and ':1: needs a "text" string' in p
    (p,) = problems(SEARCH, "sampling.max_new_tokens=1")
    assert p.startswith("sampling.max_new_tokens: not used by the agentic recipe")


def test_model_settings_that_are_not_finite_are_refused():
    found = problems(TINY, "model.lr=inf", "model.weight_decay=inf", "model.grad_clip=inf")
    assert found == [
        "model.lr: must be a finite number > 0, got inf",
        "model.weight_decay: must be a finite number >= 0, got inf",
        "model.grad_clip: must be a finite number > 0 (the gradient norm's bound), got inf",
    ]


def test_sampling_kl_and_critic_settings_that_are_not_finite_or_flip_gradients_are_refused():
    found = problems(TINY, "sampling.temperature=inf", "algo.kl_coef=inf")
    assert found == [
        "sampling.temperature: must be a finite number > 0 (sampling), got inf",
        "algo.kl_coef: must be a finite number >= 0, got inf",
    ]
    ppo = ROOT / "examples/tiny_ppo.yaml"
    found = problems(
        ppo, "ppo.kl_coef=inf", "critic.lr=inf", "critic.weight_decay=-1", "critic.grad_clip=-1"
    )
    assert found == [
        "ppo.kl_coef: must be a finite number >= 0, got inf",
        "critic.lr: must be a finite number > 0, got inf",
        "critic.weight_decay: must be a finite number >= 0, got -1.0",
        "critic.grad_clip: must be a finite number > 0 (the gradient norm's bound), got -1.0",
    ]


def test_a_model_path_that_is_no_loadable_model_directory_is_refused_with_the_config(tmp_path):
    """Each of these failed inside transformers, in the driver's tokenizer or the first worker,
    with a traceback about transformers' internals."""
    import shutil

    from loomrl.models import resolve_model
    from loomrl.reasoning import Encoder
    from loomrl.workers.reasoning import model_dir

    def copy(name: str) -> Path:
        return Path(shutil.copytree(model_dir("tiny-llama"), tmp_path / name))

    (copy("no_weights") / "model.safetensors").unlink()
    (copy("bad_json") / "config.json").write_text("{bad")
    (copy("no_type") / "config.json").write_text("{}")
    (tmp_path / "a_file.json").write_text("{}")
    cases = {
        "no_weights": "holds no weights (model.safetensors or pytorch_model.bin)",
        "bad_json": "its config.json cannot be read as JSON",
        "no_type": "its config.json has no 'model_type'",
        "a_file.json": "is a file, not a model directory",
    }
    for name, says in cases.items():
        path = str(tmp_path / name)
        (p,) = problems(TINY, f"model.path={path}")
        assert p.startswith(f"model.path: {path!r}") and says in p, p
        with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
            resolve_model(path)  # the workers' engines say the same
    # Tokenizer files that are there but do not load: the driver's encoder names the key.
    (copy("bad_tokenizer") / "tokenizer.json").write_text('{"nonsense": 1}')
    with pytest.raises(ConfigError, match=r"model.path: the tokenizer of .* cannot be loaded"):
        Encoder(str(tmp_path / "bad_tokenizer"))
