"""PPO with a critic: the advantage stage's maths by hand, and a 3-step tiny run end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from loomrl.workers.critic import AdvantageWorker, PPOConfig, token_targets

ROOT = Path(__file__).resolve().parents[2]


def _item(**extra) -> dict:
    # Two responses of 3 and 2 tokens; the first is correct.
    return {"index": 0, "rewards": [1.0, 0.0], "values": [[0.5, 0.6, 0.7], [0.2, 0.1]], **extra}


def test_advantage_stage_matches_hand_computed_gae():
    # gamma = 1, lam = 0.5; reward 1 on the last token of response 0, 0 for response 1.
    # Response 0: deltas (0 + .6 - .5, 0 + .7 - .6, 1 + 0 - .7) = (.1, .1, .3)
    #   A2 = .3, A1 = .1 + .5 * .3 = .25, A0 = .1 + .5 * .25 = .225; returns A + V.
    # Response 1: deltas (0 + .1 - .2, 0 + 0 - .1) = (-.1, -.1); A1 = -.1, A0 = -.1 - .05 = -.15.
    (out,) = AdvantageWorker(PPOConfig(gamma=1.0, lam=0.5)).compute([_item()])
    adv, ret = out["token_advantages"], out["returns"]
    assert [len(a) for a in adv] == [3, 2] and [len(r) for r in ret] == [3, 2]
    torch.testing.assert_close(torch.tensor(adv[0]), torch.tensor([0.225, 0.25, 0.3]))
    torch.testing.assert_close(torch.tensor(adv[1]), torch.tensor([-0.15, -0.1]))
    torch.testing.assert_close(torch.tensor(ret[0]), torch.tensor([0.725, 0.85, 1.0]))
    torch.testing.assert_close(torch.tensor(ret[1]), torch.tensor([0.05, 0.0]))


def test_advantage_stage_discount_and_kl_penalty():
    # gamma = 0.9, lam = 1: A_t = discounted return - V_t. Response 0: G = (.81, .9, 1).
    (out,) = AdvantageWorker(PPOConfig(gamma=0.9, lam=1.0)).compute([_item()])
    torch.testing.assert_close(
        torch.tensor(out["token_advantages"][0]), torch.tensor([0.81 - 0.5, 0.9 - 0.6, 1.0 - 0.7])
    )
    # k1 penalty, coef .1: kl = logp - ref. Response 1: kl = (.5, -1) -> rewards (-.05, .1).
    # gamma 1, lam .5: delta1 = .1 - .1 = 0 -> A1 = 0; delta0 = -.05 + .1 - .2 = -.15 -> A0 = -.15.
    item = _item(
        logprobs=[[-1.0, -1.0, -1.0], [-1.0, -2.0]], ref_logprobs=[[-1.0, -1.0, -1.0], [-1.5, -1.0]]
    )
    (out,) = AdvantageWorker(PPOConfig(gamma=1.0, lam=0.5, kl_coef=0.1)).compute([item])
    torch.testing.assert_close(torch.tensor(out["token_advantages"][1]), torch.tensor([-0.15, 0.0]))
    assert out["kl"] == pytest.approx((0.5 - 1.0) / 5)  # token mean over the item's 5 tokens


def test_advantage_stage_names_missing_logprobs():
    with pytest.raises(KeyError, match="kl_coef > 0 needs .*'logprobs'"):
        AdvantageWorker(PPOConfig(kl_coef=0.1)).compute(
            [_item(ref_logprobs=[[0.0] * 3, [0.0] * 2])]
        )


def test_token_targets_padding_is_zero():
    values = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.1, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret, r = token_targets(torch.tensor([1.0, 0.0]), values, mask, 1.0, 0.5)
    assert adv[1, 2] == 0 and ret[1, 2] == 0 and r[1, 2] == 0
    assert r[0].tolist() == [0.0, 0.0, 1.0]


def test_config_reports_every_problem():
    from loomrl.config import load_config
    from loomrl.errors import ConfigError
    from loomrl.recipes.reasoning_ppo import Config

    with pytest.raises(ConfigError, match=r"(?s)ppo\.lam.*critic\.vf_clip"):
        load_config(Config, ROOT / "examples/tiny_ppo.yaml", ["ppo.lam=1.5", "critic.vf_clip=-1"])


def test_grpo_config_reports_sampling_model_and_algo_mistakes_together():
    from loomrl.config import load_config
    from loomrl.errors import ConfigError
    from loomrl.recipes.reasoning_grpo import Config

    bad = [
        "sampling.gen_groups=0",  # once a ZeroDivisionError inside validate()
        "sampling.temperature=0",
        "sampling.max_new_tokens=0",
        "model.train_micro_batch=0",
        "algo.agg=seq-mean",
        "algo.clip_low=1.5",
    ]
    with pytest.raises(ConfigError) as e:
        load_config(Config, ROOT / "examples/tiny_grpo.yaml", bad)
    said = [p.split(":")[0] for p in e.value.problems]
    assert sorted(said) == sorted(o.split("=")[0] for o in bad), said


def _initial_shas(seed: int) -> tuple[str, str]:
    from loomrl.engines.hf import EngineConfig, HFEngine, HFValueEngine
    from loomrl.workers.reasoning import model_dir

    path = model_dir("tiny-llama")
    actor = HFEngine(EngineConfig(model=path, trainable=True, seed=seed)).param_sha256()
    critic = HFValueEngine(EngineConfig(model=path, trainable=True, seed=seed)).param_sha256()
    return actor, critic


def _run(out: Path, placement: str) -> dict:
    from loomrl.cli import _normalise_overrides, load_recipe_config

    mod, cfg = load_recipe_config(
        ROOT / "examples/tiny_ppo.yaml",
        _normalise_overrides(
            [
                f"placement={placement}",
                "steps=3",
                "seed=3",
                f"output_dir={out / placement}",
                f"run.profile={ROOT / 'examples/profiles/tiny_ppo.yaml'}",
            ]
        ),
    )
    mod.main(cfg)
    return json.loads((out / placement / "run_summary.json").read_text())


@pytest.fixture(scope="module")
def temporal_run(cluster, tmp_path_factory):
    return _run(tmp_path_factory.mktemp("ppo"), "temporal")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tiny_ppo_trains_actor_and_critic(temporal_run):
    s = temporal_run
    assert s["steps"] == 3 and s["plan"]["mode"] == "temporal"
    assert set(s["plan"]["assignment"]) == {
        "rollout",
        "reward",
        "critic",
        "advantage",
        "critic_train",
        "actor",
    }
    assert s["measured_iteration_s"] > 0 and len(s["iteration_s"]) == 3
    m = s["metrics"]
    assert math.isfinite(m["critic/value_loss"]) and m["critic/grad_norm"] > 0
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0
    assert 0.0 <= m["eval_accuracy"] <= 1.0
    actor0, critic0 = _initial_shas(seed=3)
    assert s["param_sha256"] != actor0
    assert s["critic_param_sha256"] != critic0
    # Two PPO epochs: the second step's ratio is no longer 1.
    assert m["ratio_mean"] != 1.0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tiny_ppo_hybrid_plan_gives_the_same_parameters(temporal_run, tmp_path):
    s = _run(tmp_path, "hybrid")
    assert s["plan"]["mode"] == "hybrid"
    assert s["plan"]["assignment"] != temporal_run["plan"]["assignment"]
    assert s["param_sha256"] == temporal_run["param_sha256"]
    assert s["critic_param_sha256"] == temporal_run["critic_param_sha256"]
