"""Tiny deterministic gymnasium envs for testing env plumbing without a simulator.

Importing this module registers them as ``loomrl-test/Counting-v0``, ``loomrl-test/DictObs-v0``
and ``loomrl-test/ImageObs-v0``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class CountingEnv(gym.Env):
    """obs = [episode number, step in episode]; reward 1 per step; terminates after `length` steps.

    Raises RuntimeError on the global step numbers listed in `fail_on` (counted per instance,
    starting at 1), or on every step from `fail_from` on; its resets listed in `fail_reset_on`
    (counted per instance, starting at 1) raise too. `reset_budget`, a dict
    ``{"left": n}`` shared by every instance given it, lets n resets succeed and fails the rest;
    steps in `bad_obs_on` return an observation of three numbers instead of two; steps in
    `stall_on` sleep for an hour (a simulator that hangs); a step in `die_on` ends the process
    at once (a simulator that crashes its worker).
    """

    def __init__(
        self,
        length: int = 5,
        fail_on: tuple[int, ...] = (),
        fail_from: int | None = None,
        reset_budget: dict | None = None,
        bad_obs_on: tuple[int, ...] = (),
        stall_on: tuple[int, ...] = (),
        die_on: tuple[int, ...] = (),
        fail_reset_on: tuple[int, ...] = (),
    ):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.length, self.fail_on, self.fail_from = length, set(fail_on), fail_from
        self.reset_budget, self.bad_obs_on = reset_budget, set(bad_obs_on)
        self.stall_on, self.die_on = set(stall_on), set(die_on)
        self.fail_reset_on, self.resets = set(fail_reset_on), 0
        self.episode, self.t, self.total = -1, 0, 0

    def reset(self, *, seed=None, options=None):
        if self.reset_budget is not None:
            if self.reset_budget["left"] <= 0:
                raise RuntimeError("reset exploded")
            self.reset_budget["left"] -= 1
        self.resets += 1
        if self.resets in self.fail_reset_on:
            raise RuntimeError(f"reset {self.resets} exploded")
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return np.array([self.episode, 0], np.float32), {}

    def step(self, action):
        self.total += 1
        if self.total in self.stall_on:
            import time

            time.sleep(3600)
        if self.total in self.die_on:
            import os

            os._exit(7)
        if self.total in self.fail_on or (
            self.fail_from is not None and self.total >= self.fail_from
        ):
            raise RuntimeError(f"simulator exploded at step {self.total}")
        self.t += 1
        obs = np.array([self.episode, self.t], np.float32)
        if self.total in self.bad_obs_on:  # an observation of the wrong shape
            obs = np.append(obs, 0.0).astype(np.float32)
        return obs, 1.0, self.t >= self.length, False, {}


class DictObsEnv(gym.Env):
    """A goal-conditioned-style env with a Dict observation, like Fetch."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict(
            {
                "observation": gym.spaces.Box(-1, 1, (4,), np.float64),
                "achieved_goal": gym.spaces.Box(-1, 1, (3,), np.float64),
                "desired_goal": gym.spaces.Box(-1, 1, (3,), np.float64),
            }
        )
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def _obs(self):
        r = self.np_random
        return {
            "observation": r.uniform(-1, 1, 4),
            "achieved_goal": r.uniform(-1, 1, 3),
            "desired_goal": r.uniform(-1, 1, 3),
        }

    def step(self, action):
        return self._obs(), 0.0, False, False, {"is_success": 0.0}


class ImageObsEnv(gym.Env):
    """Observations that are images of its own, uint8 [height, width, 3] (channels last, as
    gymnasium's image envs give them): pixel (y, x, c) of step t of an episode holds
    (t + y + 2x + 3c + seeded offset) % 256; reward = the first action; episodes of 6 steps."""

    def __init__(self, height: int = 20, width: int = 24):
        self.observation_space = gym.spaces.Box(0, 255, (height, width, 3), np.uint8)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.t, self.offset = 0, 0

    def _obs(self) -> np.ndarray:
        h, w, _ = self.observation_space.shape
        y, x, c = np.meshgrid(np.arange(h), np.arange(w), np.arange(3), indexing="ij")
        return ((self.t + y + 2 * x + 3 * c + self.offset) % 256).astype(np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.offset = 0, int(self.np_random.integers(0, 256))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(np.asarray(action).reshape(-1)[0]), self.t >= 6, False, {}


for _id, _cls in (
    ("loomrl-test/Counting-v0", CountingEnv),
    ("loomrl-test/DictObs-v0", DictObsEnv),
    ("loomrl-test/ImageObs-v0", ImageObsEnv),
):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_cls)
