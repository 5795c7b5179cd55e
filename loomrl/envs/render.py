"""Rendering a worker's MuJoCo envs side by side in one GL pass.

gymnasium's MuJoCo envs each render through their own offscreen viewer: one draw and one
``glReadPixels`` per env per step. The read-back waits for the GPU to finish, so a worker with
n envs stops n times a step, and on a GPU shared with the policy every stop also waits for the
policy's work to yield. ``TiledRenderer`` draws the n scenes into n viewports of one offscreen
buffer and reads the buffer back once.

The scene is built as gymnasium builds it: from each env's own model and data, with gymnasium's
camera rules (a free camera looking at the median geom position from ``model.stat.extent``
away when the viewer is created, then ``default_camera_config``, then the env's
``camera_id``) and the env's visual options, at the env's render size. The frames differ from
gymnasium's only where the rasteriser rounds an edge differently at another place in the
buffer: on Mesa about 1 value in 100,000 (edge pixels, by up to 63 of 255; tested). Each env
keeps its own cell of the grid, so its frames do not depend on which envs are drawn with it
(a ring group's frames are the whole batch's). Only the GPU assets (meshes, textures, height fields) come
from the first env's model, so every env drawn must share them; ``tileable`` checks that and
that the env renders through ``MujocoEnv.render`` unchanged (envs that move markers before
drawing, such as gymnasium-robotics' Fetch, override it and keep their own viewers).

Needs ``mujoco`` (imported when the renderer is built); no torch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Model arrays that MjrContext uploads to the GPU: envs drawn by one context must agree on them.
_ASSET_ARRAYS = ("mesh_vert", "mesh_face", "mesh_normal", "tex_data", "hfield_data", "skin_vert")


def tileable(env: Any) -> str | None:
    """None if ``env`` can be drawn by a ``TiledRenderer``, else why not (for the log)."""
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

    u = getattr(env, "unwrapped", env)
    if not isinstance(u, MujocoEnv):
        return f"{type(u).__name__} is not a gymnasium MujocoEnv"
    if type(u).render is not MujocoEnv.render:
        return f"{type(u).__name__} overrides render() (it may change the scene before drawing)"
    if getattr(u, "render_mode", None) != "rgb_array":
        return f"render_mode is {getattr(u, 'render_mode', None)!r}, not 'rgb_array'"
    r = getattr(u, "mujoco_renderer", None)
    missing = [
        a
        for a in ("model", "data", "width", "height", "max_geom", "camera_id", "default_cam_config")
        if not hasattr(r, a)
    ]
    if missing:
        return f"its mujoco_renderer lacks {missing} (a gymnasium version this code does not know)"
    return None


def _same_assets(a: Any, b: Any) -> bool:
    for name in _ASSET_ARRAYS:
        x, y = getattr(a, name, None), getattr(b, name, None)
        if (x is None) != (y is None):
            return False
        if x is not None and not np.array_equal(x, y):
            return False
    return True


class TiledRenderer:
    """Draws any subset of ``capacity`` envs built like ``first`` into one buffer per call."""

    def __init__(self, first: Any, capacity: int):
        import mujoco

        self._mj = mujoco
        r = first.unwrapped.mujoco_renderer
        self.width, self.height = int(r.width), int(r.height)
        self.cols = max(1, math.ceil(math.sqrt(capacity)))
        self.rows = max(1, math.ceil(capacity / self.cols))
        self.capacity = capacity
        self._model = r.model
        w, h = self.cols * self.width, self.rows * self.height
        self._gl = mujoco.GLContext(w, h)
        self._gl.make_current()
        # MjrContext sizes its offscreen buffer from the model's visual settings; raise them to
        # the whole grid for this context only and put them back for the env.
        vis = self._model.vis.global_
        old = vis.offwidth, vis.offheight
        vis.offwidth, vis.offheight = max(old[0], w), max(old[1], h)
        try:
            self._con = mujoco.MjrContext(self._model, mujoco.mjtFontScale.mjFONTSCALE_150)
        finally:
            vis.offwidth, vis.offheight = old
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._con)
        self._scene = mujoco.MjvScene(self._model, int(r.max_geom))
        self._pert = mujoco.MjvPerturb()
        self._views: dict[int, tuple[Any, Any, Any]] = {}  # id(env) -> (env, camera, option)

    def compatible(self, env: Any) -> bool:
        r = env.unwrapped.mujoco_renderer
        return (int(r.width), int(r.height)) == (self.width, self.height) and _same_assets(
            r.model, self._model
        )

    def _view(self, env: Any) -> tuple[Any, Any]:
        """The env's camera and visual options, set up the first time the env is drawn, as
        gymnasium's viewer sets them up on the env's first ``render()``."""
        mj = self._mj
        entry = self._views.get(id(env))
        if entry is not None and entry[0] is env:
            return entry[1], entry[2]
        r = env.unwrapped.mujoco_renderer
        cam = mj.MjvCamera()
        cam.type = mj.mjtCamera.mjCAMERA_FREE
        cam.fixedcamid = -1
        cam.lookat[:] = np.median(r.data.geom_xpos, axis=0)
        cam.distance = r.model.stat.extent
        for key, value in (r.default_cam_config or {}).items():
            if isinstance(value, np.ndarray):
                getattr(cam, key)[:] = value
            else:
                setattr(cam, key, value)
        if r.camera_id is not None:
            cam.type = (
                mj.mjtCamera.mjCAMERA_FREE if r.camera_id == -1 else mj.mjtCamera.mjCAMERA_FIXED
            )
            cam.fixedcamid = r.camera_id
        opt = mj.MjvOption()
        for flag, value in (getattr(r, "_vopt", None) or {}).items():
            opt.flags[flag] = value
        self._views[id(env)] = (env, cam, opt)
        return cam, opt

    def forget(self, env: Any) -> None:
        """Drop ``env``'s camera (it was closed or replaced)."""
        self._views.pop(id(env), None)

    def render(self, envs: list[Any], cells: list[int]) -> list[np.ndarray]:
        """One [height, width, 3] uint8 frame per env, in order; env ``envs[n]`` is drawn in
        grid cell ``cells[n]`` (its index in the worker), so its frame never depends on which
        other envs are drawn with it."""
        mj = self._mj
        if len(envs) != len(cells):
            raise ValueError(f"{len(envs)} envs but {len(cells)} cells")
        if not envs:
            return []
        bad = [c for c in cells if not 0 <= c < self.capacity]
        if bad:
            raise ValueError(f"cells {bad} outside the grid of {self.capacity}")
        self._gl.make_current()
        places = [divmod(c, self.cols) for c in cells]
        for env, (row, col) in zip(envs, places, strict=True):
            cam, opt = self._view(env)
            r = env.unwrapped.mujoco_renderer
            mj.mjv_updateScene(
                r.model, r.data, opt, self._pert, cam, mj.mjtCatBit.mjCAT_ALL, self._scene
            )
            mj.mjr_render(
                mj.MjrRect(col * self.width, row * self.height, self.width, self.height),
                self._scene,
                self._con,
            )
        # Read back once: the smallest rectangle of cells holding every env drawn.
        r0, r1 = min(p[0] for p in places), max(p[0] for p in places) + 1
        c0, c1 = min(p[1] for p in places), max(p[1] for p in places) + 1
        block = np.empty(((r1 - r0) * self.height, (c1 - c0) * self.width, 3), np.uint8)
        rect = mj.MjrRect(c0 * self.width, r0 * self.height, block.shape[1], block.shape[0])
        mj.mjr_readPixels(block, None, rect, self._con)
        frames = []
        for row, col in places:
            y, x = (row - r0) * self.height, (col - c0) * self.width
            tile = block[y : y + self.height, x : x + self.width]
            frames.append(tile[::-1].copy())  # GL rows run bottom-up
        return frames

    def close(self) -> None:
        if self._con is not None:
            self._gl.make_current()
            self._con.free()
            self._con = None
            self._gl.free()
        self._views.clear()
