"""Rendering a worker's MuJoCo envs side by side in one GL pass.

gymnasium's MuJoCo envs each render through their own offscreen viewer: one draw and one
``glReadPixels`` per env per step. The read-back waits for the GPU to finish, so a worker with
n envs stops n times a step, and on a GPU shared with the policy each stop can also wait
behind the policy's work. ``TiledRenderer`` draws the scenes into cells of one offscreen buffer
and reads the buffer back once (on one H200, 4 processes of 16 envs stepped 11-12x faster:
scripts/gpu/RESULTS.md, calls BI-BL).

The scene is built as gymnasium builds it: from each env's own model and data, with gymnasium's
camera rules (a free camera looking at the median geom position from ``model.stat.extent``
away when the viewer is created, then ``default_camera_config``, then the env's
``camera_id``) and the env's visual options, at the env's render size. The frames differ from
gymnasium's only where the rasteriser rounds an edge differently at another place in the
buffer: measured on Mesa (16 envs, 60 steps, 32-84 px), about 1 value in 100,000, edge pixels
by up to 63 of 255; on an H200 values off by at most 1 (how many not recorded). The tests bound
the share of differing values at 1 in 1,000.

An env's cell follows from its global index alone (``cell_of``), whatever worker holds it and
whichever envs are drawn with it: its frames do not depend on the plan (identical across the
ring groups and env-worker splits tested). Drawing and reading back are apart (``draw``,
``frames``): a step's frames are drawn, the envs that ended are reset, their first frames are
drawn into second cells (``second_cell``, also fixed by the global index), and one read-back
brings both. An env whose cell is taken by a frame not yet read back is drawn after a
read-back: envs of one call that share a cell cost a read-back each.

Only the GPU assets (meshes, textures, height fields) come from the first env's model, so every
env drawn must share them (``mismatch``); ``tileable`` checks that the env draws through
gymnasium's own ``MujocoEnv.render`` and ``MujocoRenderer`` and stock wrappers (an env or a
wrapper that changes the scene before drawing keeps its own viewer).

Needs ``mujoco`` (imported when the renderer is built); no torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Model arrays that MjrContext uploads to the GPU: envs drawn by one context must agree on them.
_ASSET_ARRAYS = ("mesh_vert", "mesh_face", "mesh_normal", "tex_data", "hfield_data", "skin_vert")
# The grid: at most 8 x 8 cells and 2048 pixels a side (an offscreen buffer of 2048^2 with 4x
# multisampling is ~130 MB of GPU memory); it depends on the frame size only, so a cell does
# not depend on the worker.
MAX_SIDE_CELLS = 8
MAX_SIDE_PIXELS = 2048
_RENDERER_ATTRS = (
    "model",
    "data",
    "width",
    "height",
    "max_geom",
    "camera_id",
    "default_cam_config",
    "_vopt",
)


def tileable(env: Any) -> str | None:
    """None if ``env`` can be drawn by a ``TiledRenderer``, else why not (for the log)."""
    import gymnasium as gym
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv
    from gymnasium.envs.mujoco.mujoco_rendering import MujocoRenderer
    from gymnasium.wrappers.common import OrderEnforcing, PassiveEnvChecker

    stock = {gym.Wrapper.render, OrderEnforcing.render, PassiveEnvChecker.render}
    w = env
    while isinstance(w, gym.Wrapper):
        if type(w).render not in stock:
            return f"its wrapper {type(w).__name__} has its own render()"
        w = w.env
    u = w
    if not isinstance(u, MujocoEnv):
        return f"{type(u).__name__} is not a gymnasium MujocoEnv"
    if type(u).render is not MujocoEnv.render:
        return f"{type(u).__name__} has its own render() (it may change the scene before drawing)"
    if getattr(u, "render_mode", None) != "rgb_array":
        return f"render_mode is {getattr(u, 'render_mode', None)!r}, not 'rgb_array'"
    r = getattr(u, "mujoco_renderer", None)
    if type(r) is not MujocoRenderer:
        return f"its mujoco_renderer is a {type(r).__name__}, not gymnasium's MujocoRenderer"
    missing = [a for a in _RENDERER_ATTRS if not hasattr(r, a)]
    if missing:
        return f"its mujoco_renderer lacks {missing} (a gymnasium version this code does not know)"
    return None


def grid_side(width: int, height: int) -> int:
    """Cells per side of the grid for frames of ``width`` x ``height``. Pure."""
    return max(1, min(MAX_SIDE_CELLS, MAX_SIDE_PIXELS // max(width, height)))


def cell_of(global_index: int, side: int) -> int:
    """The cell an env with this global index is drawn in. Pure."""
    return global_index % (side * side)


def second_cell(global_index: int, side: int) -> int:
    """The cell an env's second frame of a step (after a reset) is drawn in: its first cell
    mirrored through the grid, so the consecutive first cells of a worker's envs and their
    second cells do not meet while the worker holds at most half the grid. Pure."""
    return side * side - 1 - cell_of(global_index, side)


class TiledRenderer:
    """Draws envs built like ``first`` (``mismatch`` is None) into the cells of one buffer."""

    def __init__(self, first: Any):
        import mujoco

        self._mj = mujoco
        r = first.unwrapped.mujoco_renderer
        self.width, self.height = int(r.width), int(r.height)
        self.side = grid_side(self.width, self.height)
        self._model = r.model
        w, h = self.side * self.width, self.side * self.height
        self._views: dict[int, tuple[Any, Any, Any]] = {}  # id(env) -> (env, camera, option)
        self._drawn: dict[int, int] = {}  # cell -> key, drawn and not yet read back
        self._read_back: dict[int, np.ndarray] = {}  # key -> frame, read back, not yet taken
        self._next_key = 0
        self.reads = 0  # read-backs so far (each waits for the GPU)
        self._gl = mujoco.GLContext(w, h)
        self._con = None
        try:
            self._gl.make_current()
            # MjrContext sizes its offscreen buffer from the model's visual settings; raise them
            # to the whole grid for this context only and put them back for the env.
            vis = self._model.vis.global_
            old = vis.offwidth, vis.offheight
            vis.offwidth, vis.offheight = max(old[0], w), max(old[1], h)
            try:
                self._con = mujoco.MjrContext(self._model, mujoco.mjtFontScale.mjFONTSCALE_150)
            finally:
                vis.offwidth, vis.offheight = old
            if self._con.offWidth < w or self._con.offHeight < h:
                raise RuntimeError(
                    f"the GL driver gave a {self._con.offWidth}x{self._con.offHeight} buffer "
                    f"for a {w}x{h} grid"
                )
            mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._con)
            self._scene = mujoco.MjvScene(self._model, int(r.max_geom))
        except BaseException:
            try:
                self.close()
            except Exception:
                pass  # the error that stopped the start is the one to report
            raise
        self._pert = mujoco.MjvPerturb()

    def mismatch(self, env: Any) -> str | None:
        """None if ``env`` can be drawn here (its frame size and GPU assets are the first
        env's), else which of them differs."""
        r = env.unwrapped.mujoco_renderer
        size = (int(r.width), int(r.height))
        if size != (self.width, self.height):
            return f"its frames are {size[0]}x{size[1]}, not {self.width}x{self.height}"
        for name in _ASSET_ARRAYS:
            x, y = getattr(r.model, name, None), getattr(self._model, name, None)
            if (x is None) != (y is None) or (x is not None and not np.array_equal(x, y)):
                return f"its model's {name} differs from the first env's"
        return None

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
            free = r.camera_id == -1
            cam.type = mj.mjtCamera.mjCAMERA_FREE if free else mj.mjtCamera.mjCAMERA_FIXED
            cam.fixedcamid = r.camera_id
        opt = mj.MjvOption()
        for flag, value in (r._vopt or {}).items():
            opt.flags[flag] = value
        self._views[id(env)] = (env, cam, opt)  # the env itself: its id cannot be reused
        return cam, opt

    def forget(self, env: Any) -> None:
        """Drop ``env``'s camera (it was closed or replaced)."""
        self._views.pop(id(env), None)

    def render(self, envs: list[Any], global_ids: list[int]) -> list[np.ndarray]:
        """One [height, width, 3] uint8 frame per env, in order; ``global_ids``: the envs'
        global indices, which fix their cells."""
        return self.frames(self.draw(envs, global_ids))

    def draw(self, envs: list[Any], global_ids: list[int], second: bool = False) -> list[int]:
        """Draw the envs' current scenes into their cells without reading them back; returns
        keys for ``frames``. The envs may change before the read-back (drawing hands the scene
        to GL), so a step's frames and, after resets, the reset frames can be drawn first and
        read back together: one wait for the GPU instead of two. ``second``: draw into the
        envs' second cells (``second_cell``), apart from first cells drawn in the same
        read-back. An env whose cell is already drawn and not read back is drawn after a
        read-back, so a cell never holds two scenes."""
        if len(envs) != len(global_ids):
            raise ValueError(f"{len(envs)} envs but {len(global_ids)} global indices")
        mj = self._mj
        keys = []
        self._gl.make_current()
        for env, g in zip(envs, global_ids, strict=True):
            cell = (second_cell if second else cell_of)(g, self.side)
            if cell in self._drawn:
                self._read()
                self._gl.make_current()
            row, col = divmod(cell, self.side)
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
            self._next_key += 1
            self._drawn[cell] = self._next_key
            keys.append(self._next_key)
        return keys

    def frames(self, keys: list[int]) -> list[np.ndarray]:
        """The frames of ``draw``'s keys (read back now if they are not yet), each once."""
        if any(k not in self._read_back for k in keys):
            self._read()
        out = [self._read_back.pop(k) for k in keys]
        # Frames drawn before these and never taken (their step failed): let them go.
        for k in [k for k in self._read_back if keys and k < keys[0]]:
            del self._read_back[k]
        return out

    def _read(self) -> None:
        """Read back every cell drawn since the last read-back, at once: the smallest
        rectangle of cells holding them."""
        if not self._drawn:
            return
        mj = self._mj
        self._gl.make_current()
        places = {key: divmod(c, self.side) for c, key in self._drawn.items()}  # (row, col)
        r0, r1 = min(p[0] for p in places.values()), max(p[0] for p in places.values()) + 1
        c0, c1 = min(p[1] for p in places.values()), max(p[1] for p in places.values()) + 1
        block = np.empty(((r1 - r0) * self.height, (c1 - c0) * self.width, 3), np.uint8)
        rect = mj.MjrRect(c0 * self.width, r0 * self.height, block.shape[1], block.shape[0])
        mj.mjr_readPixels(block, None, rect, self._con)
        self.reads += 1
        for key, (row, col) in places.items():
            y, x = (row - r0) * self.height, (col - c0) * self.width
            tile = block[y : y + self.height, x : x + self.width]
            self._read_back[key] = tile[::-1].copy()  # GL rows run bottom-up
        self._drawn.clear()

    def close(self) -> None:
        if self._gl is None:
            return
        gl, con, self._gl, self._con = self._gl, self._con, None, None
        self._views.clear()
        self._drawn.clear()
        self._read_back.clear()
        try:
            if con is not None:
                gl.make_current()
                con.free()
        finally:
            gl.free()  # the context goes even when freeing what it holds failed
