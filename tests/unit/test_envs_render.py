"""Pixels drawn in one pass (loomrl.envs.render): gymnasium's frames up to edge rounding, and
the same frames whatever envs are drawn together or whichever worker holds them."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from loomrl.envs import EnvConfig, VecEnv, probe_rendering, render
from loomrl.envs.render import TiledRenderer, cell_of, grid_side, second_cell, tileable

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
    """InvertedPendulum with its own render() (which could change the scene before drawing)."""

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


PENDULUM = {"env_id": "InvertedPendulum-v5", "pixels": True, "image_size": 64}


def pair(batch_render=False, **kw) -> tuple[VecEnv, VecEnv]:
    """A batched VecEnv and one rendering env by env (or batched too), built alike."""
    base = {**PENDULUM, "num_envs": 5, **kw}
    return VecEnv(EnvConfig(**base)), VecEnv(EnvConfig(**base, batch_render=batch_render))


# Frames drawn at another place in the buffer round a few edge pixels differently (measured on
# Mesa: about 1 value in 100,000; on an H200 values off by at most 1); this bounds the share of
# differing values, not their size.
MAX_DIFFERING_SHARE = 1e-3


def run_both(a, b, steps: int, groups_a=(None,), groups_b=(None,)) -> dict:
    """Step ``a`` and ``b`` with the same actions (each in its groups of envs) and compare every
    frame. ``b`` may be a list of VecEnvs holding consecutive slices of ``a``'s envs (workers)."""
    parts = b if isinstance(b, list) else [b]
    n = a.num_envs
    rng = np.random.default_rng(0)
    frames = [(a.reset(), np.concatenate([w.reset() for w in parts]))]
    ended, physics_equal = 0, True
    for _ in range(steps):
        act = rng.uniform(-3, 3, (n, 1)).astype(np.float32)
        ra = _step(a, act, groups_a)
        rb, lo = [], 0
        for w in parts:
            rb.append(_step(w, act[lo : lo + w.num_envs], groups_b))
            lo += w.num_envs
        rb = {f: np.concatenate([r[f] for r in rb]) for f in ra}
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


def _step(env: VecEnv, act: np.ndarray, groups) -> dict:
    out = [env.step(act[g if g is not None else slice(None)], g) for g in groups]
    return {
        f: np.concatenate([getattr(r, f) for r in out])
        for f in ("obs", "final_obs", "reward", "done")
    }


def close(*envs):
    for e in envs:
        for w in e if isinstance(e, list) else [e]:
            w.close()


def test_batched_frames_match_env_by_env_frames_across_episode_ends():
    a, b = pair()
    assert a.render_path == "batched"
    assert b.render_path == "env by env: batch_render is off"
    assert a._tiles.side == grid_side(64, 64) == 8
    got = run_both(a, b, steps=40)
    assert got["ended"] > 0, "random actions should end some episodes, exercising reset frames"
    assert got["physics_equal"]
    assert got["differing_share"] < MAX_DIFFERING_SHARE, got
    assert len({f.tobytes() for f in a.obs}) == a.num_envs, "envs must not share one frame"
    # One read-back at the reset and one a step, the reset frames of envs that ended included;
    # env by env, one a frame (those of resets too).
    assert a.render_s > 0 and b.render_s > 0
    assert a.render_reads == 40 + 1
    assert b.render_reads == 5 * (40 + 1) + got["ended"]
    close(a, b)


def test_batched_frames_do_not_depend_on_the_ring_groups():
    # A ring group draws only its envs; each env keeps its cell, so its frames are exactly those
    # of the whole batch drawn at once (pipelined and unpipelined cycles see the same pixels).
    a, b = pair(batch_render=True, num_envs=6)
    got = run_both(a, b, steps=30, groups_a=(slice(0, 2), slice(2, 4), slice(4, 6)))
    assert got["ended"] > 0 and got["physics_equal"]
    assert got["identical"], got
    close(a, b)


def test_batched_frames_do_not_depend_on_the_env_workers():
    # One worker of 6 envs, or two of 3 (global indices 3-5 on the second): the same cells.
    whole = VecEnv(EnvConfig(**PENDULUM, num_envs=6))
    cfg3 = EnvConfig(**PENDULUM, num_envs=3)
    workers = [VecEnv(cfg3, index_offset=0), VecEnv(cfg3, index_offset=3)]
    got = run_both(whole, workers, steps=30)
    assert got["ended"] > 0 and got["physics_equal"]
    assert got["identical"], got
    close(whole, workers)


def test_envs_sharing_a_cell_are_drawn_in_further_passes():
    # 66 envs of 8x8 frames: a grid of 64 cells, so envs 64 and 65 share cells with 0 and 1.
    small = {**PENDULUM, "image_size": 8}
    whole = VecEnv(EnvConfig(**small, num_envs=66))
    assert whole._tiles.side == 8 and cell_of(64, 8) == cell_of(0, 8)
    workers = [
        VecEnv(EnvConfig(**small, num_envs=64)),
        VecEnv(EnvConfig(**small, num_envs=2), index_offset=64),
    ]
    got = run_both(whole, workers, steps=5)
    assert got["physics_equal"] and got["identical"], got
    close(whole, workers)


