"""Will the envs and their rollout buffers fit in the node's memory? Checked at startup only.

Making more simulators than memory holds used to end in a silent hang (the node swapping) or
the kernel's OOM killer, with nothing naming the setting at fault. Two checks say it in a
``ConfigError`` instead, before the memory runs out:

* the driver's (``memory_verdict`` on ``estimate_env_memory``; the embodied recipe's
  ``memory_problem``), before any worker starts,
  from what the config alone fixes: the rollout buffers the policy worker allocates
  (``PolicyWorker.begin``: ``ppo.rollout_steps`` rows of observations and per-row scalars) and,
  for pixels, the frames every env holds (a lower bound of what a simulator costs);
* each env worker's (``BuildGuard``, in ``VecEnv.onload``), while it makes its simulators: the
  memory the first few took (resident-set growth) projected to all of them.

Both compare with the memory the node has available, of which they plan to use at most
``MEMORY_FRACTION``: the rest is for the policy, the update's copies and the operating system.
Where the figures cannot be read (no psutil and no /proc), nothing is checked.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Protocol

__all__ = [
    "MEMORY_FRACTION",
    "BuildGuard",
    "EnvMemory",
    "MemorySource",
    "NodeMemory",
    "estimate_env_memory",
    "frame_bytes",
    "memory_verdict",
    "rollout_memory_problem",
]

# At most this share of the available memory is planned for envs and buffers.
MEMORY_FRACTION = 0.8
GB = 1e9
# Per-transition scalars of the rollout buffer (PolicyWorker.begin): log-prob, value, reward and
# the value of a truncated episode's final observation (float32 each), two done flags (bool),
# and at least one float32 action component.
_ROW_SCALAR_BYTES = 4 * 4 + 2 + 4


def frame_bytes(image_size: int) -> int:
    """Bytes of one pixel observation: uint8 [3, image_size, image_size]."""
    return 3 * int(image_size) ** 2


@dataclass(frozen=True)
class EnvMemory:
    """Projected bytes of ``num_envs`` simulators and of one rollout's buffers."""

    num_envs: int
    per_env_bytes: float
    buffer_bytes: float
    keys: tuple[str, ...]  # the config keys the projection grows with, as "key=value"
    rows: int = 0  # the rollout's rows (transitions) the buffers hold

    @property
    def envs_bytes(self) -> float:
        return self.num_envs * self.per_env_bytes

    @property
    def total_bytes(self) -> float:
        return self.envs_bytes + self.buffer_bytes


def estimate_env_memory(
    env: object,
    per_env_bytes: float,
    *,
    rollout_steps: int = 0,
    obs_elems: int | None = None,
    normalize_obs: bool = False,
    images: bool = False,
) -> EnvMemory:
    """Memory of ``env.num_envs`` envs of ``per_env_bytes`` each plus a rollout of
    ``rollout_steps`` rows (0: no buffers counted). ``env``: an ``EnvConfig`` (num_envs,
    pixels, image_size). A pixel row stores its frame as uint8, as does a row of an env's own
    image observations (``images``: ``obs_elems`` bytes); a state row stores ``obs_elems``
    float32 (unknown: 0), twice with ``normalize_obs`` (the raw copy the normaliser's update
    reads). Pure."""
    n, pixels = int(env.num_envs), bool(env.pixels)  # type: ignore[attr-defined]
    keys = [f"env.num_envs={n}"]
    if pixels:
        size = int(env.image_size)  # type: ignore[attr-defined]
        keys.append(f"env.image_size={size}")
        obs_row = float(frame_bytes(size))
    elif images:
        obs_row = float(obs_elems or 0)
    else:
        obs_row = 4.0 * (obs_elems or 0) * (2 if normalize_obs else 1)
    if rollout_steps:
        keys.append(f"ppo.rollout_steps={rollout_steps}")
    buffers = float(rollout_steps) * (obs_row + _ROW_SCALAR_BYTES)
    return EnvMemory(n, float(per_env_bytes), buffers, tuple(keys), int(rollout_steps))


def rollout_memory_problem(
    env: object,
    rollout_steps: int,
    normalize_obs: bool,
    obs_shape: tuple[int, ...] | None,
    source: MemorySource,
) -> str | None:
    """The problem, where ``env``'s envs (an ``EnvConfig``) and the buffers of a rollout of
    ``rollout_steps`` rows cannot fit the memory ``source`` says is available: the rows and,
    for pixels, the two frames each env holds (its observation and the read-back).
    ``obs_shape``: the observations the policy is given, known once the envs are made (None:
    before, their rows not counted): uint8 images where they have 3 dims, else float32 numbers
    (twice with ``normalize_obs``); the envs' frames then already take their memory, so only the
    buffers are counted. What a simulator costs beyond that is measured by each env worker as
    it makes them (``BuildGuard``). None where they fit or nothing can be read."""
    made = obs_shape is not None
    frames = bool(env.pixels) and not made  # type: ignore[attr-defined]
    per_env = 2 * frame_bytes(env.image_size) if frames else 0  # type: ignore[attr-defined]
    elems = math.prod(obs_shape) if obs_shape is not None else None
    images = obs_shape is not None and len(obs_shape) == 3
    est = estimate_env_memory(
        env,
        per_env,
        rollout_steps=rollout_steps,
        obs_elems=elems,
        normalize_obs=normalize_obs and not images,
        images=images,
    )
    what = "the envs' pixel frames and the rollout buffers" if frames else "the rollout buffers"
    if obs_shape is not None:
        kind = "uint8 images" if images else "float32 numbers"
        what += f" (observations of {list(obs_shape)} {kind} from {env.env_id})"  # type: ignore[attr-defined]
    return memory_verdict(est, source.available(), what=what)


