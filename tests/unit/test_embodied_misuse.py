"""Embodied RL under bad input: actions, observations and rendering a user's policy or env
gets wrong, each said in words that name the cause (no Ray)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import loomrl.envs.testing  # noqa: F401  (registers loomrl-test/* envs)
from loomrl.envs import ActionShapeError, EnvConfig, EnvFailureError, VecEnv
from loomrl.errors import ConfigError


def _counting(n: int = 2) -> VecEnv:
    env = VecEnv(EnvConfig("loomrl-test/Counting-v0", num_envs=n))
    env.reset()
    return env


@pytest.mark.parametrize(
    "actions, dtype",
    [
        (np.array([["a"], ["b"]]), "<U1"),  # numpy's words were "could not convert string"
        (np.array([[None], [None]], dtype=object), "object"),  # had been taken as NaN
        (np.array([[1 + 2j], [0j]]), "complex128"),  # had lost its imaginary part silently
    ],
)
def test_box_actions_that_are_not_real_numbers_are_refused_naming_the_dtype(actions, dtype):
    env = _counting()
    with pytest.raises(
        ActionShapeError, match=rf"Box actions must be real numbers, got dtype {dtype}"
    ):
        env.step(actions)
    assert env.step(np.zeros((2, 1), np.float32)).reward.tolist() == [1.0, 1.0]  # still steps


def test_bfloat16_actions_step_as_their_float32_values():
    """A policy run in bf16 hands bf16 tensors; numpy has no such dtype (torch's TypeError
    before). Every bf16 value is a float32 one, so the step is the float32 actions' step."""
    a, b = _counting(), _counting()
    acts = torch.tensor([[0.5], [-0.25]], dtype=torch.bfloat16)
    ra, rb = a.step(acts), b.step(acts.float())
    assert np.array_equal(ra.obs, rb.obs) and np.array_equal(ra.reward, rb.reward)


class _TextObs(gym.Env):
    """Observations of text from the second step on (an env whose step returns the wrong thing)."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return ("abc" if self.t >= 2 else np.zeros(2, np.float32)), 0.0, False, False, {}


def test_an_observation_that_is_not_numbers_names_the_env_and_what_came():
    if "loomrl-test/TextObs-v0" not in gym.registry:
        gym.register(id="loomrl-test/TextObs-v0", entry_point=_TextObs)
    env = VecEnv(EnvConfig("loomrl-test/TextObs-v0", num_envs=2))
    env.reset()
    env.step(np.zeros((2, 1), np.float32))
    with pytest.raises(
        EnvFailureError,
        match=r"env 0 returned an observation that is not numbers of its observation space "
        r"Box.*str 'abc'.*fix the env's observations",
    ):
        env.step(np.zeros((2, 1), np.float32))


class _Still(gym.Env):
    """Two zeros of observation, one action, reward 0, never done: the envs below change one
    part of it each."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


class _NoPygame(_Still):
    """An env whose renderer needs a package that is missing, as CartPole without pygame."""

    def render(self):
        raise gym.error.DependencyNotInstalled('pygame is not installed, run `pip install "x"`')


def test_pixels_on_an_env_whose_renderer_is_not_installed_is_a_config_error(monkeypatch):
    import loomrl.envs.vec as vec

    # The GL probe is not what is tested (and needs a working backend): pass it.
    monkeypatch.setattr(vec, "select_render_backend", lambda preferred, timeout_s=60.0: "egl")
    if "loomrl-test/NoPygame-v0" not in gym.registry:
        gym.register(id="loomrl-test/NoPygame-v0", entry_point=_NoPygame)
    env = VecEnv(EnvConfig("loomrl-test/NoPygame-v0", num_envs=1, pixels=True, image_size=16))
    with pytest.raises(
        ConfigError,
        match=r"env.pixels=true: loomrl-test/NoPygame-v0 env 0 cannot draw frames here "
        r"\(pygame is not installed.*env.pixels=false",
    ):
        env.reset()