def test_reset_frames_meeting_drawn_cells_are_read_back_first():
    # 40 envs of 8x8 frames: the second cells of envs 24-39 (where reset frames go) are first
    # cells of envs 24-39, so a step where one of them ended reads back twice; two workers of
    # 20 meet it only in the second. The frames depend on the cells alone: identical.
    small = {**PENDULUM, "image_size": 8}
    whole = VecEnv(EnvConfig(**small, num_envs=40))
    assert second_cell(24, 8) == 39 and second_cell(39, 8) == 24
    workers = [VecEnv(EnvConfig(**small, num_envs=20), index_offset=o) for o in (0, 20)]
    got = run_both(whole, workers, steps=30)
    assert got["ended"] > 0 and got["physics_equal"] and got["identical"], got
    assert 30 + 1 < whole.render_reads <= 2 * 30 + 1
    assert workers[0].render_reads == 30 + 1  # second cells 63-44 meet no first cell
    close(whole, workers)


def test_batched_frames_after_offload_and_onload():
    a, b = pair(num_envs=4)
    run_both(a, b, steps=10)
    for env in (a, b):
        env.offload()
        env.onload()
    assert a.render_path == "batched"
    got = run_both(a, b, steps=10)
    assert got["physics_equal"] and got["differing_share"] < MAX_DIFFERING_SHARE, got
    close(a, b)


def test_fixed_camera_visual_options_and_frames_that_are_not_square():
    import mujoco

    # HalfCheetah: textures, its camera 0 fixed, the centre of mass drawn, 40x24 frames
    # resized to 32x32. A renderer ignoring any of them would miss by far more than edges.
    kw = {
        "env_id": "HalfCheetah-v5",
        "num_envs": 3,
        "image_size": 32,
        "env_kwargs": {
            "camera_id": 0,
            "visual_options": {int(mujoco.mjtVisFlag.mjVIS_COM): True},
            "width": 40,
            "height": 24,
        },
    }
    a, b = pair(**kw)
    assert a.render_path == "batched"
    assert (a._tiles.width, a._tiles.height) == (40, 24)
    act = np.zeros((3, 6), np.float32)
    fa, fb = a.reset(), b.reset()
    for _ in range(5):
        ra, rb = a.step(act), b.step(act)
        fa, fb = np.concatenate([fa, ra.obs]), np.concatenate([fb, rb.obs])
    assert (fa != fb).mean() < MAX_DIFFERING_SHARE
    close(a, b)


def test_failing_env_is_recovered_with_the_same_frames():
    kw = {"env_id": "loomrl-test/FlakyPendulum-v0", "env_kwargs": {"fail_on": (3, 7)}}
    a, b = pair(**kw)
    assert a.render_path == "batched"
    got = run_both(a, b, steps=10)
    assert got["physics_equal"] and got["differing_share"] < MAX_DIFFERING_SHARE, got
    kinds = [e.kind for e in a.pop_events()]
    assert kinds.count("env_error") == 10 and kinds == [e.kind for e in b.pop_events()]
    close(a, b)


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
    close(a, b)


def test_a_recreated_env_the_renderer_cannot_draw_is_drawn_by_itself():
    kw = {
        "env_id": "loomrl-test/FlakyPendulum-v0",
        "env_kwargs": {"fail_on": (2,), "reset_fails_after_failure": True},
        "num_envs": 2,
    }
    a, b = pair(**kw)
    first = {id(slot.env) for slot in a._slots}
    odd = {"on": True}  # envs made after the start cannot be drawn, while on

    def mismatch(env):
        return "its model's mesh_vert differs" if odd["on"] and id(env) not in first else None

    a._tiles.mismatch = mismatch
    act = np.zeros((2, 1), np.float32)
    np.testing.assert_array_equal(a.reset(), b.reset())

    def same_step():
        ra, rb = a.step(act), b.step(act)
        assert (ra.obs != rb.obs).mean() < MAX_DIFFERING_SHARE
        assert (ra.final_obs != rb.final_obs).mean() < MAX_DIFFERING_SHARE
        return ra

    for _ in range(3):  # both envs fail at step 2 and are recreated
        same_step()
    assert sorted(a._alone) == [0, 1]
    assert a.render_path == (
        "batched; env 0 by itself: its model's mesh_vert differs; "
        "env 1 by itself: its model's mesh_vert differs"
    )
    # drawn through gymnasium's own viewer, not the renderer
    assert all(s.env.unwrapped.mujoco_renderer.viewer is not None for s in a._slots)
    assert not any(id(s.env) in a._tiles._views for s in a._slots)
    odd["on"] = False
    assert same_step().failed.all()  # step 4: the recreated envs fail and are recreated again
    assert a._alone == {} and a.render_path == "batched"
    assert all(s.env.unwrapped.mujoco_renderer.viewer is None for s in a._slots)
    close(a, b)


