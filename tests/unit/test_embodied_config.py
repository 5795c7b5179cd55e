"""The embodied PPO recipe's config: every problem found before Ray starts, all at once.

Loads configs only (``load_config``, ``Config.validate``); nothing here starts Ray or a worker.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from loomrl.config import load_config
from loomrl.embodied import PPOConfig
from loomrl.errors import ConfigError
from loomrl.recipes.embodied_ppo import Config

ROOT = Path(__file__).resolve().parents[2]
PENDULUM = ROOT / "examples/ppo_inverted_pendulum.yaml"
PIXELS = ROOT / "examples/ppo_fetch_pixels.yaml"

NAN, INF = float("nan"), float("inf")
PPO_FLOATS = [
    f.name
    for f in dataclasses.fields(PPOConfig)
    if f.type in ("float", "float | None") or f.type in (float, float | None)
]


def _problems(path: Path, *overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(Config, path, list(overrides))
    return e.value.problems


def test_every_float_of_the_ppo_config_is_listed():
    assert set(PPO_FLOATS) == {
        "lr",
        "adam_eps",
        "gamma",
        "gae_lambda",
        "clip",
        "value_clip",
        "vf_coef",
        "ent_coef",
        "max_grad_norm",
        "target_kl",
        "obs_clip",
        "reward_clip",
    }


@pytest.mark.parametrize("name", PPO_FLOATS)
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_ppo_config_refuses_nan_and_infinity_in_every_float(name, bad):
    """NaN passes `x <= 0` and inf passes `x > 0`: lr=inf started Ray and ended in a dump of NaN
    tensors. Each is refused, naming the key and the value, and saying the range."""
    with pytest.raises(ConfigError) as e:
        PPOConfig(**{name: bad})
    (problem,) = e.value.problems
    assert problem.startswith(f"{name}={bad}") or f", {name}={bad}" in problem
    assert "finite" in problem


def test_ppo_config_reports_every_non_finite_float_at_once():
    with pytest.raises(ConfigError) as e:
        PPOConfig(lr=INF, gamma=NAN, clip=NAN, max_grad_norm=INF, adam_eps=NAN, gae_lambda=-INF)
    assert [p.split("=")[0] for p in e.value.problems] == [
        "lr",
        "gamma",
        "gae_lambda",
        "clip",
        "max_grad_norm",
        "adam_eps",
    ]


def test_an_infinite_learning_rate_is_refused_when_the_config_loads():
    # The auditor's command: ppo.lr=inf passed validation, then Ray started.
    (problem,) = _problems(PENDULUM, "ppo.lr=inf", "run.steps=1", "run.placement=temporal")
    assert problem == "ppo.lr=inf: must be a finite number > 0, e.g. 3e-4"
    assert "ppo.gamma: NaN is not a value" in _problems(PENDULUM, "ppo.gamma=nan")[0]


def test_recipe_floats_are_finite_too():
    problems = Config(target_return=INF, auto_trial_margin=NAN).validate()
    assert any(p.startswith("target_return: must be a finite number") for p in problems)
    assert any(p.startswith("auto_trial_margin: must be a finite number >= 0") for p in problems)
    assert Config(target_return=950.0, auto_trial_margin=0.0).validate() == []


def test_run_settings_the_embodied_recipe_does_not_use_are_refused_not_ignored():
    """Each run setting of the LLM recipes that changes nothing here is named with the key to
    set instead."""
    problems = _problems(
        PENDULUM, "run.micro_batch=7", "run.offload=always", "run.weight_bucket_mb=64"
    )
    assert problems == [
        "run.micro_batch=7: not used by the embodied recipe (the cycle's batch is "
        "env.num_envs, cut into ring groups by the plan; pin them with groups); leave it at null",
        "run.offload='always': not used by the embodied recipe (the policy worker acts and "
        "trains, and stays resident); leave it at auto",
        "run.weight_bucket_mb=64.0: not used by the embodied recipe (the policy worker acts and "
        "trains: no weights are sent); leave it at 256",
    ]
    assert load_config(Config, PENDULUM, ["env.seed=5", "ppo.seed=5"]).env.seed == 5


def test_seed_on_the_command_line_shifts_the_env_and_policy_seeds_and_is_recorded_so():
    """seed=5 (a short form the CLI offers for every recipe) ran seed 0's run again, then was
    refused; now it is added to env.seed and ppo.seed, and config.yaml records those."""
    from loomrl.recipes.embodied_ppo import prepared

    cfg = prepared(load_config(Config, PENDULUM, ["run.seed=5", "env.seed=2"]))
    assert (cfg.env.seed, cfg.ppo.seed, cfg.run.seed) == (7, 5, 0)
    plain = load_config(Config, PENDULUM, [])
    assert prepared(plain) is plain  # seed 0: the run as before, bit for bit
    assert _problems(PENDULUM, "run.seed=-1") == [
        "run.seed: must be a whole number in [0, 2**32), got -1"
    ]
    with pytest.raises(ConfigError, match=r"ppo.seed \+ run.seed = 18446744073709551616"):
        prepared(load_config(Config, PENDULUM, ["run.seed=1", f"ppo.seed={2**64 - 1}"]))


def test_an_unknown_policy_name_is_refused_before_any_worker_starts():
    (problem,) = _problems(PENDULUM, "policy=transformer")
    assert problem.startswith("policy='transformer': not a built-in policy nor a factory; use")
    assert "'package.module:factory'" in problem
    assert "did you mean 'cnn'?" in Config(policy="CNN").validate()[0]


@pytest.mark.parametrize(
    "spec, module, factory",
    [("my.mod:", "my.mod", ""), (":make", "", "make"), ("a b:make", "a b", "make"),
     ("pkg..mod:make", "pkg..mod", "make"), ("pkg.mod:a.b", "pkg.mod", "a.b")],
)  # fmt: skip
def test_a_malformed_factory_name_is_refused_before_any_worker_starts(spec, module, factory):
    (problem,) = Config(policy=spec).validate()
    assert problem.startswith(f"policy={spec!r}: a factory is named 'package.module:factory'")
    assert f"got module {module!r} and factory {factory!r}" in problem


def test_a_well_formed_factory_is_left_to_the_policy_worker_to_import():
    # Not imported here: the module may exist only where the worker runs.
    assert Config(policy="no_such_package.policies:make").validate() == []


def test_a_malformed_policy_name_is_refused_by_build_policy_before_importing_anything():
    import gymnasium as gym
    import numpy as np

    from loomrl.workers.policy import build_policy

    box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    with pytest.raises(ConfigError, match=r"policy='transformer': not a built-in policy"):
        build_policy("transformer", box, box, 0)
    with pytest.raises(ConfigError, match=r"policy='os.path:': a factory is named"):
        build_policy("os.path:", box, box, 0)


def test_a_policy_kwargs_typo_is_reported_with_the_env_sections_problems():
    """The auditor's command listed 3 problems: the env section failed, so the recipe's checks
    ran on a stand-in env and the policy_kwargs typo was dropped with them."""
    problems = _problems(
        PIXELS, "env.image_size=4", "ppo.lr=-1", "window=0", "policy_kwargs.featur_dim=3"
    )
    assert len(problems) == 4, problems
    assert problems[0].startswith("env.image_size=4:")
    assert problems[1].startswith("ppo.lr=-1.0:")
    assert problems[2].startswith(
        "policy_kwargs.featur_dim: not an argument of CNNActorCritic (policy='cnn'); "
        "did you mean 'feature_dim'?"
    )
    assert problems[3].startswith("window: must be >= 1")


def test_with_policy_auto_a_key_no_built_in_takes_is_reported_beside_env_problems():
    # policy: auto picks its class from the env; a key neither class takes is wrong whatever
    # the (invalid) env section would give.
    problems = _problems(PIXELS, "policy=auto", "env.image_size=4", "policy_kwargs.chanels=[8]")
    assert len(problems) == 2, problems
    assert problems[1].startswith(
        "policy_kwargs.chanels: not an argument of either built-in policy (policy='auto'); "
        "did you mean 'channels'?"
    )
    # A key only the other class takes depends on env.pixels: named with it where env.pixels is
    # valid (whatever else the env section gets wrong), left out while env.pixels is wrong.
    _, problem = _problems(PIXELS, "policy=auto", "env.image_size=4", "policy_kwargs.hidden=[8]")
    assert "not an argument of CNNActorCritic (policy='auto', env.pixels=True)" in problem
    (problem,) = _problems(PIXELS, "policy=auto", "policy_kwargs.hidden=[8]")
    assert "not an argument of CNNActorCritic (policy='auto', env.pixels=True)" in problem
    (problem,) = _problems(PIXELS, "policy=auto", "env.pixels=maybe", "policy_kwargs.channels=[8]")
    assert problem.startswith("env.pixels: expected bool")


def test_an_env_id_typo_is_reported_with_the_env_sections_other_problems():
    problems = _problems(PENDULUM, "env.env_id=InvertedPendulm-v5", "env.num_envs=0")
    assert problems[0].startswith("env.num_envs=0:")
    assert problems[1].startswith("env.env_id='InvertedPendulm-v5' is not a registered")


def test_an_mlp_that_cannot_be_built_is_reported_beside_ppo_problems():
    # Building the MLP does not depend on the env: its problem names no env key, so it stays
    # when another section fails.
    problems = _problems(PENDULUM, "ppo.lr=-1", "policy_kwargs.row_block=0")
    assert len(problems) == 2, problems
    assert "MLPActorCritic cannot be built with policy_kwargs={'row_block': 0} (" in problems[1]


def test_policy_kwargs_log_std_init_must_be_finite():
    (problem,) = Config(policy_kwargs={"log_std_init": INF}).validate()
    assert problem.startswith("policy_kwargs.log_std_init: must be a finite number")


def test_the_recipes_checks_across_sections_run_beside_the_ppo_sections_own_problems():
    """ppo.num_minibatches above ppo.rollout_steps made the ppo section fail, and the checks of
    rollout_steps and groups against env.num_envs went unsaid until it was fixed."""
    problems = _problems(PENDULUM, "ppo.num_minibatches=9999", "env.num_envs=7", "groups=9")
    assert problems == [
        "ppo.num_minibatches=9999: must be in [1, rollout_steps=2048]",
        "ppo.rollout_steps=2048 is not a multiple of env.num_envs=7; their ratio is the steps S "
        "per env per iteration",
        "groups: must be in [1, env.num_envs=7], got 9",
    ]
    # A wrong type in ppo stops none of ppo's other checks, nor the recipe's.
    problems = _problems(PENDULUM, "ppo.lr=fast", "ppo.epochs=0", "ppo.rollout_steps=100")
    assert problems == [
        "ppo.lr: expected float, got 'fast' (str)",
        "ppo.epochs=0: must be >= 1",
        "ppo.rollout_steps=100 is not a multiple of env.num_envs=8; their ratio is the steps S "
        "per env per iteration",
    ]


def test_a_check_across_sections_is_left_out_where_a_value_it_reads_is_wrong():
    # num_envs is wrong: both checks against it would be about the stand-in default.
    for bad in ("env.num_envs=0", "env.num_envs=x"):
        (problem,) = _problems(PENDULUM, bad, "ppo.rollout_steps=100", "groups=9")
        assert problem.startswith("env.num_envs"), problem