_BF16_POLICY = """
import torch

from loomrl.policies import MLPActorCritic


class Bf16(MLPActorCritic):
    def act(self, obs, generators=None):
        a, logp, v = super().act(obs, generators=generators)
        return a.bfloat16(), logp, v


def make(observation_space, action_space, seed=0):
    return Bf16(observation_space.shape[0], action_space, seed=seed)
"""


def test_a_user_policy_acting_in_bfloat16_gives_float32_actions(tmp_path, monkeypatch):
    """Its act() returns bf16 actions; the policy worker's first .numpy() of them raised
    torch's "unsupported ScalarType BFloat16" before."""
    from loomrl.embodied import PPOConfig
    from loomrl.workers.policy import PolicyWorker

    (tmp_path / "bf16_policy.py").write_text(_BF16_POLICY)
    monkeypatch.syspath_prepend(str(tmp_path))
    obs = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    act = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    reply = {"obs": np.zeros((3, 4), np.float32), "env_ids": np.arange(3)}
    reply["env_steps"] = np.zeros(3, np.int64)
    pol = PolicyWorker(
        obs, act, 3, PPOConfig(rollout_steps=6, num_minibatches=1), 0, policy="bf16_policy:make"
    )
    pol.begin(2)
    (out,) = pol.act(0, reply)
    assert out.dtype == np.float32 and out.shape == (3, 2)
    assert np.array_equal(out, torch.as_tensor(out).bfloat16().float().numpy())  # bf16 values


def test_a_ppo_seed_torch_cannot_take_is_a_config_error_with_the_others():
    """Past 64 bits the policy worker failed to start with torch's "Overflow when unpacking
    long long"; now said with the section's other problems."""
    from loomrl.embodied import PPOConfig

    with pytest.raises(ConfigError) as e:
        PPOConfig(seed=2**64, clip=-1.0)
    assert "seed=18446744073709551616: must fit torch's 64-bit seed" in str(e.value)
    assert "clip=-1.0" in str(e.value)
    with pytest.raises(ConfigError, match=r"seed=1.5: must be a whole number"):
        PPOConfig(seed=1.5)
    for ok in (0, 2**64 - 1, -1, np.int64(3)):  # what torch takes still passes
        assert PPOConfig(seed=ok).seed == ok
        torch.Generator().manual_seed(int(ok))


class _NanReset(gym.Env):
    """The resets listed in ``nan_on`` (counted from 1 over every instance sharing ``count``)
    return an observation holding NaN."""

    def __init__(self, nan_on=(3, 4), count=None, length=2):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.nan_on, self.length, self.t = set(nan_on), length, 0
        self.count = {"resets": 0} if count is None else count

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count["resets"] += 1
        self.t = 0
        obs = np.zeros(2, np.float32)
        if self.count["resets"] in self.nan_on:
            obs[0] = np.nan
        return obs, {}

    def step(self, action):
        self.t += 1
        return np.full(2, self.t, np.float32), 1.0, self.t >= self.length, False, {}


def test_a_reset_observation_holding_nan_is_a_recorded_failure_not_an_observation():
    """A step's NaN observation was a recorded failure but a reset's went on to the normaliser
    and the policy (whose NaN actions were then blamed on it)."""
    if "loomrl-test/NanReset-v0" not in gym.registry:
        gym.register(id="loomrl-test/NanReset-v0", entry_point=_NanReset)
    count = {"resets": 0}
    env = VecEnv(EnvConfig("loomrl-test/NanReset-v0", num_envs=2, env_kwargs={"count": count}))
    assert np.isfinite(env.reset()).all()  # resets 1, 2
    env.step(np.zeros((2, 1), np.float32))
    res = env.step(np.zeros((2, 1), np.float32))  # episodes end; resets 3, 4 give NaN
    assert res.terminated.all() and np.isfinite(res.obs).all()
    events = env.pop_events()
    assert [e.kind for e in events] == ["env_error", "env_recreated"] * 2
    assert "reset returned an observation holding NaN" in events[0].message
    # Every reset NaN from the first: nothing ever worked, and the VecEnv says so at once.
    env = VecEnv(
        EnvConfig("loomrl-test/NanReset-v0", num_envs=1, env_kwargs={"nan_on": range(1, 9)})
    )
    with pytest.raises(ConfigError, match=r"failed on its first reset .*NaN or inf"):
        env.reset()


