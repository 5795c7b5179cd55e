"""VecEnv: seeding, autoreset bookkeeping, episode stats, pixels, errors, failure recovery, offload."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import loomrl.envs.testing  # noqa: F401  (registers loomrl-test/* envs)
from loomrl.envs import (
    ActionShapeError,
    EnvConfig,
    EnvFailureError,
    VecEnv,
    probe_rendering,
)
from loomrl.envs.vec import resize_image
from loomrl.errors import ConfigError, LoomError

PENDULUM = "InvertedPendulum-v5"


def make(env_id: str = PENDULUM, **kw) -> VecEnv:
    return VecEnv(EnvConfig(env_id, **{"num_envs": 2, **kw}))


def test_config_reports_every_problem_together():
    with pytest.raises(ConfigError) as e:
        EnvConfig(num_envs=0, frame_skip=0, render_backend="vulkan")
    msg = str(e.value)
    assert len(e.value.problems) == 3
    assert "num_envs=0" in msg and "frame_skip=0" in msg and "render_backend='vulkan'" in msg


def test_a_negative_seed_is_refused_by_the_config_not_by_gymnasium_in_a_worker():
    with pytest.raises(ConfigError) as e:
        EnvConfig(seed=-1)
    assert e.value.problems == ["seed=-1: must be >= 0 (env i of the batch gets seed + i)"]


def test_same_seed_same_obs_and_env_i_gets_seed_plus_i():
    a, b = make(seed=3, num_envs=3), make(seed=3, num_envs=3)
    first = a.reset()
    np.testing.assert_array_equal(first, b.reset())
    act = np.full((3, 1), 0.5, np.float32)
    np.testing.assert_array_equal(a.step(act).obs, b.step(act).obs)
    single = make(seed=4, num_envs=1).reset()
    np.testing.assert_array_equal(first[1], single[0])  # env 1 of seed 3 == env 0 of seed 4
    assert not np.array_equal(first[0], first[1])
    # A worker holding envs 2..3 of a logical batch behaves like those envs of the full batch.
    full = make(seed=0, num_envs=4).reset()
    part = VecEnv(EnvConfig(PENDULUM, num_envs=2, seed=0), index_offset=2).reset()
    np.testing.assert_array_equal(full[2:], part)


def test_autoreset_yields_the_real_transitions_of_gymnasium_next_step_mode():
    """Same seeds and per-env actions: our same-step transitions == gymnasium's NEXT_STEP vector
    env with its reset steps removed (those ignore the action and are not transitions)."""
    n, k = 3, 60
    rng = np.random.default_rng(0)
    actions = rng.uniform(-3, 3, (n, 200, 1)).astype(np.float32)

    ours = make(seed=7, num_envs=n)
    prev = ours.reset()
    mine: list[list[tuple]] = [[] for _ in range(n)]
    for t in range(k):
        r = ours.step(actions[:, t])
        for i in range(n):
            mine[i].append((prev[i], r.reward[i], r.terminated[i], r.truncated[i], r.final_obs[i]))
        prev = r.obs

    ref = gym.vector.SyncVectorEnv(
        [lambda: gym.make(PENDULUM) for _ in range(n)],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )
    obs, _ = ref.reset(seed=7)
    theirs: list[list[tuple]] = [[] for _ in range(n)]
    used = np.zeros(n, int)
    resetting = np.zeros(n, bool)
    while min(len(x) for x in theirs) < k:
        a = np.stack([actions[i, used[i]] for i in range(n)])
        nobs, rew, term, trunc, _ = ref.step(a)
        for i in range(n):
            if resetting[i]:
                continue  # the reset step: reward 0, action ignored, no transition
            theirs[i].append((obs[i], rew[i], term[i], trunc[i], nobs[i]))
            used[i] += 1
        resetting = term | trunc
        obs = nobs
    for i in range(n):
        assert sum(t[2] for t in mine[i]) >= 2, "test needs episodes that end"
        for m, r in zip(mine[i], theirs[i][:k], strict=True):
            np.testing.assert_allclose(m[0], r[0], rtol=1e-6)
            assert m[1] == pytest.approx(r[1]) and m[2] == r[2] and m[3] == r[3]
            np.testing.assert_allclose(m[4], r[4], rtol=1e-6)


def test_done_step_records_final_obs_and_returns_reset_obs():
    env = make("loomrl-test/Counting-v0", env_kwargs={"length": 3})
    env.reset()
    one = np.zeros((2, 1), np.float32)
    env.step(one)
    env.step(one)
    r = env.step(one)
    assert r.terminated.all() and not r.truncated.any()
    np.testing.assert_array_equal(r.final_obs, [[0, 3], [0, 3]])  # terminal obs of episode 0
    np.testing.assert_array_equal(r.obs, [[1, 0], [1, 0]])  # reset obs of episode 1
    r = env.step(one)  # the next step is a real transition of episode 1
    assert (r.reward == 1).all()
    np.testing.assert_array_equal(r.obs, [[1, 1], [1, 1]])


def test_episode_stats_count_and_pop():
    env = make("loomrl-test/Counting-v0", num_envs=4, env_kwargs={"length": 5})
    env.reset()
    for _ in range(12):
        env.step(np.zeros((4, 1), np.float32))
    s = env.pop_episode_stats()
    assert s.returns == [5.0] * 8 and s.lengths == [5] * 8
    assert env.pop_episode_stats().returns == []


def test_frame_skip_sums_rewards_and_stops_at_episode_end():
    env = make("loomrl-test/Counting-v0", frame_skip=2, env_kwargs={"length": 3})
    env.reset()
    r = env.step(np.zeros((2, 1), np.float32))
    assert (r.reward == 2).all() and not r.terminated.any()
    r = env.step(np.zeros((2, 1), np.float32))
    assert (r.reward == 1).all() and r.terminated.all()
    assert env.pop_episode_stats().lengths == [2, 2]  # lengths count agent steps


def test_unknown_env_id_lists_close_matches():
    with pytest.raises(ConfigError, match=r"env_id='HalfCheeta-v5'.*close matches: HalfCheetah-v5"):
        make("HalfCheeta-v5")


def test_a_keyword_the_env_does_not_take_is_a_config_error_naming_env_kwargs():
    with pytest.raises(ConfigError, match=r"env.env_kwargs: \S+ takes no keyword 'lenght' \(given"):
        make("loomrl-test/Counting-v0", env_kwargs={"lenght": 50})
    make("loomrl-test/Counting-v0", env_kwargs={"length": 50}).close()


def test_a_fetch_id_is_found_without_gymnasium_robotics_notices_on_stderr():
    # In a fresh process: the notice comes with the package's first import only.
    import subprocess
    import sys

    code = (
        "from loomrl.envs.vec import check_env_id\n"
        "check_env_id('FetchReach-v4')\n"
        "try:\n"
        "    check_env_id('FetchReac-v4')\n"
        "except Exception as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "close matches: FetchReach-v4" in out.stdout
    assert out.stderr == ""


_MADE = []  # instances of _Unmakeable made so far (the test below clears it)


class _Unmakeable(loomrl.envs.testing.CountingEnv):
    """Fails its first step, then its reset; a third instance cannot be made at all."""

    def __init__(self):
        if len(_MADE) >= 2:
            raise RuntimeError("simulator library gone")
        _MADE.append(self)
        super().__init__(fail_on=(1,))
        self.failed = False

    def step(self, action):
        self.failed = self.total == 0
        return super().step(action)

    def reset(self, *, seed=None, options=None):
        if getattr(self, "failed", False):
            raise RuntimeError("reset exploded")
        return super().reset(seed=seed, options=options)


def test_an_env_that_can_be_neither_reset_nor_made_again_stops_the_vec_env_by_name():
    _MADE.clear()
    if "loomrl-test/Unmakeable-v0" not in gym.registry:
        gym.register(id="loomrl-test/Unmakeable-v0", entry_point=_Unmakeable)
    env = make("loomrl-test/Unmakeable-v0", max_failures=100)
    env.reset()
    with pytest.raises(EnvFailureError, match=r"env 0 failed, its reset failed, and a new") as e:
        env.step(np.zeros((2, 1), np.float32))
    assert "simulator library gone" in str(e.value)
    with pytest.raises(EnvFailureError, match="a new simulator could not be made"):
        env.step(np.zeros((2, 1), np.float32))  # not a half-stepped env's second step
    with pytest.raises(EnvFailureError, match="a new simulator could not be made"):
        env.reset()


def test_wrong_action_shape_names_expected_and_given():
    env = make(num_envs=2)
    env.reset()
    with pytest.raises(
        ActionShapeError, match=r"shape \(2,\) but InvertedPendulum-v5 needs \(2, 1\)"
    ):
        env.step(np.zeros(2, np.float32))
    with pytest.raises(ActionShapeError, match="NaN"):
        env.step(np.full((2, 1), np.nan, np.float32))


def test_discrete_actions_checked():
    env = make("CartPole-v1")
    env.reset()
    with pytest.raises(ActionShapeError, match="integers"):
        env.step(np.zeros(2, np.float32))
    with pytest.raises(ActionShapeError, match=r"\[0, 2\)"):
        env.step(np.array([0, 2]))
    assert env.step(np.array([0, 1])).obs.shape == (2, 4)


def test_failing_env_is_recorded_reset_and_training_goes_on():
    env = make("loomrl-test/Counting-v0", num_envs=2, env_kwargs={"length": 10, "fail_on": (3,)})
    env.reset()
    results = [env.step(np.zeros((2, 1), np.float32)) for _ in range(5)]
    failed = results[2]
    assert failed.failed.all() and (failed.reward == 0).all()
    np.testing.assert_array_equal(failed.final_obs, [[0, 2], [0, 2]])  # obs before the failing step
    np.testing.assert_array_equal(failed.obs, [[1, 0], [1, 0]])  # a fresh episode
    assert [e.kind for e in env.events] == ["env_error", "env_error"]
    assert env.events[0].env_index == 0 and env.events[1].env_index == 1
    assert "exploded at step 3" in env.events[0].message
    np.testing.assert_array_equal(results[4].obs, [[1, 2], [1, 2]])  # and it keeps going
    assert env.pop_episode_stats().returns == []  # a failed episode is not a finished one


def test_repeated_failures_raise_a_clear_error():
    env = make("loomrl-test/Counting-v0", num_envs=1, max_failures=3, env_kwargs={"fail_from": 2})
    env.reset()
    with pytest.raises(
        EnvFailureError, match=r"4 simulator failures within the last 1000 steps \(max_failures=3\)"
    ):
        for _ in range(10):
            env.step(np.zeros((1, 1), np.float32))


def test_an_env_whose_new_simulator_fails_to_reset_too_is_named():
    # Step 2 fails, its reset fails, a new simulator is made and its first reset fails too.
    budget = {"left": 1}
    env = make(
        "loomrl-test/Counting-v0",
        num_envs=1,
        env_kwargs={"fail_on": (2,), "reset_budget": budget},
    )
    env.reset()
    env.step(np.zeros((1, 1), np.float32))
    with pytest.raises(EnvFailureError, match=r"env 0 failed, its reset failed, and the new "):
        env.step(np.zeros((1, 1), np.float32))
    with pytest.raises(EnvFailureError, match="failed to reset too"):  # and on every later call
        env.step(np.zeros((1, 1), np.float32))


def test_an_observation_of_the_wrong_shape_names_the_env_and_both_shapes():
    env = make("loomrl-test/Counting-v0", num_envs=2, env_kwargs={"bad_obs_on": (2,)})
    env.reset()
    env.step(np.zeros((2, 1), np.float32))
    with pytest.raises(
        EnvFailureError, match=r"env 0 returned an observation of shape \[3\] .* declares \[2\]"
    ):
        env.step(np.zeros((2, 1), np.float32))


def test_too_many_failures_are_raised_after_the_whole_step():
    # Three envs fail in one step with max_failures=1: the error comes once every env has
    # stepped, each failure recorded, the step's result kept on the error.
    env = make("loomrl-test/Counting-v0", num_envs=3, max_failures=1, env_kwargs={"fail_on": (2,)})
    env.reset()
    env.step(np.zeros((3, 1), np.float32))
    with pytest.raises(EnvFailureError, match=r"3 simulator failures") as e:
        env.step(np.zeros((3, 1), np.float32))
    assert [ev.env_index for ev in env.events] == [0, 1, 2]
    result = e.value.step_result
    assert result.failed.all()
    np.testing.assert_array_equal(result.obs, [[1, 0], [1, 0], [1, 0]])  # all recovered
    assert e.value.__cause__ is not None and "exploded at step 2" in str(e.value.__cause__)


def test_failures_outside_the_window_are_forgotten():
    env = make(
        "loomrl-test/Counting-v0",
        num_envs=1,
        max_failures=1,
        failure_window=3,
        env_kwargs={"fail_on": (2, 6, 10)},
    )
    env.reset()
    for _ in range(12):
        env.step(np.zeros((1, 1), np.float32))
    assert len(env.events) == 3


def test_offload_onload_is_deterministic_and_continues_the_rng():
    def run(offload_at: int | None) -> list[np.ndarray]:
        env = make(seed=5, num_envs=2)
        out = [env.reset()]
        for t in range(8):
            if t == offload_at:
                env.offload()
                with pytest.raises(LoomError, match="offloaded"):
                    env.step(np.zeros((2, 1), np.float32))
                env.onload()
                out.append(env.obs)
            out.append(env.step(np.full((2, 1), 0.1, np.float32)).obs)
        return out

    a, b = run(4), run(4)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    # After onload each env starts a new episode from its continued RNG stream, not a reseed.
    assert not np.allclose(a[5], a[0])
    env = make(seed=5, num_envs=2)
    env.reset()
    for _ in range(4):
        env.step(np.full((2, 1), 0.1, np.float32))
    np.testing.assert_array_equal(env.reset(), a[5])  # same as resetting at that point


def test_an_envs_own_image_observations_stay_images_channels_first():
    """A uint8 Box of 3 dims is an image: the VecEnv keeps it (as [C, H, W], the layout of
    rendered pixels) for the CNN, rather than flattening 20 x 24 x 3 numbers for an MLP."""
    from loomrl.envs.vec import image_axes
    from loomrl.workers.policy import build_policy

    env = make("loomrl-test/ImageObs-v0", num_envs=2)
    assert env.single_observation_space == gym.spaces.Box(0, 255, (3, 20, 24), np.uint8)
    obs = env.reset()
    assert obs.shape == (2, 3, 20, 24) and obs.dtype == np.uint8
    raw = env._slots[1].env.unwrapped._obs()
    assert np.array_equal(obs[1], raw.transpose(2, 0, 1))
    res = env.step(np.zeros((2, 2), np.float32))
    assert res.obs.shape == (2, 3, 20, 24) and res.obs.dtype == np.uint8
    assert np.array_equal(res.obs[1], env._slots[1].env.unwrapped._obs().transpose(2, 0, 1))
    net = build_policy("auto", env.single_observation_space, env.single_action_space, 0)
    assert type(net).__name__ == "CNNActorCritic"
    # Channels first stay as they are; other boxes (not uint8, or no channel axis) flatten.
    box = gym.spaces.Box
    assert image_axes(box(0, 255, (3, 20, 24), np.uint8)) == (0, 1, 2)
    assert image_axes(box(0, 255, (20, 24, 4), np.uint8)) == (2, 0, 1)
    assert image_axes(box(0, 255, (20, 24, 7), np.uint8)) is None
    assert image_axes(box(0.0, 1.0, (20, 24, 3), np.float32)) is None
    assert image_axes(box(0, 255, (20, 24), np.uint8)) is None


def test_dict_observations_are_flattened():
    env = make("loomrl-test/DictObs-v0")
    obs = env.reset()
    assert obs.shape == (2, 10) and obs.dtype == np.float32
    assert env.single_observation_space.shape == (10,)


def test_cpu_cores_declared():
    assert make(cpu_cores=0.5).cpu_cores == 0.5


def test_resize_image_area_average_to_chw():
    img = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3)
    out = resize_image(img, 2)
    assert out.shape == (3, 2, 2) and out.dtype == np.uint8
    # top-left 2x2 block of channel 0 holds 0, 3, 12, 15 -> mean 7.5 -> rounds to 8
    assert out[0, 0, 0] == 8


_render_problem = probe_rendering("egl", timeout_s=60)


@pytest.mark.skipif(
    _render_problem is not None, reason=f"headless EGL rendering unavailable: {_render_problem}"
)
def test_pixel_observations_are_uint8_chw():
    env = make(pixels=True, image_size=48)
    obs = env.reset()
    assert obs.shape == (2, 3, 48, 48) and obs.dtype == np.uint8
    assert obs.std() > 0, "rendered frames should not be blank"
    r = env.step(np.zeros((2, 1), np.float32))
    assert r.obs.shape == r.final_obs.shape == (2, 3, 48, 48)
    env.close()


def test_fetch_reach_flattens_dict_observations():
    try:
        env = make("FetchReach-v4")
    except LoomError as e:  # gymnasium-robotics missing or incompatible with this mujoco
        pytest.skip(f"FetchReach-v4 unavailable here: {str(e)[:300]}")
    obs = env.reset()
    assert obs.shape == (2, 16)
    r = env.step(np.zeros((2, 4), np.float32))
    assert r.obs.shape == (2, 16)


def test_pixel_env_workers_render_on_the_gpu_they_are_placed_on():
    from loomrl.workers.env import egl_device_for

    assert egl_device_for("1", {}) == "1"
    assert egl_device_for("3,2", {}) == "3"  # the worker's first GPU
    # Set by the user: theirs wins; nothing visible (CPU slots) or GPU UUIDs: nothing to set.
    assert egl_device_for("1", {"MUJOCO_EGL_DEVICE_ID": "0"}) is None
    assert egl_device_for(None, {}) is None and egl_device_for("", {}) is None
    assert egl_device_for("GPU-8a1f", {}) is None


class _Weighted(gym.Env):
    """Scales its reward by ``weight`` from step ``from_step`` on (counted per instance), as
    MuJoCo envs scale theirs by keywords such as ``forward_reward_weight``: a weight given as
    text raises the TypeError a simulator would, on the step it is first used."""

    def __init__(self, weight: float = 1.0, from_step: int = 1):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.weight, self.from_step, self.total = weight, from_step, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.total += 1
        reward = self.weight * 1.0 if self.total >= self.from_step else 0.0
        return np.zeros(2, np.float32), reward, False, False, {}


def _weighted(**kw) -> VecEnv:
    if "loomrl-test/Weighted-v0" not in gym.registry:
        gym.register(id="loomrl-test/Weighted-v0", entry_point=_Weighted)
    return make("loomrl-test/Weighted-v0", **kw)


def test_env_kwargs_that_break_the_first_step_are_a_config_error_naming_them():
    """HalfCheetah-v5 with forward_reward_weight='abc' raised on every step, and the run ended
    after max_failures of them blaming the environment. Nothing ever worked, so the keywords are
    the likely cause: said at once, with the keys, values and their types."""
    env = _weighted(env_kwargs={"weight": "abc"})
    env.reset()
    with pytest.raises(ConfigError) as e:
        env.step(np.zeros((2, 1), np.float32))
    msg = str(e.value)
    assert "env.env_kwargs: loomrl-test/Weighted-v0 env 0 failed on its first step" in msg
    assert "{'weight': 'abc' (str)}" in msg and "TypeError" in msg
    assert not env.events  # not counted as an env failure
    # The other envs may be half-stepped: every later call says the same.
    with pytest.raises(ConfigError, match="env.env_kwargs"):
        env.step(np.zeros((2, 1), np.float32))
    with pytest.raises(ConfigError, match="env.env_kwargs"):
        env.reset()
    # The same env with a number steps on.
    ok = _weighted(env_kwargs={"weight": 2.0})
    ok.reset()
    assert (ok.step(np.zeros((2, 1), np.float32)).reward == 2.0).all()


def test_an_env_kwarg_that_yaml_read_as_text_is_named_with_the_number_to_write():
    """env.env_kwargs={weight: 1e-3} reaches the env as the text '1e-3' (YAML 1.1 wants a dot);
    the error said "a number given as text?" without saying how to give it as a number."""
    env = _weighted(env_kwargs={"weight": "1e-3"})
    env.reset()
    with pytest.raises(ConfigError) as e:
        env.step(np.zeros((2, 1), np.float32))
    assert (
        "{'weight': '1e-3' (str: YAML reads 1e-3, with no dot, as text; write 1.0e-3 for the "
        "number)}" in str(e.value)
    )


def test_env_kwargs_that_break_the_first_reset_are_a_config_error_naming_them():
    env = make("loomrl-test/Counting-v0", env_kwargs={"reset_budget": {"left": 0}})
    with pytest.raises(ConfigError, match=r"env 0 failed on its first reset with env_kwargs"):
        env.reset()


def _baked(env_id: str, **settings) -> str:
    """Register ``env_id``: a CountingEnv with ``settings`` built in, so that a VecEnv makes it
    without env_kwargs."""
    if env_id not in gym.registry:
        cls = type("_Baked", (loomrl.envs.testing.CountingEnv,), {})
        cls.__init__ = lambda self: loomrl.envs.testing.CountingEnv.__init__(self, **settings)
        gym.register(id=env_id, entry_point=cls)
    return env_id


def test_without_env_kwargs_a_first_step_failure_is_counted_as_before():
    env = make(_baked("loomrl-test/FailsFirst-v0", fail_on=(1,)))
    env.reset()
    assert env.step(np.zeros((2, 1), np.float32)).failed.all()
    assert [e.kind for e in env.events] == ["env_error", "env_error"]


def test_env_kwargs_failing_mid_episode_are_counted_and_named_in_the_error():
    # A keyword first used on step 3: failures are counted as before, and the error that ends
    # the run points at env.env_kwargs, with the values given.
    env = _weighted(num_envs=1, max_failures=1, env_kwargs={"weight": "abc", "from_step": 3})
    env.reset()
    env.step(np.zeros((1, 1), np.float32))
    env.step(np.zeros((1, 1), np.float32))
    assert env.step(np.zeros((1, 1), np.float32)).failed.all()  # counted, recovered
    with pytest.raises(EnvFailureError) as e:
        for _ in range(3):
            env.step(np.zeros((1, 1), np.float32))
    msg = str(e.value)
    assert "simulator failures within the last" in msg
    assert (
        "A TypeError there often means a value of the wrong type or range in env.env_kwargs" in msg
    )
    assert "'weight': 'abc' (str)" in msg and "'from_step': 3 (int)" in msg


def test_env_failures_name_env_kwargs_only_where_given():
    env = make("loomrl-test/Counting-v0", num_envs=1, max_failures=1, env_kwargs={"fail_from": 2})
    env.reset()
    with pytest.raises(EnvFailureError) as e:
        for _ in range(4):
            env.step(np.zeros((1, 1), np.float32))
    # A RuntimeError with keywords given: they are named, but not as the likely cause.
    assert "env.env_kwargs were given ({'fail_from': 2 (int)}): check them too" in str(e.value)
    bare = make(_baked("loomrl-test/FailsFrom2-v0", fail_from=2), num_envs=1, max_failures=1)
    bare.reset()
    with pytest.raises(EnvFailureError) as e:
        for _ in range(4):
            bare.step(np.zeros((1, 1), np.float32))
    assert "env_kwargs" not in str(e.value)


def test_env_config_refuses_nan_and_infinite_cpu_cores_and_reports_the_env_id_with_the_rest():
    for bad in (float("nan"), float("inf"), 0.0):
        with pytest.raises(ConfigError, match=rf"cpu_cores={bad}: .* positive, finite share"):
            EnvConfig(cpu_cores=bad)
    # A section that fails is never validated by the recipe, which checks the id: checked here.
    with pytest.raises(ConfigError) as e:
        EnvConfig("InvertedPendulm-v5", num_envs=0)
    assert len(e.value.problems) == 2
    assert "close matches: InvertedPendulum-v5" in e.value.problems[1]


def test_episodes_from_several_workers_and_ring_groups_merge_in_the_order_they_ended():
    """The recipe's window of recent returns must not depend on the placement: episodes popped
    from two env workers (one stepping its ring groups a step apart) and merged come out in
    the order one worker holding every env records them."""
    from loomrl.cycle import merge_episodes
    from loomrl.workers.env import EnvWorker

    n, steps = 4, 120
    rng = np.random.default_rng(3)
    actions = rng.uniform(-3, 3, (steps, n, 1)).astype(np.float32)
    full = make(seed=5, num_envs=n)
    full.reset()
    for t in range(steps):
        full.step(actions[t])
    whole = full.pop_episode_stats()
    assert len(set(whole.lengths)) > 2  # episodes of many lengths: their order shows

    a = VecEnv(EnvConfig(PENDULUM, num_envs=2, seed=5), index_offset=0)
    b = VecEnv(EnvConfig(PENDULUM, num_envs=2, seed=5), index_offset=2)
    a.reset(), b.reset()
    for t in range(steps):  # b's second group runs one step behind its first
        a.step(actions[t, 0:2])
        b.step(actions[t, 2:3], slice(0, 1))
        if t:
            b.step(actions[t - 1, 3:4], slice(1, 2))
    b.step(actions[-1, 3:4], slice(1, 2))

    def stats(v: VecEnv) -> dict:
        w = object.__new__(EnvWorker)  # its pop_stats, on this process's VecEnv
        w.venv, w.busy_s, w.wait_s, w.calls = v, 0.0, 0.0, 0
        return w.pop_stats()

    returns, lengths, _ = merge_episodes([stats(b), stats(a)])  # b's reply came first
    assert returns == whole.returns and lengths == whole.lengths


def test_an_env_config_built_in_python_with_values_of_the_wrong_type_is_a_config_error():
    """The loader converts a file's values; a config built in Python may hold text for numbers
    or for a switch ("no" is truthy): each is named with its type, not a TypeError."""
    with pytest.raises(ConfigError) as e:
        EnvConfig(PENDULUM, num_envs="8", seed=1.5, pixels="no", max_episode_steps=True)
    assert e.value.problems == [
        "num_envs='8': must be a whole number, got str",
        "seed=1.5: must be a whole number, got float",
        "max_episode_steps=True: must be a whole number, got bool",
        "pixels='no': must be True or False, got str",
    ]
    EnvConfig(PENDULUM, num_envs=np.int64(4), max_episode_steps=None, pixels=np.bool_(False))


def test_an_env_whose_reset_fails_after_its_episode_ended_is_made_again_and_recorded():
    # Episodes of 2 steps; each simulator's third reset raises (the one after its second
    # episode). The step that ended the episode is real; the env gets a new simulator.
    env = make(
        "loomrl-test/Counting-v0", num_envs=2, env_kwargs={"length": 2, "fail_reset_on": (3,)}
    )
    env.reset()
    a = np.zeros((2, 1), np.float32)
    results = [env.step(a) for _ in range(5)]
    ended = results[3]  # the second episode's last step: its reset raised
    assert ended.terminated.all() and not ended.failed.any()
    np.testing.assert_array_equal(ended.final_obs, [[1, 2], [1, 2]])
    np.testing.assert_array_equal(ended.obs, [[1, 0], [1, 0]])  # a new simulator's episode
    assert [(e.kind, e.env_index) for e in env.events] == [
        ("env_error", 0),
        ("env_recreated", 0),
        ("env_error", 1),
        ("env_recreated", 1),
    ]
    assert "reset after its episode ended" in env.events[0].message
    assert "reset 3 exploded" in env.events[0].message
    assert env.pop_episode_stats().returns == [2.0] * 4  # both envs' episodes, and on it goes
    np.testing.assert_array_equal(results[4].obs, [[1, 1], [1, 1]])


class _NonFinite(loomrl.envs.testing.CountingEnv):
    """Counting, with a NaN observation on its 2nd step and an infinite reward on its 4th."""

    def step(self, action):
        obs, r, te, tr, info = super().step(action)
        if self.total == 2:
            obs = obs * np.nan
        if self.total == 4:
            r = float("inf")
        return obs, r, te, tr, info


def test_a_nan_observation_or_infinite_reward_is_a_recorded_failure_not_data():
    # Passed on, one NaN would make the observation normaliser's mean NaN for good, and the
    # policy's next actions NaN (reported as the policy's fault).
    results, messages = _five_steps_of(_NonFinite)
    assert not results[0].failed.any() and not results[2].failed.any()
    np.testing.assert_array_equal(results[1].obs, [[1, 0], [1, 0]])  # reset, a new episode
    assert len(messages) == 4 and "observation holding NaN" in messages[0]
    assert "reward of inf" in messages[2]


class _OddNaN(loomrl.envs.testing.CountingEnv):
    """Counting; the env of an odd seed gives a NaN observation on its 2nd step."""

    def step(self, action):
        obs, r, te, tr, info = super().step(action)
        if self.total == 2 and self.unwrapped.np_random_seed % 2 == 1:
            obs = obs * np.nan
        return obs, r, te, tr, info


def test_one_env_s_nan_observation_fails_that_env_alone_in_a_batch():
    # The batch's observations are checked together: the good rows stay, the bad one fails.
    if "loomrl-test/OddNaN-v0" not in gym.registry:
        gym.register(id="loomrl-test/OddNaN-v0", entry_point=_OddNaN)
    env = make("loomrl-test/OddNaN-v0", num_envs=4, env_kwargs={"length": 10})
    env.reset()
    env.step(np.zeros((4, 1), np.float32))
    r = env.step(np.zeros((4, 1), np.float32))
    assert r.failed.tolist() == [False, True, False, True]
    np.testing.assert_array_equal(r.obs, [[0, 2], [1, 0], [0, 2], [1, 0]])
    np.testing.assert_array_equal(r.final_obs, [[0, 2], [0, 1], [0, 2], [0, 1]])
    assert [(e.kind, e.env_index) for e in env.events if e.kind == "env_error"] == [
        ("env_error", 1),
        ("env_error", 3),
    ]


def test_checking_observations_as_a_batch_gives_what_env_by_env_gives():
    # Hopper-v5 falls over, so episodes end and reset inside the steps compared.
    fast, slow = make("Hopper-v5", num_envs=4, seed=3), make("Hopper-v5", num_envs=4, seed=3)
    assert fast._flat_box == (11,)
    slow._flat_box = None  # the observations checked and flattened env by env
    fast.reset(), slow.reset()
    rng = np.random.default_rng(0)
    for _ in range(60):
        a = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
        x, y = fast.step(a), slow.step(a)
        for field in ("obs", "final_obs", "reward", "terminated", "truncated", "failed"):
            np.testing.assert_array_equal(getattr(x, field), getattr(y, field))
        assert x.obs.dtype == np.float32 and x.final_obs.dtype == np.float32
    ends = fast.pop_episode_stats()
    assert ends.lengths and ends.lengths == slow.pop_episode_stats().lengths


def _five_steps_of(env_class: type) -> tuple[list, list[str]]:
    """Five steps of two envs of ``env_class`` (whose 2nd and 4th steps go wrong): the results,
    checked to hold only finite numbers with both bad steps failed, and the events' messages."""
    env_id = f"loomrl-test/{env_class.__name__.strip('_')}-v0"
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=env_class)
    env = make(env_id, num_envs=2, env_kwargs={"length": 10})
    env.reset()
    results = [env.step(np.zeros((2, 1), np.float32)) for _ in range(5)]
    for r in results:
        assert np.isfinite(r.obs).all() and np.isfinite(r.final_obs).all()
        assert np.isfinite(r.reward).all()
    assert results[1].failed.all() and results[3].failed.all()
    return results, [e.message for e in env.events]