@pytest.mark.parametrize("batch_render", [False, True])
def test_frames_stay_drawn_after_a_recreated_env_is_collected(batch_render):
    # gymnasium's close leaves a viewer's GL objects to the garbage collector, which freed them
    # by id in whatever context was current: the next frames of the env by env path came out
    # blank. VecEnv frees them in their own context first.
    import gc

    kw = {
        **PENDULUM,
        "env_id": "loomrl-test/FlakyPendulum-v0",
        "env_kwargs": {"fail_on": (2,), "reset_fails_after_failure": True},
        "num_envs": 2,
        "batch_render": batch_render,
    }
    env = VecEnv(EnvConfig(**kw))
    env.reset()
    act = np.zeros((2, 1), np.float32)
    for _ in range(5):  # recreated at steps 2 and 4
        r = env.step(act)
        gc.collect()
        assert all(f.any() for f in r.obs) and all(f.any() for f in r.final_obs)
    assert [e.kind for e in env.pop_events()].count("env_recreated") == 4
    close(env)


def test_a_renderer_that_does_not_start_leaves_env_by_env_drawing(monkeypatch):
    def refuse(self, first):
        raise RuntimeError("no room for the grid")

    monkeypatch.setattr(render.TiledRenderer, "__init__", refuse)
    a = VecEnv(EnvConfig(**PENDULUM, num_envs=2))
    assert a.render_path == (
        "env by env: the one-pass renderer did not start (RuntimeError: no room for the grid)"
    )
    assert a.reset().shape == (2, 3, 64, 64)
    close(a)


def test_env_with_its_own_render_is_drawn_env_by_env():
    a = VecEnv(EnvConfig("loomrl-test/MarkedPendulum-v0", num_envs=2, pixels=True, image_size=32))
    assert a.render_path.startswith("env by env: Marked has its own render()"), a.render_path
    assert a._tiles is None
    assert a.reset().shape == (2, 3, 32, 32)
    close(a)


def test_tileable_names_why_not():
    from loomrl.envs.testing import CountingEnv

    assert "not a gymnasium MujocoEnv" in tileable(CountingEnv())
    env = gym.make("InvertedPendulum-v5")  # no render_mode
    assert "render_mode is None" in tileable(env)
    env.close()

    class Overlay(gym.Wrapper):
        def render(self):
            return self.env.render()

    env = Overlay(gym.make("InvertedPendulum-v5", render_mode="rgb_array"))
    assert tileable(env) == "its wrapper Overlay has its own render()"
    env.close()


def test_renderer_checks_frame_size_and_assets_and_shares_cells_across_passes():
    def make(env_id="InvertedPendulum-v5", size=16):
        e = gym.make(env_id, render_mode="rgb_array", width=size, height=size)
        e.reset(seed=0)
        return e

    envs = [make(), make()]
    envs[1].step(np.ones(1, np.float32))  # another state, another frame
    other_size, cheetah = make(size=24), make("HalfCheetah-v5")
    tiles = TiledRenderer(envs[0])
    assert tiles.mismatch(envs[0]) is None
    assert tiles.mismatch(other_size) == "its frames are 24x24, not 16x16"
    assert "differs from the first env's" in tiles.mismatch(cheetah)
    # Both in cell 0: two passes, each frame as if drawn alone there.
    both = tiles.render(envs, [0, 64])
    alone = [tiles.render([e], [0])[0] for e in envs]
    for x, y in zip(both, alone, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(both[0], both[1])
    assert (both[0] != envs[0].render()).mean() < MAX_DIFFERING_SHARE
    tiles.close()
    tiles.close()  # a second close is harmless
    for e in (*envs, other_size, cheetah):
        e.close()


class _Drawn(gym.Env):
    """An env whose render() returns ``frame(self)``: None (it draws nothing), or RGBA."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, frame, render_mode=None):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.frame, self.render_mode = frame, render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}

    def render(self):
        return self.frame()


def test_pixels_on_an_env_that_draws_no_rgb_frame_are_a_config_error_naming_env_pixels():
    from loomrl.errors import ConfigError

    if "loomrl-test/Drawn-v0" not in gym.registry:
        gym.register(id="loomrl-test/Drawn-v0", entry_point=_Drawn)
    env = VecEnv(
        EnvConfig(
            "loomrl-test/Drawn-v0",
            num_envs=1,
            pixels=True,
            image_size=16,
            env_kwargs={"frame": lambda: None},
        )
    )
    with pytest.raises(
        ConfigError, match=r"env.pixels=true: .* render\(\) returned None, not an RGB"
    ):
        env.reset()
    rgba = np.zeros((32, 32, 4), np.uint8)
    rgba[..., 0], rgba[..., 3] = 200, 255
    env = VecEnv(
        EnvConfig(
            "loomrl-test/Drawn-v0",
            num_envs=1,
            pixels=True,
            image_size=16,
            env_kwargs={"frame": lambda: rgba},
        )
    )
    obs = env.reset()  # an alpha channel is dropped: the [3, H, W] the space declares
    assert obs.shape == (1, *env.single_observation_space.shape) == (1, 3, 16, 16)
    assert (obs[0, 0] == 200).all() and (obs[0, 1:] == 0).all()