_DISCRETE_POLICIES = """
from loomrl.policies import make_policy


class _Off(__import__("torch").nn.Module):
    def __init__(self, o, a, seed, fix):
        super().__init__()
        self.inner, self.fix = make_policy(o, a, seed=seed), fix

    def act(self, obs):
        return self.fix(*self.inner.act(obs))

    def evaluate(self, obs, actions):
        return self.inner.evaluate(obs, actions)


def floats(o, a, seed=0):
    return _Off(o, a, seed, lambda a, l, v: (a.float(), l, v))


def past_n(o, a, seed=0):
    return _Off(o, a, seed, lambda a, l, v: (a + 5, l, v))


def right(o, a, seed=0):
    return _Off(o, a, seed, lambda a, l, v: (a, l, v))
"""


def test_a_user_policys_discrete_actions_are_checked_where_the_policy_is_named(
    tmp_path, monkeypatch
):
    """Float or out-of-range Discrete actions had reached the env worker (its error blamed on
    the policy's next call) or, in the cost probe, the PPO update (torch's Categorical support
    error on a tensor dump); now the policy's act() is named with what came and what fits."""
    from loomrl.embodied import PPOConfig
    from loomrl.workers.policy import PolicyWorker

    (tmp_path / "discrete_policies.py").write_text(_DISCRETE_POLICIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    obs = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    act = gym.spaces.Discrete(2)
    reply = {"obs": np.zeros((3, 4), np.float32), "env_ids": np.arange(3)}
    reply["env_steps"] = np.zeros(3, np.int64)
    ppo = PPOConfig(rollout_steps=6, num_minibatches=1)
    for spec, said in [
        ("floats", r"actions of dtype torch.float32 for Discrete\(2\): return integer indices"),
        ("past_n", r"actions from [5-6] to [5-6] for Discrete\(2\), whose actions lie in \[0, 2\)"),
    ]:
        pol = PolicyWorker(obs, act, 3, ppo, 0, policy=f"discrete_policies:{spec}")
        pol.begin(2)
        with pytest.raises(
            ConfigError, match=rf"policy='discrete_policies:{spec}': act\(\) returned {said}"
        ):
            pol.act(0, reply)
    pol = PolicyWorker(obs, act, 3, ppo, 0, policy="discrete_policies:right")
    pol.begin(2)
    (out,) = pol.act(0, reply)
    assert out.shape == (3,) and set(out.tolist()) <= {0, 1}


def test_a_pipe_rollout_stopped_by_an_env_worker_is_one_of_loomrls_own_errors():
    """serve_pipe's HandoffError carries an env worker's error (too many simulator failures,
    say) in its message; as a LoomError the command line says it without serve_pipe's
    traceback, as it does for the same error in a driver-handed rollout."""
    from loomrl.errors import LoomError
    from loomrl.workers.policy import HandoffError

    assert issubclass(HandoffError, LoomError) and issubclass(HandoffError, RuntimeError)


@pytest.mark.parametrize("spec", ["auto", "mlp"])
def test_a_built_in_policy_for_an_action_space_it_cannot_act_in_is_a_config_error(spec):
    """A MultiDiscrete env with policy auto had failed in the policy worker's constructor with
    a TypeError and its traceback."""
    from loomrl.workers.policy import build_policy

    obs = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    with pytest.raises(
        ConfigError,
        match=rf"policy='{spec}': the built-in policies act in Box and Discrete action spaces, "
        r"and the env's is MultiDiscrete\(\[3 2\]\); give policy=package.module:factory",
    ):
        build_policy(spec, obs, gym.spaces.MultiDiscrete([3, 2]), seed=0)


class _OldGymStep(_Still):
    """A step of the old gym API: (obs, reward, done, info)."""

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, {}


def test_an_env_of_the_old_gym_step_api_is_named_so_when_its_failures_stop_it():
    """Each step is a recorded failure (numpy's "not enough values to unpack"); the error that
    stops the VecEnv says which API the step followed and what gymnasium's returns."""
    if "loomrl-test/OldGymStep-v0" not in gym.registry:
        gym.register(id="loomrl-test/OldGymStep-v0", entry_point=_OldGymStep)
    env = VecEnv(EnvConfig("loomrl-test/OldGymStep-v0", num_envs=1, max_failures=2))
    env.reset()
    for _ in range(2):
        assert env.step(np.zeros((1, 1), np.float32)).failed.all()
    with pytest.raises(
        EnvFailureError,
        match=r"unpack \(expected 5, got 4\)\. gymnasium's step\(\) returns 5 values .* old gym "
        r"API: split done into terminated and truncated",
    ):
        env.step(np.zeros((1, 1), np.float32))


def test_the_single_process_trainer_says_a_config_mistake_and_exits_2(capsys):
    """``python -m loomrl.embodied`` with a mistyped env id had ended in a traceback (status 1)."""
    from loomrl.embodied import _main

    with pytest.raises(SystemExit) as e:
        _main(["InvertedPendulm-v5", "--total-steps", "64", "--num-envs", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "num_envs=0: need at least one env" in err
    assert "env_id='InvertedPendulm-v5' is not a registered" in err and "Traceback" not in err


def test_render_mode_human_in_env_kwargs_without_a_display_is_refused_with_the_others(
    monkeypatch,
):
    """It had aborted the env worker's process on a headless node (GLFW's C assertion)."""
    monkeypatch.delenv("DISPLAY", raising=False)
    with pytest.raises(ConfigError) as e:
        EnvConfig(num_envs=0, env_kwargs={"render_mode": "human"})
    assert "env_kwargs.render_mode='human': it opens a window" in str(e.value)
    assert "no display (DISPLAY is unset)" in str(e.value)
    assert "num_envs=0" in str(e.value)
    assert EnvConfig(env_kwargs={"render_mode": "rgb_array"}).env_kwargs  # harmless, kept


@pytest.mark.parametrize(
    "env_id, package, module",
    [
        ("ALE/Pong-v5", "ale-py", "ale_py"),
        ("dm_control/cartpole-balance-v0", "shimmy[dm-control]", "shimmy"),
        ("MiniGrid-Empty-5x5-v0", "minigrid", "minigrid"),
    ],
)
def test_an_env_id_of_a_package_that_registers_on_import_names_the_package(env_id, package, module):
    """Those ids had been told "no close match" and pointed at gymnasium-robotics."""
    from loomrl.envs.vec import check_env_id

    if env_id in gym.registry:
        pytest.skip(f"{module} is imported here: {env_id} is registered")
    with pytest.raises(ConfigError) as e:
        check_env_id(env_id)
    said = str(e.value)
    assert f"pip install {package}" in said and f"env_id: {module}:{env_id}" in said
    # Its module named and imported, yet the id unknown: not told to name the module again.
    with pytest.raises(ConfigError, match="is not a registered gymnasium environment"):
        check_env_id(f"json:{env_id}")


class _NoSize(_Still):
    """Renders 40x40 frames and takes no width or height."""

    def render(self):
        return np.full((40, 40, 3), 7, np.uint8)


def test_a_width_the_user_set_is_never_dropped_silently_when_the_env_takes_none():
    """An env without width/height renders at its own size and is downscaled, but a width the
    user set in env_kwargs used to vanish with it: now it is the env_kwargs error."""
    if "loomrl-test/NoSize-v0" not in gym.registry:
        gym.register(id="loomrl-test/NoSize-v0", entry_point=_NoSize)
    env = VecEnv(EnvConfig("loomrl-test/NoSize-v0", num_envs=1, pixels=True, image_size=16))
    assert env.reset().shape == (1, 3, 16, 16)  # ours dropped: rendered 40x40, downscaled
    env.close()
    cfg = EnvConfig(
        "loomrl-test/NoSize-v0", num_envs=1, pixels=True, image_size=16, env_kwargs={"width": 48}
    )
    with pytest.raises(ConfigError, match=r"env.env_kwargs: \S+ takes no keyword 'width'"):
        VecEnv(cfg).reset()


def _register_spaces(name: str, observation_space=None, action_space=None) -> str:
    """``_Still`` with other spaces, registered as loomrl-test/<name>-v0."""

    class Spaced(_Still):
        def __init__(self, render_mode=None):
            super().__init__(render_mode)
            self.observation_space = observation_space or self.observation_space
            self.action_space = action_space or self.action_space

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return self.observation_space.sample(), {}

    env_id = f"loomrl-test/{name}-v0"
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=Spaced)
    return env_id


@pytest.mark.parametrize(
    "name, observation_space, action_space, said",
    [
        # These stepped with numpy's "inhomogeneous shape" or "Value after * must be an
        # iterable" once a policy acted; a Sequence failed the first reset with gymnasium's words.
        ("TupleAction", None, gym.spaces.Tuple((gym.spaces.Discrete(2),)), "action space Tuple"),
        ("DictAction", None, gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), "action space Dict"),
        ("SeqObs", gym.spaces.Sequence(gym.spaces.Box(-1, 1, (2,))), None, "observation space Seq"),
        (
            "GraphObs",
            gym.spaces.Graph(gym.spaces.Box(-1, 1, (2,)), None),
            None,
            "observation space Graph",
        ),
    ],
)
def test_spaces_the_cycle_cannot_carry_are_a_config_error_when_the_env_is_made(
    name, observation_space, action_space, said
):
    env_id = _register_spaces(name, observation_space, action_space)
    with pytest.raises(ConfigError, match=rf"env_id='{env_id}': its {said}.*wrap the env in a"):
        VecEnv(EnvConfig(env_id, num_envs=2))


@pytest.mark.parametrize(
    "space, bad, said",
    [
        (gym.spaces.MultiDiscrete([3, 4]), [[0.5, 1.0], [1.0, 2.0]], "must be integers"),
        (gym.spaces.MultiDiscrete([3, 4]), [[0, 4], [1, 2]], r"must lie in \[\[0, 0\], \[3, 4\]\)"),
        (gym.spaces.MultiBinary(2), [[0, 2], [1, 1]], r"must lie in \[\[0, 0\], \[2, 2\]\)"),
    ],
)
def test_multi_discrete_and_binary_actions_are_checked_as_discrete_ones_are(space, bad, said):
    """A fraction or an index past the end used to be stepped as whatever the env made of it."""
    env_id = _register_spaces(f"{type(space).__name__}Action", action_space=space)
    env = VecEnv(EnvConfig(env_id, num_envs=2))
    env.reset()
    with pytest.raises(ActionShapeError, match=said):
        env.step(np.array(bad))
    env.step(np.stack([space.sample() for _ in range(2)]))  # still steps


_INT_POLICIES = """
import torch
from torch import nn


class Heads(nn.Module):
    '''One categorical per action element (MultiDiscrete nvec, or a Box's element as two
    choices); ``bend`` turns the sampled actions into what a careless act() returns.'''

    def __init__(self, observation_space, action_space, bend):
        super().__init__()
        self.nvec = [int(n) for n in getattr(action_space, "nvec", [2] * action_space.shape[0])]
        self.lin = nn.Linear(observation_space.shape[0], sum(self.nvec) + 1)
        self.bend = bend

    def _dists(self, obs):
        out = self.lin(obs.float())
        logits = torch.split(out[:, :-1], self.nvec, 1)
        return [torch.distributions.Categorical(logits=x) for x in logits], out[:, -1]

    def act(self, obs):
        ds, v = self._dists(obs)
        a = torch.stack([d.sample() for d in ds], 1)
        logp = sum(d.log_prob(a[:, i]) for i, d in enumerate(ds))
        return self.bend(a), logp, v

    def evaluate(self, obs, action):
        ds, v = self._dists(obs)
        logp = sum(d.log_prob(action[:, i].long()) for i, d in enumerate(ds))
        return logp, sum(d.entropy() for d in ds), v


def right(o, a, seed=0):
    return Heads(o, a, lambda x: x)


def fractions(o, a, seed=0):
    return Heads(o, a, lambda x: x.float() + 0.5)


def past_the_end(o, a, seed=0):
    return Heads(o, a, lambda x: x + 5)


def ints_for_a_box(o, a, seed=0):
    return Heads(o, a, lambda x: x)


not_a_factory = 3


class Duck:
    def act(self, obs): ...
    def evaluate(self, obs, action): ...
    def parameters(self):
        return iter([torch.zeros(1, requires_grad=True)])


def duck(o, a, seed=0):
    return Duck()
"""


def test_a_user_policys_integer_actions_are_checked_against_their_space(tmp_path, monkeypatch):
    """MultiDiscrete actions that were fractions or past the end reached the env (which may take
    anything) and the update (a torch "support" error mid-update); integer actions for a float
    Box were stored as the integers, while act()'s log-probs were of other actions."""
    from loomrl.embodied import PPOConfig
    from loomrl.workers.policy import PolicyWorker

    (tmp_path / "int_policies.py").write_text(_INT_POLICIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    obs = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    reply = {"obs": np.zeros((3, 4), np.float32), "env_ids": np.arange(3)}
    reply["env_steps"] = np.zeros(3, np.int64)
    ppo = PPOConfig(rollout_steps=6, num_minibatches=1)
    md, box = gym.spaces.MultiDiscrete([3, 4]), gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    for act, spec, said in [
        (md, "fractions", r"actions of dtype torch.float32 for MultiDiscrete\(\[3 4\]\)"),
        (md, "past_the_end", r"actions outside MultiDiscrete\(\[3 4\]\)'s bounds, e.g. row 0"),
        (gym.spaces.MultiBinary(2), "past_the_end", r"outside MultiBinary\(2\)'s bounds"),
        (box, "ints_for_a_box", r"actions of dtype torch.int64 for Box.*return the float"),
    ]:
        pol = PolicyWorker(obs, act, 3, ppo, 0, policy=f"int_policies:{spec}")
        pol.begin(2)
        with pytest.raises(ConfigError, match=rf"policy='int_policies:{spec}': act\(\) .*{said}"):
            pol.act(0, reply)
    for act in (md, gym.spaces.MultiBinary(2)):
        good = PolicyWorker(obs, act, 3, ppo, 0, policy="int_policies:right")
        good.begin(2)
        (a,) = good.act(0, reply)
        assert a.shape == (3, 2) and all(act.contains(row) for row in a)


def test_a_factory_that_is_not_callable_or_builds_no_module_is_a_config_error(
    tmp_path, monkeypatch
):
    """functools.partial's "the first argument must be callable" and, later, a missing .to()
    were all a user saw before."""
    from loomrl.workers.policy import build_policy

    (tmp_path / "int_policies.py").write_text(_INT_POLICIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    obs = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    act = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    with pytest.raises(
        ConfigError, match=r"int_policies.not_a_factory is of type int, not a callable"
    ):
        build_policy("int_policies:not_a_factory", obs, act, 0)
    with pytest.raises(ConfigError, match=r"built a Duck, not a torch.nn.Module"):
        build_policy("int_policies:duck", obs, act, 0)


def test_an_unknown_env_id_says_how_to_register_an_env_in_the_workers_too():
    """An env registered in the launching script only is unknown in the env workers: the
    error there says how to have every process register it."""
    from loomrl.envs.vec import check_env_id

    with pytest.raises(ConfigError, match=r"write env_id: package.module:MyScriptEnv-v0"):
        check_env_id("MyScriptEnv-v0")