def memory_verdict(est: EnvMemory, available_bytes: float | None, *, what: str) -> str | None:
    """None where ``est`` fits in ``MEMORY_FRACTION`` of ``available_bytes`` (or that figure is
    unknown), else the problem: the keys and values, projected and available GB, and the fix.
    ``what`` says whose projection it is (e.g. "this env worker's 4096 envs"). Pure."""
    if available_bytes is None:
        return None
    budget = MEMORY_FRACTION * available_bytes
    if est.total_bytes <= budget:
        return None
    pixels = any(k.startswith("env.image_size=") for k in est.keys)
    parts = []
    if est.per_env_bytes or not est.buffer_bytes:  # envs not measured yet say nothing
        parts.append(
            f"{est.num_envs} env(s) x {est.per_env_bytes / 1e6:.3g} MB = {est.envs_bytes / GB:.3g} GB"
        )
    if est.buffer_bytes:
        parts.append(f"rollout buffers {est.buffer_bytes / GB:.3g} GB")
    room = budget - est.buffer_bytes
    fixes = []
    if room > 0 or not est.buffer_bytes:  # fewer envs shrink the buffers not: rows are the total
        fit = int(room // est.per_env_bytes) if est.per_env_bytes > 0 else est.num_envs
        beside = " beside the buffers" if est.buffer_bytes else ""
        fixes.append(
            f"lower env.num_envs (about {fit} fit{beside})" if fit else "lower env.num_envs"
        )
    if pixels:
        fixes.append("lower env.image_size (a frame is 3 x size^2 bytes)")
    if est.buffer_bytes:
        rows = ""
        if room <= 0 and est.rows:
            rows = f"; about {int(budget // (est.buffer_bytes / est.rows))} rows fit"
        fixes.append(f"lower ppo.rollout_steps (the buffer holds that many observations{rows})")
    fixes.append("or run on a node with more memory")
    return (
        f"{', '.join(est.keys)}: {what} would need about {est.total_bytes / GB:.3g} GB "
        f"({' + '.join(parts)}), but the node has {available_bytes / GB:.3g} GB available "
        f"(at most {MEMORY_FRACTION:.0%} of it is planned for them); {', '.join(fixes)}"
    )


class MemorySource(Protocol):
    """Where the memory figures come from (``NodeMemory``; tests inject their own)."""

    def available(self) -> float | None: ...

    def rss(self) -> float | None: ...


class NodeMemory:
    """This process's resident set and the node's available memory, in bytes: psutil where
    installed, else Linux's /proc; None where neither can be read."""

    def available(self) -> float | None:
        try:
            import psutil

            return float(psutil.virtual_memory().available)
        except Exception:  # noqa: BLE001 - no psutil, or it cannot read this platform
            pass
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return float(line.split()[1]) * 1024
        except OSError:
            pass
        return None

    def rss(self) -> float | None:
        try:
            import psutil

            return float(psutil.Process().memory_info().rss)
        except Exception:  # noqa: BLE001 - as above
            pass
        try:
            with open("/proc/self/statm") as f:
                return float(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None


class BuildGuard:
    """Checks, while a VecEnv makes its ``num_envs`` simulators, that the rest will fit.

    The first simulator pays one-off costs (imports, shared libraries), so the per-env figure is
    the resident-set growth from the first to the ``FIRST_CHECK``-th, re-measured each time the
    count doubles (one memory read per check; nothing on the step path). Each check projects
    the simulators still to be made, times ``share`` (env workers of the run that may share
    this node and build at the same time), against the memory available then. ``floor_bytes``:
    the least an env is known to cost (its pixel frames), used where the growth reads lower."""

    FIRST_CHECK = 5

    def __init__(
        self,
        env: object,
        source: MemorySource | None = None,
        *,
        share: int = 1,
        floor_bytes: float = 0.0,
    ):
        self.env, self.source = env, source or NodeMemory()
        self.n, self.share, self.floor = int(env.num_envs), max(int(share), 1), float(floor_bytes)  # type: ignore[attr-defined]
        self._base: float | None = None
        self._next = self.FIRST_CHECK

    def start(self) -> None:
        """Before the first simulator: the frames alone must fit."""
        if self.floor:
            self._check(self.n, self.floor)

    def built(self, made: int) -> None:
        """After ``made`` simulators of ``n``."""
        if made >= self.n:
            return
        if made == 1:
            self._base = self.source.rss()
            return
        if made < self._next or self._base is None:
            return
        self._next *= 2
        now = self.source.rss()
        if now is None:
            return
        per_env = max((now - self._base) / (made - 1), self.floor)
        self._check(self.n - made, per_env, made)

    def _check(self, remaining: int, per_env: float, made: int = 0) -> None:
        from loomrl.errors import ConfigError

        est = replace(estimate_env_memory(self.env, per_env), num_envs=remaining * self.share)
        how = (
            f"measured over the first {made} simulators"
            if made
            else "the pixel frames each env holds, at least"
        )
        whose = f"the {remaining} simulator(s) this env worker has still to make ({how})"
        if self.share > 1:
            whose += f", times the {self.share} env workers that may share this node"
        problem = memory_verdict(est, self.source.available(), what=whose)
        if problem is not None:
            raise ConfigError([problem])
