"""Pixels drawn in one pass (loomrl.envs.render) give exactly the frames of env-by-env rendering."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from loomrl.envs import EnvConfig, VecEnv, probe_rendering
from loomrl.envs.render import TiledRenderer, tileable

_render_problem = probe_rendering("egl", timeout_s=60)
pytestmark = pytest.mark.skipif(
    _render_problem is not None, reason=f"headless EGL rendering unavailable: {_render_problem}"
)


def _pendulum_cls():
    from gymnasium.envs.mujoco.inverted_pendulum_v5 import InvertedPendulumEnv

    return InvertedPendulumEnv


def _flaky_pendulum(fail_on=(), reset_fails_after_failure=False, **kw):
    """InvertedPendulum that raises on the given step numbers (per instance, from 1); with
    ``reset_fails_after_failure`` its reset then raises too, so the env is recreated."""

    class Flaky(_pendulum_cls()):
        def __init__(self, **k):
            super().__init__(**k)
            self.total, self.failed_once = 0, False

        def step(self, action):
            self.total += 1
            if self.total in fail_on:
                self.failed_once = True
                raise RuntimeError(f"simulator exploded at step {self.total}")
            return super().step(action)

        def reset(self, **k):
            if reset_fails_after_failure and self.failed_once:
                raise RuntimeError("reset exploded")
            return super().reset(**k)

    return Flaky(**kw)


def _marked_pendulum(**kw):
    """InvertedPendulum whose render() does more than draw (like Fetch moving its goal marker)."""

    class Marked(_pendulum_cls()):
        def render(self):
            return super().render()

    return Marked(**kw)


for _id, _entry in (
    ("loomrl-test/FlakyPendulum-v0", _flaky_pendulum),
    ("loomrl-test/MarkedPendulum-v0", _marked_pendulum),
):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry, max_episode_steps=1000)


def pair(batch_render=False, **kw) -> tuple[VecEnv, VecEnv]:
    """A batched VecEnv and one rendering env by env (or batched too), built alike."""
    base = {"env_id": "InvertedPendulum-v5", "num_envs": 5, "pixels": True, "image_size": 64}
    base.update(kw)
    return VecEnv(EnvConfig(**base)), VecEnv(EnvConfig(**base, batch_render=batch_render))


# Frames drawn at another place in the buffer round a few edge pixels differently (measured on
# Mesa: about 1 value in 100,000); this bounds the share of differing values, not their size.
MAX_DIFFERING_SHARE = 1e-3


def run_both(a: VecEnv, b: VecEnv, steps: int, groups_a=(None,), groups_b=(None,)) -> dict:
    """Step both with the same actions (each in its own groups); compare every frame."""
    rng = np.random.default_rng(0)
    frames = [(a.reset(), b.reset())]
    ended, physics_equal = 0, True
    for _ in range(steps):
        act = rng.uniform(-3, 3, (a.num_envs, 1)).astype(np.float32)
        out = []
        for env, groups in ((a, groups_a), (b, groups_b)):
            parts = [env.step(act[g if g is not None else slice(None)], g) for g in groups]
            out.append(
                {
                    f: np.concatenate([getattr(r, f) for r in parts])
                    for f in ("obs", "final_obs", "reward", "done")
                }
            )
        ra, rb = out
        frames += [(ra["obs"], rb["obs"]), (ra["final_obs"], rb["final_obs"])]
        physics_equal &= np.array_equal(ra["reward"], rb["reward"])
        physics_equal &= np.array_equal(ra["done"], rb["done"])
        ended += int(ra["done"].sum())
    differing = sum(int((x != y).sum()) for x, y in frames)
    return {
        "ended": ended,
        "physics_equal": physics_equal,
        "identical": differing == 0,
        "differing_share": differing / sum(x.size for x, _ in frames),
    }


def test_batched_frames_match_env_by_env_frames_across_episode_ends():
    a, b = pair()
    assert a.render_path == "batched"
    assert b.render_path == "env by env: batch_render is off"
    assert a._tiles.cols == 3 and a._tiles.rows == 2  # 5 envs: a grid with an empty cell
    got = run_both(a, b, steps=40)
    assert got["ended"] > 0, "random actions should end some episodes, exercising reset frames"
    assert got["physics_equal"]
    assert got["differing_share"] < MAX_DIFFERING_SHARE, got
    assert len({f.tobytes() for f in a.obs}) == a.num_envs, "envs must not share one frame"
    a.close(), b.close()


def test_batched_frames_do_not_depend_on_the_ring_groups():
    # A ring group draws only its envs; each env keeps its cell, so its frames are exactly those
    # of the whole batch drawn at once (pipelined and unpipelined cycles see the same pixels).
    a, b = pair(batch_render=True, num_envs=6)
    got = run_both(a, b, steps=30, groups_a=(slice(0, 2), slice(2, 4), slice(4, 6)))
    assert got["ended"] > 0 and got["physics_equal"]
    assert got["identical"], got
    a.close(), b.close()


def test_batched_frames_after_offload_and_onload():
    a, b = pair(num_envs=4)
    run_both(a, b, steps=10)
    for env in (a, b):
        env.offload()
        env.onload()
    assert a.render_path == "batched"
    got = run_both(a, b, steps=10)
    assert got["physics_equal"] and got["differing_share"] < MAX_DIFFERING_SHARE, got
    a.close(), b.close()


def test_failing_env_is_recovered_with_the_same_frames():
    kw = {"env_id": "loomrl-test/FlakyPendulum-v0", "env_kwargs": {"fail_on": (3, 7)}}
    a, b = pair(**kw)
    assert a.render_path == "batched"
    got = run_both(a, b, steps=10)
    assert got["physics_equal"] and got["differing_share"] < MAX_DIFFERING_SHARE, got
    kinds = [e.kind for e in a.pop_events()]
    assert kinds.count("env_error") == 10 and kinds == [e.kind for e in b.pop_events()]
    a.close(), b.close()


def test_recreated_env_is_drawn_by_the_same_renderer():
    kw = {
        "env_id": "loomrl-test/FlakyPendulum-v0",
        "env_kwargs": {"fail_on": (2,), "reset_fails_after_failure": True},
    }
    a, b = pair(**kw)
    got = run_both(a, b, steps=3)
    assert got["physics_equal"] and got["differing_share"] < MAX_DIFFERING_SHARE, got
    kinds = [e.kind for e in a.pop_events()]
    assert kinds.count("env_recreated") == 5, kinds
    assert a.render_path == "batched"
    a.close(), b.close()


def test_env_that_overrides_render_is_drawn_env_by_env():
    a = VecEnv(EnvConfig("loomrl-test/MarkedPendulum-v0", num_envs=2, pixels=True, image_size=32))
    assert a.render_path.startswith("env by env: Marked overrides render()"), a.render_path
    assert a._tiles is None
    assert a.reset().shape == (2, 3, 32, 32)
    a.close()


def test_tileable_names_why_not():
    from loomrl.envs.testing import CountingEnv

    assert "not a gymnasium MujocoEnv" in tileable(CountingEnv())
    env = gym.make("InvertedPendulum-v5")  # no render_mode
    assert "render_mode is None" in tileable(env)
    env.close()


def test_renderer_refuses_more_envs_than_its_grid_and_checks_assets():
    envs = [gym.make("InvertedPendulum-v5", render_mode="rgb_array", width=16, height=16)]
    envs.append(gym.make("InvertedPendulum-v5", render_mode="rgb_array", width=24, height=24))
    cheetah = gym.make("HalfCheetah-v5", render_mode="rgb_array", width=16, height=16)
    for e in (*envs, cheetah):
        e.reset(seed=0)
    tiles = TiledRenderer(envs[0], capacity=1)
    assert tiles.compatible(envs[0])
    assert not tiles.compatible(envs[1])  # another size
    assert not tiles.compatible(cheetah)  # other meshes
    with pytest.raises(ValueError, match=r"cells \[1\] outside the grid of 1"):
        tiles.render([envs[0], envs[0]], [0, 1])
    frame = tiles.render([envs[0]], [0])[0]
    np.testing.assert_array_equal(frame, envs[0].render())
    tiles.close()
    for e in (*envs, cheetah):
        e.close()