class _FirstResetFails(loomrl.envs.testing.CountingEnv):
    """Counting, whose first simulator made (since ``made`` was set to 0) fails every reset."""

    made = 0

    def __init__(self, **kw):
        super().__init__(**kw)
        type(self).made += 1
        self.bad = type(self).made == 1

    def reset(self, *, seed=None, options=None):
        if self.bad:
            raise RuntimeError("reset exploded")
        return super().reset(seed=seed, options=options)


def test_an_env_whose_first_reset_fails_is_made_again_with_its_seed_and_recorded():
    # A flaky first reset, without env_kwargs (with them it is a ConfigError naming them).
    if "loomrl-test/FirstResetFails-v0" not in gym.registry:
        gym.register(id="loomrl-test/FirstResetFails-v0", entry_point=_FirstResetFails)
    _FirstResetFails.made = 0
    env = VecEnv(EnvConfig("loomrl-test/FirstResetFails-v0", num_envs=2, seed=5))
    obs = env.reset()
    np.testing.assert_array_equal(obs, [[0, 0], [0, 0]])
    assert [(e.kind, e.env_index) for e in env.events] == [("env_error", 0), ("env_recreated", 0)]
    assert "reset: RuntimeError: reset exploded" in env.events[0].message
    # the new simulator started from seed + 0, as the first would have
    assert env._slots[0].env.unwrapped.np_random_seed == 5
    assert env.step(np.zeros((2, 1), np.float32)).obs.tolist() == [[0, 1], [0, 1]]


class _PastFloat32(loomrl.envs.testing.CountingEnv):
    """Counting, with an observation past float32's range on its 2nd step and such a reward on
    its 4th: finite as float64, inf in the float32 the buffers keep."""

    def step(self, action):
        obs, r, te, tr, info = super().step(action)
        if self.total == 2:
            obs = obs.astype(np.float64) + 1e39
        if self.total == 4:
            r = 1e39
        return obs, r, te, tr, info


def test_numbers_past_float32_s_range_are_recorded_failures_as_inf_is():
    _, messages = _five_steps_of(_PastFloat32)
    assert len(messages) == 4 and "past float32's range" in messages[0]
    assert "reward of 1e+39 (past float32's range" in messages[2]
