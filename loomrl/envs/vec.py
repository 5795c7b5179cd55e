"""A batch of gymnasium simulators stepped together, with failure isolation and episode bookkeeping.

``VecEnv`` owns ``num_envs`` independent ``gymnasium.Env`` instances and steps them in one
process (the unit a loomrl env worker holds). It is a loop over single envs rather than a
``gymnasium.vector.SyncVectorEnv`` because one simulator that raises must not take the batch
down: the failing env is reset, the failure is recorded as an event, the others keep going.
An env that fails on its very first reset or step while ``env_kwargs`` are given is the
exception: nothing ever worked, so the keywords are the likely cause, and a ``ConfigError``
naming them stops the VecEnv at once instead of failure after failure being counted.

Autoreset: gymnasium 1.x vector envs reset a finished env on the *next* call to ``step``, which
then returns the reset observation with reward 0 and ignores the action; a buffer that stores
that call as a transition learns from a transition that never happened. ``VecEnv`` resets a
finished env inside the same ``step`` call instead, so every ``step`` is a real transition for
every env: ``StepResult.final_obs`` holds the observation the step reached (the terminal one
when the episode ended) and ``StepResult.obs`` the one to act on next (the reset observation
when it ended). The sequence of real transitions is the same as gymnasium's next-step vector
env with its reset steps removed (tested).

Seeding: env ``i`` (global index ``index_offset + i``) is reset with ``seed + i`` the first
time and without a seed afterwards, so each env's episodes follow its own RNG stream.

This module knows nothing of torch or of policies.
"""

from __future__ import annotations

import collections
import contextlib
import difflib
import importlib
import io
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from loomrl.config import finite_number
from loomrl.envs.memory import BuildGuard, MemorySource, frame_bytes
from loomrl.errors import ConfigError, LoomError

# MuJoCo picks its GL backend once, when `mujoco` is first imported (by the first gym.make of a
# MuJoCo env). Headless machines need EGL; choosing it here, before that import, keeps
# state-only envs created earlier in the process from locking in a backend that cannot render.
os.environ.setdefault("MUJOCO_GL", "egl")

RENDER_BACKENDS = ("egl", "osmesa", "glfw")


class EnvFailureError(LoomError):
    """Simulators failed more often than ``EnvConfig.max_failures`` within ``failure_window`` steps.

    Raised by ``VecEnv.step`` once the step is complete; ``step_result`` holds that step's
    ``StepResult`` (the envs have moved on to it)."""

    step_result: StepResult | None = None


class ActionShapeError(LoomError, ValueError):
    """A policy handed ``VecEnv.step`` actions of the wrong shape, type or range."""


class RenderingUnavailable(LoomError):
    """No headless rendering backend works in this process (pixel observations impossible)."""


@dataclass
class EnvConfig:
    """What one ``VecEnv`` simulates. Every field is checked in ``__post_init__``.

    ``frame_skip`` repeats each action that many simulator steps (rewards summed); MuJoCo envs
    already integrate several physics steps per ``step``, so 1 is the usual value for them.
    ``cpu_cores`` is what the planner reserves for the worker holding this VecEnv.
    ``batch_render`` draws the pixel observations of all envs in one GL pass and one read-back
    (``loomrl.envs.render``) where the env allows it, with gymnasium's frames up to the
    rounding of a few edge pixels; False, or an env that does not allow it
    (``VecEnv.render_path`` says why), renders env by env through gymnasium.
    """

    env_id: str = "InvertedPendulum-v5"
    num_envs: int = 8
    seed: int = 0
    pixels: bool = False
    image_size: int = 84
    frame_skip: int = 1
    max_episode_steps: int | None = None
    cpu_cores: float = 1.0
    render_backend: str = "egl"
    batch_render: bool = True
    clip_actions: bool = True
    max_failures: int = 10
    failure_window: int = 1000
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.env_id, str) or not self.env_id:
            problems.append(
                f"env_id={self.env_id!r}: must be a gymnasium id such as 'HalfCheetah-v5'"
            )
        # Types first: the loader converts a YAML file's values, but a config built in Python
        # may hold "8" or "no" (truthy), which the checks below would take, or raise on.
        wrong = set()
        for name in _ENV_INTS:
            v = getattr(self, name)
            if (v is not None or name != "max_episode_steps") and (
                isinstance(v, bool) or not isinstance(v, (int, np.integer))
            ):
                problems.append(f"{name}={v!r}: must be a whole number, got {type(v).__name__}")
                wrong.add(name)
        for name in ("pixels", "batch_render", "clip_actions"):
            v = getattr(self, name)
            if not isinstance(v, (bool, np.bool_)):
                problems.append(f"{name}={v!r}: must be True or False, got {type(v).__name__}")
        if "num_envs" not in wrong and self.num_envs < 1:
            problems.append(f"num_envs={self.num_envs}: need at least one env; set num_envs >= 1")
        if "seed" not in wrong and self.seed < 0:
            # gymnasium refuses a negative seed, but only once the env workers have started.
            problems.append(f"seed={self.seed}: must be >= 0 (env i of the batch gets seed + i)")
        if "image_size" not in wrong and self.image_size < 8:
            problems.append(
                f"image_size={self.image_size}: images below 8x8 carry no signal; use e.g. 64 or 84"
            )
        if "frame_skip" not in wrong and self.frame_skip < 1:
            problems.append(f"frame_skip={self.frame_skip}: must be >= 1 (1 = no action repeat)")
        if (
            "max_episode_steps" not in wrong
            and self.max_episode_steps is not None
            and self.max_episode_steps < 1
        ):
            problems.append(
                f"max_episode_steps={self.max_episode_steps}: must be >= 1, or None for the env's own limit"
            )
        # NaN passes `<= 0` and inf would reserve every core: neither is a share of CPU.
        c = self.cpu_cores
        if isinstance(c, str) or not (finite_number(c) or 0) > 0:
            problems.append(
                f"cpu_cores={c}: simulators need CPU; declare a positive, finite share "
                "(e.g. 1, or 0.5 to reserve half a core per env worker; on host cores beside a GPU "
                "no more env workers start than the node has cores)"
            )
        if self.render_backend not in RENDER_BACKENDS:
            problems.append(
                f"render_backend={self.render_backend!r}: choose one of {RENDER_BACKENDS}"
            )
        if "max_failures" not in wrong and self.max_failures < 1:
            problems.append(f"max_failures={self.max_failures}: must be >= 1")
        if "failure_window" not in wrong and self.failure_window < 1:
            problems.append(f"failure_window={self.failure_window}: must be >= 1 (vector steps)")
        # "human" opens a window from every simulator on every step: without a display GLFW
        # aborts the env worker's process (a C assertion, no Python error to record).
        mode = self.env_kwargs.get("render_mode") if isinstance(self.env_kwargs, dict) else None
        if mode == "human" and not os.environ.get("DISPLAY"):
            problems.append(
                "env_kwargs.render_mode='human': it opens a window from every simulator, and "
                "this node has no display (DISPLAY is unset), where the env workers' processes "
                "would abort; remove it (env.pixels=true gives the policy rgb_array frames)"
            )
        if problems:
            # The id's check imports gymnasium (and, for an unknown id, gymnasium-robotics), so
            # it is left to VecEnv and the recipe's validate() when nothing else is wrong; when
            # this section fails they never see the id, so it is checked here with the rest.
            if isinstance(self.env_id, str) and self.env_id:
                try:
                    check_env_id(self.env_id)
                except ConfigError as e:
                    problems += e.problems
                except Exception:  # noqa: BLE001 - VecEnv says it again, in full, once this passes
                    pass
            raise ConfigError(problems, source="EnvConfig")


_ENV_INTS = (
    "num_envs",
    "seed",
    "image_size",
    "frame_skip",
    "max_episode_steps",
    "max_failures",
    "failure_window",
)


@dataclass
class StepResult:
    """One ``VecEnv.step`` over ``n`` envs. Arrays are indexed by the env's position in the call.

    obs[n, *obs_shape]        observation to act on next (a reset observation where done)
    final_obs[n, *obs_shape]  observation this step reached, before any reset
    reward[n] float32         summed over frame_skip
    terminated[n], truncated[n], failed[n] bool
        failed: the simulator raised, or returned a NaN or infinite reward or (state)
        observation; the step counts as truncated with reward 0 and
        final_obs = the observation before the step.
    """

    obs: np.ndarray
    final_obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    failed: np.ndarray

    @property
    def done(self) -> np.ndarray:
        return self.terminated | self.truncated | self.failed


@dataclass
class EpisodeStats:
    """Finished episodes since the last ``pop_episode_stats`` (undiscounted env rewards)."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    successes: list[float] = field(
        default_factory=list
    )  # only for envs reporting info["is_success"]
    # Per episode (and per success), where it ended: (the env's transitions so far, its global
    # index). Both are the same under every placement, so episodes gathered from several env
    # workers, or from ring groups a step apart, can be put back in one order
    # (``cycle.merge_episodes``).
    ends: list[tuple[int, int]] = field(default_factory=list)
    success_ends: list[tuple[int, int]] = field(default_factory=list)

    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else float("nan")


@dataclass
class EnvEvent:
    """Something that went wrong and was recovered from (kept in ``VecEnv.events``)."""

    kind: str  # "env_error" | "env_recreated"
    env_index: int  # global index (index_offset + position)
    vec_step: int
    episode_step: int
    message: str


@dataclass
class _Slot:
    env: Any = None
    obs: np.ndarray | None = None
    episode_return: float = 0.0
    episode_length: int = 0
    seeded: bool = False
    rng_state: dict | None = None  # np_random state kept across offload/onload


# ---------------------------------------------------------------------------------------------
# env ids and rendering


# Ids of common packages that register their envs only once imported: (the id's start, the
# package to install, the module to name in env_id as "module:id").
_ENV_PACKAGES = (
    ("ALE/", "ale-py", "ale_py"),
    ("dm_control/", "shimmy[dm-control]", "shimmy"),
    ("MiniGrid-", "minigrid", "minigrid"),
    ("BabyAI-", "minigrid", "minigrid"),
)


def check_env_id(env_id: str) -> None:
    """Raise ``ConfigError`` naming close matches when ``env_id`` is not registered with gymnasium."""
    import gymnasium as gym

    named = ":" in env_id
    if named:  # gymnasium's "package.module:EnvId": the module registers the id
        module, _, env_id = env_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(
                [
                    f"env_id={module}:{env_id}: the module {module!r} that should register "
                    f"{env_id!r} cannot be imported ({e}); install it or fix the name"
                ],
                source="EnvConfig",
            ) from None
    if env_id in gym.registry:
        return
    try:  # Fetch/Franka ids appear only once gymnasium-robotics registers them
        # Its import prints a notice about the Adroit hand tasks' rewards to stderr (through
        # farama-notifications), which read as part of a config error or a run's output.
        with contextlib.redirect_stderr(io.StringIO()):
            import gymnasium_robotics

        gym.register_envs(gymnasium_robotics)
    except ImportError:
        pass
    if env_id in gym.registry:
        return
    for start, package, module in _ENV_PACKAGES:
        if env_id.startswith(start) and not named:
            raise ConfigError(
                [
                    f"env_id={env_id!r}: {start}* ids are registered by the {module} package "
                    f"when it is imported; pip install {package}, and write env_id: "
                    f"{module}:{env_id} so that the env workers import it"
                ],
                source="EnvConfig",
            )
    close = difflib.get_close_matches(env_id, list(gym.registry), n=5, cutoff=0.6)
    hint = f"close matches: {', '.join(close)}" if close else "no close match among registered ids"
    raise ConfigError(
        [
            f"env_id={env_id!r} is not a registered gymnasium environment ({hint}); check the "
            "spelling and version suffix, or install/import the package that registers it "
            "(pip install gymnasium-robotics for Fetch*); an env registered with "
            "gymnasium.register in the launching script is not registered in the env workers' "
            "processes: put that call in an importable module and write env_id: "
            f"package.module:{env_id}, which makes every process import it first"
        ],
        source="EnvConfig",
    )


_PROBE_SCRIPT = textwrap.dedent(
    """
    import gymnasium as gym
    env = gym.make("InvertedPendulum-v5", render_mode="rgb_array", width=32, height=32)
    env.reset(seed=0)
    img = env.render()
    assert img.shape == (32, 32, 3), img.shape
    print("ok")
    """
)

_probe_cache: dict[str, str | None] = {}


def probe_rendering(backend: str, timeout_s: float = 60.0) -> str | None:
    """Render one frame with ``MUJOCO_GL=backend`` in a subprocess; None if it works, else why not.

    A subprocess because a broken GL stack can hang or crash the process that tries it, and
    because MuJoCo's backend cannot be changed after import. Results are cached per process.
    """
    if backend in _probe_cache:
        return _probe_cache[backend]
    env = dict(os.environ, MUJOCO_GL=backend, PYOPENGL_PLATFORM=backend)
    if backend == "glfw":
        env.pop("PYOPENGL_PLATFORM")
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        reason = None if out.returncode == 0 else (out.stderr.strip().splitlines() or ["?"])[-1]
    except subprocess.TimeoutExpired:
        reason = f"rendering one frame did not finish within {timeout_s:.0f} s (hung GL driver?)"
    _probe_cache[backend] = reason
    return reason


def select_render_backend(preferred: str, timeout_s: float = 60.0) -> str:
    """The first backend that renders here, trying ``preferred`` then egl, osmesa.

    In this process MuJoCo may already be imported with a fixed backend; then only that one can
    work, and a different choice is an error the caller must fix by setting MUJOCO_GL before
    anything imports mujoco (a fresh worker process does this naturally).
    """
    active = os.environ.get("MUJOCO_GL")
    if "mujoco" in sys.modules:
        reason = probe_rendering(active or "glfw", timeout_s)
        if reason is None:
            return active or "glfw"
        raise RenderingUnavailable(
            f"pixel observations need rendering, but mujoco was already imported with "
            f"MUJOCO_GL={active!r}, which fails here: {reason}. Set MUJOCO_GL=egl (or osmesa) in "
            "the environment before anything imports mujoco."
        )
    tried = []
    for backend in dict.fromkeys([preferred, "egl", "osmesa"]):
        reason = probe_rendering(backend, timeout_s)
        if reason is None:
            os.environ["MUJOCO_GL"] = backend
            return backend
        tried.append(f"{backend}: {reason}")
    raise RenderingUnavailable(
        "no headless rendering backend works here, so pixels=True is impossible; tried "
        + "; ".join(tried)
        + ". Install EGL (libegl1) or OSMesa (libosmesa6), or use state observations."
    )


def resize_image(img: np.ndarray, size: int) -> np.ndarray:
    """[H, W, C] uint8 -> [C, size, size] uint8 by area averaging (nearest when upscaling)."""
    h, w = img.shape[:2]
    if (h, w) != (size, size):
        if h % size == 0 and w % size == 0:
            img = img.reshape(size, h // size, size, w // size, -1).mean(axis=(1, 3))
        else:
            rows = (np.arange(size) * h) // size
            cols = (np.arange(size) * w) // size
            img = img[rows][:, cols]
    return np.ascontiguousarray(
        np.asarray(img, dtype=np.float32).round().astype(np.uint8).transpose(2, 0, 1)
    )


# ---------------------------------------------------------------------------------------------


class VecEnv:
    """``cfg.num_envs`` simulators of ``cfg.env_id``; env ``i`` has global index ``index_offset + i``.

    Workers holding different slices of one logical batch pass different ``index_offset`` so
    that the union behaves exactly like one VecEnv of all envs (same seeds, same streams).
    """

    def __init__(
        self,
        cfg: EnvConfig,
        index_offset: int = 0,
        memory: MemorySource | None = None,
        memory_share: int = 1,
    ):
        """``memory``: where ``onload`` reads the memory figures that its check of the
        simulators' projected memory compares (``loomrl.envs.memory``; None: this node's);
        ``memory_share``: env workers that may build on this node at the same time."""
        import gymnasium as gym

        self.cfg = cfg
        self.index_offset = index_offset
        self._memory, self._memory_share = memory, memory_share
        self.num_envs = cfg.num_envs
        check_env_id(cfg.env_id)
        if cfg.pixels:
            self.render_backend: str | None = select_render_backend(cfg.render_backend)
        else:
            self.render_backend = None
        self._slots = [_Slot() for _ in range(self.num_envs)]
        self.events: list[EnvEvent] = []
        self.vec_steps = 0  # number of step() calls that covered all envs or a group
        self.render_s = 0.0  # seconds drawing pixel observations (read-backs included)
        self.render_reads = 0  # read-backs of drawn frames (each waits for the GPU)
        self.env_steps = np.zeros(self.num_envs, dtype=np.int64)  # transitions per env, ever
        self.episodes_cut = 0  # episodes abandoned by offload()
        self._failures: collections.deque[int] = collections.deque()
        self._stats = EpisodeStats()
        self._tiles: Any = None  # a TiledRenderer while pixels are drawn in one pass
        self._alone: dict[int, str] = {}  # envs it cannot draw (-> why): drawn by themselves
        self._no_tiles: str | None = None  # why pixels are drawn env by env, when they are
        self._loaded = False
        self._broken: str | None = None  # why no step can run any more (_recover)
        self._bad_kwargs: ConfigError | None = None  # env_kwargs that fail at once (_kwargs_fault)
        self.onload()
        probe = self._slots[0].env
        try:
            _check_spaces(cfg.env_id, probe, cfg.pixels)
        except ConfigError:
            self.close()
            raise
        self.single_action_space = probe.action_space
        # An env whose own observations are images (a uint8 Box of 3 dims, channels first or
        # last) keeps them as images [C, H, W] for the CNN: flattened, a 96x96 RGB frame would
        # be 27,648 numbers normalised one by one for an MLP.
        self._image_axes = None if cfg.pixels else image_axes(probe.observation_space)
        if cfg.pixels:
            self.single_observation_space = gym.spaces.Box(
                0, 255, (3, cfg.image_size, cfg.image_size), np.uint8
            )
        elif self._image_axes is not None:
            shape = tuple(probe.observation_space.shape[a] for a in self._image_axes)
            self.single_observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        else:
            flat = gym.spaces.flatten_space(probe.observation_space)
            self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, flat.shape, np.float32)
        self._raw_observation_space = probe.observation_space
        # The shape of a float Box's observations, whose steps' observations are checked and
        # flattened as one batch (``_check_observations``); None: env by env.
        box = probe.observation_space
        self._flat_box: tuple[int, ...] | None = (
            tuple(box.shape)
            if not cfg.pixels
            and self._image_axes is None
            and isinstance(box, gym.spaces.Box)
            and np.issubdtype(box.dtype, np.floating)
            else None
        )

    # -- properties the planner and the policy side read ------------------------------------
    @property
    def cpu_cores(self) -> float:
        return self.cfg.cpu_cores

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return tuple(self.single_observation_space.shape)

    @property
    def action_shape(self) -> tuple[int, ...]:
        return tuple(self.single_action_space.shape)

    @property
    def obs(self) -> np.ndarray | None:
        """Current observations [num_envs, *obs_shape], or None before the first reset."""
        if any(s.obs is None for s in self._slots):
            return None
        return np.stack([s.obs for s in self._slots])

    def row_ids(self, envs: slice | None = None) -> tuple[list[int], np.ndarray]:
        """(global env indices, transitions taken so far) of the envs in ``envs``: the key a
        policy derives each row's sampling stream from (``loomrl.policies.row_generators``)."""
        idx = range(self.num_envs)[envs] if envs is not None else range(self.num_envs)
        return [self.index_offset + i for i in idx], self.env_steps[
            idx.start : idx.stop : idx.step
        ].copy()

    def __repr__(self) -> str:
        return f"VecEnv({self.cfg.env_id!r}, num_envs={self.num_envs}, index_offset={self.index_offset})"

    # -- lifecycle ----------------------------------------------------------------------------
    def _make(self) -> Any:
        import gymnasium as gym

        kwargs = dict(self.cfg.env_kwargs)
        if self.cfg.max_episode_steps is not None:
            kwargs["max_episode_steps"] = self.cfg.max_episode_steps
        added: list[str] = []  # width/height set here, not by the user
        if self.cfg.pixels:
            kwargs["render_mode"] = "rgb_array"
            added = [k for k in ("width", "height") if k not in kwargs]
            kwargs.update({k: self.cfg.image_size for k in added})
        try:
            try:
                return gym.make(self.cfg.env_id, **kwargs)
            except TypeError:
                if not added:
                    raise
                # Not every env takes width/height; render at its own size and downscale.
                # Only ours go: a width the user set that the env refuses is reported below.
                for k in added:
                    kwargs.pop(k)
                return gym.make(self.cfg.env_id, **kwargs)
        except TypeError as e:
            # A keyword of env.env_kwargs the env's constructor does not take: the user's
            # settings, not a fault of the env (any other TypeError is the generic error below).
            m = re.search(r"unexpected keyword argument '(\w+)'", str(e))
            if m is None or m.group(1) not in self.cfg.env_kwargs:
                raise self._not_made(kwargs, e) from e
            raise ConfigError(
                [
                    f"env.env_kwargs: {self.cfg.env_id} takes no keyword {m.group(1)!r} (given "
                    f"{dict(self.cfg.env_kwargs)}); check the names against the env's constructor"
                ]
            ) from None
        except Exception as e:
            raise self._not_made(kwargs, e) from e

    def _not_made(self, kwargs: dict[str, Any], e: BaseException) -> LoomError:
        """The error of a simulator that could not be made with ``kwargs``."""
        import gymnasium as gym

        hint = ""
        spec = gym.registry.get(self.cfg.env_id)
        if spec is not None and "gymnasium_robotics" in str(spec.entry_point):
            hint = (
                " (gymnasium-robotics 1.4.x fails to build Fetch envs with recent mujoco "
                "releases, e.g. 3.17 and 4.0; mujoco 3.2.7 works)"
            )
        if self.cfg.env_kwargs:
            hint += (
                f"; env.env_kwargs {_show_kwargs(self.cfg.env_kwargs)} went to its "
                "constructor: check their values (a TypeError or ValueError there is often a "
                "value of the wrong type or range)"
            )
        return LoomError(
            f"could not create {self.cfg.env_id!r} with {kwargs}: {type(e).__name__}: {e}{hint}"
        )

    def onload(self) -> None:
        """(Re)create the simulators. Envs that were running before ``offload`` start a new
        episode whose RNG continues where it stopped, so runs with and without an
        offload/onload at the same step are identical except that episodes were cut there."""
        if self._loaded:
            return
        # Too many simulators (or frames too large) for the node: a ConfigError naming the
        # keys, before the memory runs out, not a hang in swap or the OOM killer.
        floor = 2 * frame_bytes(self.cfg.image_size) if self.cfg.pixels else 0  # obs + read-back
        guard = BuildGuard(self.cfg, self._memory, share=self._memory_share, floor_bytes=floor)
        guard.start()
        for made, slot in enumerate(self._slots, 1):
            slot.env = self._make()
            guard.built(made)
        if self.cfg.pixels:
            self._start_tiles()
        for i, slot in enumerate(self._slots):
            if slot.rng_state is not None:
                self._resume(i, slot, slot.rng_state)
        self._loaded = True

    def _resume(self, i: int, slot: _Slot, rng_state: dict) -> None:
        """Start a new episode in a fresh simulator whose RNG continues from ``rng_state``."""
        slot.obs = self._observe(i, self._resume_raw(i, slot, rng_state))

    def _resume_raw(self, i: int, slot: _Slot, rng_state: dict) -> Any:
        """``_resume`` up to the new episode's raw observation, which it returns."""
        slot.env.reset(seed=self.cfg.seed + self.index_offset + i)  # initialise, then
        slot.env.unwrapped.np_random = _generator_from_state(rng_state)
        raw = slot.env.reset()[0]
        slot.episode_return, slot.episode_length = 0.0, 0
        if not self.cfg.pixels and not _all_finite(raw):  # as in _reset_env
            raise NonFiniteStep(
                "the reset returned an observation holding NaN or inf (or a number past "
                "float32's range)"
            )
        return raw

    @property
    def render_path(self) -> str | None:
        """How pixels are drawn: "batched" (naming any env drawn by itself, and why), or
        "env by env: <why>"; None without pixels or while offloaded."""
        if self._tiles is None:
            return f"env by env: {self._no_tiles}" if self._no_tiles else None
        return "batched" + "".join(
            f"; env {self.index_offset + j} by itself: {why}"
            for j, why in sorted(self._alone.items())
        )

    def _start_tiles(self) -> None:
        from loomrl.envs.render import TiledRenderer, tileable

        self._alone, self._no_tiles = {}, None
        if not self.cfg.batch_render:
            self._no_tiles = "batch_render is off"
            return
        self._no_tiles = tileable(self._slots[0].env)
        if self._no_tiles is not None:
            return
        try:
            self._tiles = TiledRenderer(self._slots[0].env)
            self._reads_counted = 0
        except Exception as e:  # a GL driver without room for the grid, say
            self._no_tiles = f"the one-pass renderer did not start ({type(e).__name__}: {e})"
            return
        for i, slot in enumerate(self._slots):
            self._check_tile(i, slot)

    def _check_tile(self, i: int, slot: _Slot) -> None:
        """Draw env i by itself, through gymnasium, if the one-pass renderer cannot draw it."""
        reason = self._tiles.mismatch(slot.env)
        if reason is None:
            self._alone.pop(i, None)
        else:
            self._alone[i] = reason

    def _stop_tiles(self) -> None:
        if self._tiles is not None:
            self._tiles.close()
            self._tiles = None

    def offload(self) -> None:
        """Close the simulators (GL contexts, MuJoCo data) and keep only their RNG states."""
        if not self._loaded:
            return
        self._stop_tiles()
        for slot in self._slots:
            if slot.seeded:
                slot.rng_state = slot.env.unwrapped.np_random.bit_generator.state
                if slot.episode_length > 0:
                    self.episodes_cut += 1
            _close_env(slot.env)
            slot.env = None
        self._loaded = False

    def close(self) -> None:
        if self._loaded:
            self._stop_tiles()
            for slot in self._slots:
                _close_env(slot.env)
                slot.env = None
            self._loaded = False

    def _require_loaded(self, what: str) -> None:
        if self._bad_kwargs is not None:
            raise self._bad_kwargs
        if self._broken is not None:
            raise EnvFailureError(self._broken)
        if not self._loaded:
            raise LoomError(f"{self!r}.{what}() called while offloaded; call onload() first")

    # -- stepping -----------------------------------------------------------------------------
    def reset(self) -> np.ndarray:
        """Start a new episode in every env; the first reset of env i uses seed + i."""
        self._require_loaded("reset")
        raws = []
        too_many: EnvFailureError | None = None
        for i, slot in enumerate(self._slots):
            first = not slot.seeded
            try:
                raws.append(self._reset_env(i, slot))
            except Exception as e:
                if first and self.cfg.env_kwargs:
                    raise self._kwargs_fault(i, "first reset", e) from e
                # As a reset after a failed step: recorded, and a new simulator in its place.
                too_many = self._record_failure(i, slot, e, "reset") or too_many
                raws.append(self._reset_new_simulator(i, slot, f"reset failed: {e!r}"))
        seen = self._observe_many(list(range(self.num_envs)), raws)  # one read-back of pixels
        for slot, obs in zip(self._slots, seen, strict=True):
            slot.obs = obs
        if too_many is not None:
            raise too_many
        return self.obs  # type: ignore[return-value]

    def _reset_slot(self, i: int, slot: _Slot) -> None:
        slot.obs = self._observe(i, self._reset_env(i, slot))

    def _reset_env(self, i: int, slot: _Slot) -> Any:
        """Start env i's next episode (seed + i the first time); its raw observation."""
        if slot.seeded:
            raw, _ = slot.env.reset()
        else:
            raw, _ = slot.env.reset(seed=self.cfg.seed + self.index_offset + i)
            slot.seeded = True
        slot.episode_return, slot.episode_length = 0.0, 0
        # As a step's (``_step_one``): a NaN here would reach the normaliser and the policy,
        # whose NaN actions would then be blamed on the policy.
        if not self.cfg.pixels and not _all_finite(raw):
            raise NonFiniteStep(
                "the reset returned an observation holding NaN or inf (or a number past "
                "float32's range)"
            )
        return raw

    def _observe(self, i: int, raw: Any) -> np.ndarray:
        return self._observe_many([i], [raw])[0]

    def _observe_many(self, ids: list[int], raws: list[Any]) -> list[np.ndarray]:
        """Observations of envs ``ids`` (positions in this VecEnv) from their raw ones."""
        return self._observe_later(ids, raws)()

    def _observe_later(
        self, ids: list[int], raws: list[Any], second: bool = False
    ) -> Callable[[], list[np.ndarray]]:
        """Start taking the observations of envs ``ids``; the returned function finishes and
        returns them. Pixels are drawn now and read back there, so the envs may reset in
        between and their reset frames be drawn (``second``: into their second cells) and read
        back with these: one wait for the GPU a step."""
        slots = [self._slots[i] for i in ids]
        if not self.cfg.pixels and self._image_axes is not None:
            want_shape = slots[0].env.observation_space.shape if slots else None
            images = []
            for n, raw in enumerate(raws):
                a = np.asarray(raw)
                if a.shape != want_shape or a.dtype != np.uint8:
                    raise EnvFailureError(
                        f"{self.cfg.env_id}: env {self.index_offset + ids[n]} returned an "
                        f"observation of shape {list(a.shape)} ({a.dtype}) where its "
                        f"observation space {slots[n].env.observation_space} declares "
                        f"{list(want_shape or ())} (uint8); fix the env's observations"
                    )
                images.append(np.ascontiguousarray(a.transpose(self._image_axes)))
            return lambda: images
        if not self.cfg.pixels:
            import gymnasium as gym

            try:
                flat = [
                    np.asarray(gym.spaces.flatten(s.env.observation_space, raw), dtype=np.float32)
                    for s, raw in zip(slots, raws, strict=True)
                ]
            except (TypeError, ValueError) as e:  # text, None in a dict, ...: not numbers
                raise self._not_numbers(ids, raws, e) from e
            want = gym.spaces.flatdim(slots[0].env.observation_space) if slots else 0
            for n, f in enumerate(flat):
                if f.size != want:  # stacked with the others, it would fail with numpy's words
                    space = slots[n].env.observation_space
                    raise EnvFailureError(
                        f"{self.cfg.env_id}: env {self.index_offset + ids[n]} returned an "
                        f"observation of shape {list(np.shape(raws[n]))} where its observation "
                        f"space {space} declares {list(space.shape or ())}; fix the env's "
                        "observations"
                    )
            return lambda: flat
        if not ids:
            return list
        t = time.perf_counter()
        tiles = self._tiles
        frames: list[Any] = [None] * len(ids)
        tiled = [] if tiles is None else [n for n, i in enumerate(ids) if i not in self._alone]
        envs, gids = [slots[n].env for n in tiled], [self.index_offset + ids[n] for n in tiled]
        keys = tiles.draw(envs, gids, second) if tiled else []
        for n in sorted(set(range(len(ids))) - set(tiled)):  # drawn, read back by themselves
            frames[n] = self._rgb(self._gym_frame(slots[n].env, ids[n]), ids[n])
            self.render_reads += 1
        self._count_reads()  # a draw reads back first where a cell is taken
        self.render_s += time.perf_counter() - t

        def finish() -> list[np.ndarray]:
            t = time.perf_counter()
            if keys:
                for n, f in zip(tiled, tiles.frames(keys), strict=True):
                    frames[n] = f
            self._count_reads()
            out = [resize_image(f, self.cfg.image_size) for f in frames]
            self.render_s += time.perf_counter() - t
            return out

        return finish

    def _not_numbers(self, ids: list[int], raws: list[Any], e: BaseException) -> EnvFailureError:
        """The error of an observation among ``raws`` (of envs ``ids``) that is not numbers of
        the env's observation space (found again, one by one, only after the batch failed)."""
        import gymnasium as gym

        def numbers(i: int, raw: Any) -> bool:
            try:
                np.asarray(
                    gym.spaces.flatten(self._slots[i].env.observation_space, raw), np.float32
                )
            except (TypeError, ValueError):
                return False
            return True

        n = next(
            (n for n, (i, raw) in enumerate(zip(ids, raws, strict=True)) if not numbers(i, raw)), 0
        )
        raw, space = raws[n], self._slots[ids[n]].env.observation_space
        return EnvFailureError(
            f"{self.cfg.env_id}: env {self.index_offset + ids[n]} returned an observation that "
            f"is not numbers of its observation space {space}: {type(raw).__name__} "
            f"{str(raw)[:80]!r} ({type(e).__name__}: {e}); fix the env's observations"
        )

    def _gym_frame(self, env: Any, i: int) -> Any:
        """``_gym_frame(env)``, env i's; a ``ConfigError`` naming env.pixels where its
        renderer needs a package that is not installed (pygame for the classic-control envs),
        which gymnasium says only at the first frame."""
        try:
            return _gym_frame(env)
        except Exception as e:
            import gymnasium as gym  # here, not on every frame

            if not isinstance(e, gym.error.DependencyNotInstalled):
                raise
            raise ConfigError(
                [
                    f"env.pixels=true: {self.cfg.env_id} env {self.index_offset + i} cannot draw "
                    f"frames here ({e}); install what it names, or use state observations "
                    "(env.pixels=false)"
                ]
            ) from None

    def _rgb(self, frame: Any, i: int) -> np.ndarray:
        """``frame``, env i's ``render()``, as an RGB image [H, W, 3] (an alpha channel
        dropped); a ``ConfigError`` naming env.pixels where it is none (an env that does not
        draw rgb_array frames returns None, or text)."""
        a = frame if isinstance(frame, np.ndarray) else None
        if a is not None and a.ndim == 3 and a.shape[2] in (3, 4) and min(a.shape[:2]) > 0:
            return a[:, :, :3]
        got = (
            f"an array of shape {list(a.shape)} ({a.dtype})"
            if a is not None
            else "None"
            if frame is None
            else f"a {type(frame).__name__} ({str(frame)[:80]!r})"
        )
        raise ConfigError(
            [
                f"env.pixels=true: {self.cfg.env_id} env {self.index_offset + i}'s render() "
                f"returned {got}, not an RGB frame [H, W, 3]: the env does not draw "
                "rgb_array frames; use state observations (env.pixels=false) or an env that "
                "renders"
            ]
        )

    def _count_reads(self) -> None:
        """Add the one-pass renderer's read-backs since the last count to ``render_reads``."""
        if self._tiles is not None:
            self.render_reads += self._tiles.reads - self._reads_counted
            self._reads_counted = self._tiles.reads

    def step(self, actions: Any, envs: slice | None = None) -> StepResult:
        """Step every env (or the contiguous ``envs`` slice) with ``actions[n, *action_shape]``."""
        self._require_loaded("step")
        idx = range(self.num_envs)[envs] if envs is not None else range(self.num_envs)
        if any(self._slots[i].obs is None for i in idx):
            raise LoomError(f"{self!r}.step() before reset(); call reset() once first")
        actions = self._check_actions(actions, len(idx))
        self.vec_steps += 1
        n = len(idx)
        rew = np.zeros(n, np.float32)
        term = np.zeros(n, bool)
        trunc = np.zeros(n, bool)
        failed = np.zeros(n, bool)
        obs: list[Any] = [None] * n
        final: list[Any] = [None] * n
        stepped = []  # (k, i, raw, info) of the envs whose step did not raise
        too_many: EnvFailureError | None = None  # raised once every env's state is consistent
        # Every env steps first, then their observations are checked together: one numpy pass
        # over the batch where the observation space is a float Box (most simulators) instead
        # of a check and a flatten per env (8 of the 50 us a HalfCheetah env-step took).
        outcomes: list[Any] = [None] * n
        for k, i in enumerate(idx):
            try:
                outcomes[k] = self._step_one(self._slots[i], actions[k])
            except Exception as e:  # a simulator bug or instability: isolate it, keep training
                outcomes[k] = e
        rows = self._check_observations(outcomes)
        for k, i in enumerate(idx):
            slot, got = self._slots[i], outcomes[k]
            if isinstance(got, Exception):
                if self.env_steps[i] == 0 and self.cfg.env_kwargs:
                    # Not one step ever worked: the user's keywords, not bad luck mid-episode.
                    raise self._kwargs_fault(i, "first step", got) from got
                # every failure is recorded; the last error counts them all
                too_many = self._record_failure(i, slot, got) or too_many
                failed[k] = True
                final[k] = slot.obs
                self._recover(i, slot)
                obs[k] = slot.obs
                self.env_steps[i] += 1
                continue
            raw, r, te, tr, info = got
            rew[k], term[k], trunc[k] = r, te, tr
            slot.episode_return += r
            slot.episode_length += 1
            self.env_steps[i] += 1
            stepped.append((k, i, raw, info))
        # Observations are taken after every env has stepped so that pixels are drawn in one
        # pass; envs are independent, so the order changes no result. The envs that ended are
        # reset after their last frames are drawn and before they are read back, so that their
        # reset frames come back in the same read-back.
        if rows is None:
            seen = self._observe_later([x[1] for x in stepped], [x[2] for x in stepped])
        else:
            ready = [rows[x[0]] for x in stepped]
            seen = lambda: ready  # noqa: E731
        ended = []
        unreset = []  # (k, i, error) of envs whose episode ended and whose reset then raised
        for k, i, _, info in stepped:
            slot = self._slots[i]
            if term[k] or trunc[k]:
                end = (int(self.env_steps[i]), self.index_offset + i)
                self._stats.returns.append(slot.episode_return)
                self._stats.lengths.append(slot.episode_length)
                self._stats.ends.append(end)
                if "is_success" in info:
                    self._stats.successes.append(float(info["is_success"]))
                    self._stats.success_ends.append(end)
                try:
                    ended.append((k, i, self._reset_env(i, slot)))
                except Exception as e:  # the step was real; the next episode needs a simulator
                    unreset.append((k, i, e))
        starts = self._observe_later([x[1] for x in ended], [x[2] for x in ended], second=True)
        for (k, i, _, _), next_obs in zip(stepped, seen(), strict=True):
            final[k] = next_obs
            if not (term[k] or trunc[k]):
                self._slots[i].obs = obs[k] = next_obs
        for (k, i, _), first in zip(ended, starts(), strict=True):
            self._slots[i].obs = obs[k] = first
        for k, i, e in unreset:  # after the read-backs: a new simulator draws its own frame
            slot = self._slots[i]
            too_many = self._record_failure(i, slot, e, "reset after its episode ended") or too_many
            self._remake(i, slot, f"reset after its episode ended failed: {e!r}")
            obs[k] = slot.obs
        result = StepResult(np.stack(obs), np.stack(final), rew, term, trunc, failed)
        if too_many is not None:
            too_many.step_result = result
            raise too_many
        return result

    def _step_one(self, slot: _Slot, action: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        """One env's step (``frame_skip`` simulator steps); its observation is checked with the
        others' in ``_check_observations``."""
        total = 0.0
        for _ in range(self.cfg.frame_skip):
            raw, r, te, tr, info = slot.env.step(action)
            total += float(r)
            if te or tr:
                break
        # A NaN or inf would poison the observation normaliser and the reward scaler for the
        # rest of the run (and the policy's next action): a failure of this step, as a raise is.
        if not abs(total) <= _F32_MAX:  # NaN compares False; the buffer keeps float32
            past = " (past float32's range, where rewards are kept)" if np.isfinite(total) else ""
            raise NonFiniteStep(f"the step returned a reward of {total}{past}")
        return raw, total, bool(te), bool(tr), info

    def _check_observations(self, outcomes: list[Any]) -> list[np.ndarray] | None:
        """Check the state observations of the envs whose step returned (``outcomes[k]`` a
        ``_step_one`` tuple; the others an exception): an observation that is not finite as a
        float32 makes its outcome a ``NonFiniteStep``, as a check in ``_step_one`` would. Where
        the observation space is a float Box and every observation has its shape, also their
        flat float32 rows by position (None: ``_observe_later`` takes them)."""
        if self.cfg.pixels:
            return None
        good = [k for k, o in enumerate(outcomes) if not isinstance(o, Exception)]
        batch = None
        if self._flat_box is not None and good:
            try:
                with np.errstate(over="ignore", invalid="ignore"):  # past float32 -> inf
                    batch = np.asarray([outcomes[k][0] for k in good], dtype=np.float32)
            except (TypeError, ValueError):  # ragged or not numbers: the check env by env says
                batch = None
            if batch is not None and batch.shape != (len(good), *self._flat_box):
                batch = None
        if batch is None:
            for k in good:
                if not _all_finite(outcomes[k][0]):
                    outcomes[k] = NonFiniteStep(_NOT_FINITE_STEP)
            return None
        flat = batch.reshape(len(good), -1)
        finite = np.isfinite(flat).all(axis=1)
        rows: list[Any] = [None] * len(outcomes)
        for n, k in enumerate(good):
            if finite[n]:
                rows[k] = flat[n]
            else:
                outcomes[k] = NonFiniteStep(_NOT_FINITE_STEP)
        return rows

    def _check_actions(self, actions: Any, n: int) -> np.ndarray:
        import gymnasium as gym

        space = self.single_action_space
        if hasattr(actions, "detach"):
            actions = actions.detach().cpu()
            # numpy has no bfloat16 (a policy run in bf16 would fail here with torch's words);
            # float32 holds every bfloat16 value exactly.
            if str(actions.dtype) == "torch.bfloat16":
                actions = actions.float()
        a = np.asarray(actions)
        expected = (n, *space.shape)
        if a.shape != expected:
            raise ActionShapeError(
                f"{self!r}.step(actions): actions have shape {a.shape} but {self.cfg.env_id} needs "
                f"{expected} = (envs stepped, *action_space.shape) for action_space {space}; "
                "return one action per env from the policy"
                + (
                    " (Discrete actions are integer indices, not one-hot)"
                    if isinstance(space, gym.spaces.Discrete)
                    else ""
                )
            )
        if isinstance(
            space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
        ):
            # Neither the env nor gymnasium checks them: a fraction or an index past the end
            # would be stepped as whatever the env makes of it.
            lo, hi = int_action_bounds(space)
            name = "Discrete" if isinstance(space, gym.spaces.Discrete) else str(space)
            if not np.issubdtype(a.dtype, np.integer):
                raise ActionShapeError(
                    f"{self!r}.step(actions): {name} actions must be integers, got dtype {a.dtype}"
                )
            if (a < lo).any() or (a >= hi).any():
                raise ActionShapeError(
                    f"{self!r}.step(actions): {name} actions must lie in [{lo.tolist()}, "
                    f"{hi.tolist()})"
                    + (" element by element" if lo.shape else "")
                    + f", got {a.tolist()}"
                )
            return a
        if isinstance(space, gym.spaces.Box):
            # Text fails the cast below with numpy's words, None becomes NaN, and a complex
            # number loses its imaginary part without a word: none of them is an action.
            if a.dtype.kind not in "biuf":
                raise ActionShapeError(
                    f"{self!r}.step(actions): Box actions must be real numbers, got dtype "
                    f"{a.dtype} (e.g. {a.reshape(-1)[:3].tolist()}); return a float tensor or "
                    "array of actions from the policy"
                )
            a = a.astype(space.dtype, copy=False)
            if not np.isfinite(a).all():
                raise ActionShapeError(
                    f"{self!r}.step(actions): actions contain NaN/inf: {a.tolist()}"
                )
            if self.cfg.clip_actions:
                a = np.clip(a, space.low, space.high)
        return a

    # -- failures -----------------------------------------------------------------------------
    def _record_failure(
        self, i: int, slot: _Slot, e: BaseException, when: str = ""
    ) -> EnvFailureError | None:
        """Record env i's failure (``when``: where, if not in its step); the error to raise
        (after the step) when there were too many."""
        gi = self.index_offset + i
        msg = f"{when + ': ' if when else ''}{type(e).__name__}: {e}"
        self.events.append(EnvEvent("env_error", gi, self.vec_steps, slot.episode_length, msg))
        self._failures.append(self.vec_steps)
        while self._failures and self._failures[0] <= self.vec_steps - self.cfg.failure_window:
            self._failures.popleft()
        if len(self._failures) <= self.cfg.max_failures:
            return None
        err = EnvFailureError(
            f"{self.cfg.env_id}: {len(self._failures)} simulator failures within the last "
            f"{self.cfg.failure_window} steps (max_failures={self.cfg.max_failures}); the last, in "
            f"env {gi} at episode step {slot.episode_length}: {msg}. {_api_hint(e)}"
            f"{self._kwargs_hint(e)}Fix "
            "the environment, or raise env.max_failures / lower env.failure_window if such "
            "failures are expected."
        )
        err.__cause__ = e
        return err

    def _kwargs_hint(self, e: BaseException) -> str:
        """Where env_kwargs were given, a sentence pointing at them (a TypeError or ValueError
        is what a value of the wrong type or range raises inside a simulator); else ''."""
        if not self.cfg.env_kwargs:
            return ""
        given = _show_kwargs(self.cfg.env_kwargs)
        if isinstance(e, (TypeError, ValueError)):
            return (
                f"A {type(e).__name__} there often means a value of the wrong type or range in "
                f"env.env_kwargs (given: {given}): check those first. "
            )
        return f"env.env_kwargs were given ({given}): check them too. "

    def _kwargs_fault(self, i: int, when: str, e: BaseException) -> ConfigError:
        """The error for env i failing on its ``when`` ("first reset" / "first step") with
        env_kwargs given; this VecEnv is left broken (other envs may be half-stepped), and
        every later call raises it again."""
        self._bad_kwargs = ConfigError(
            [
                f"env.env_kwargs: {self.cfg.env_id} env {self.index_offset + i} failed on its "
                f"{when} with env_kwargs {_show_kwargs(self.cfg.env_kwargs)} "
                f"({type(e).__name__}: {e}); a keyword of the wrong type or out of range is the "
                "likely cause: check each value against the env's constructor (a number given "
                "as text?), or remove it to use the env's default"
            ]
        )
        return self._bad_kwargs

    def _recover(self, i: int, slot: _Slot) -> None:
        """Reset a failed env; if even that raises, replace the simulator."""
        slot.episode_return, slot.episode_length = 0.0, 0
        try:
            self._reset_slot(i, slot)
            return
        except Exception as e:
            self._remake(i, slot, f"reset failed: {e!r}")

    def _reset_new_simulator(self, i: int, slot: _Slot, why: str) -> Any:
        """Replace env i's simulator, whose reset raised (``why``), by a new one and start its
        episode: with seed + i where the old one never started one, else with the old one's RNG
        continued. Recorded as an ``env_recreated`` event; returns the raw observation."""
        self.events.append(EnvEvent("env_recreated", self.index_offset + i, self.vec_steps, 0, why))
        rng = slot.env.unwrapped.np_random.bit_generator.state if slot.seeded else None
        self._new_simulator(i, slot)
        try:
            if self._tiles is not None:  # a fresh env: its first frame sets its camera either way
                self._check_tile(i, slot)
            return self._reset_env(i, slot) if rng is None else self._resume_raw(i, slot, rng)
        except Exception as e:
            self._give_up(
                i, f"the new simulator made for it failed to reset too ({type(e).__name__}: {e})", e
            )

    def _remake(self, i: int, slot: _Slot, why: str) -> None:
        """``_reset_new_simulator``, observing the new episode."""
        slot.obs = self._observe(i, self._reset_new_simulator(i, slot, why))

    def _new_simulator(self, i: int, slot: _Slot) -> None:
        """Close env i's simulator and make a new one in its place (or give up, saying why)."""
        if self._tiles is not None:
            self._tiles.forget(slot.env)
        try:
            _close_env(slot.env)
        except Exception:
            pass  # a broken simulator may fail to close too; it is being discarded
        # Nothing left to step env i with, either way below: this VecEnv is done (its other
        # envs may have moved on within the step), and says so on every later call.
        try:
            slot.env = self._make()
        except Exception as e:
            self._give_up(i, f"a new simulator could not be made ({type(e).__name__}: {e})", e)

    def _give_up(self, i: int, what: str, cause: BaseException) -> NoReturn:
        """Mark this VecEnv broken after env i could not be recovered, and raise saying why."""
        self._broken = (
            f"{self.cfg.env_id}: env {self.index_offset + i} failed, its reset failed, and "
            f"{what}; fix the environment, then start the workers again"
        )
        raise EnvFailureError(self._broken) from cause

    # -- statistics ---------------------------------------------------------------------------
    def pop_episode_stats(self) -> EpisodeStats:
        """Episodes finished since the last call (and forget them)."""
        stats, self._stats = self._stats, EpisodeStats()
        return stats

    def pop_events(self) -> list[EnvEvent]:
        events, self.events = self.events, []
        return events


class NonFiniteStep(ArithmeticError):
    """A simulator step gave a NaN or infinite reward or observation (counted as a failure)."""


_NOT_FINITE_STEP = (
    "the step returned an observation holding NaN or inf (or a number past float32's range)"
)


# Observations and rewards are kept as float32: a float64 past this is inf there.
_F32_MAX = float(np.finfo(np.float32).max)


def _all_finite(raw: Any) -> bool:
    """Whether every number of a raw observation (an array, or a dict / tuple of them) is finite,
    and stays so as the float32 the buffers keep."""
    if isinstance(raw, dict):
        return all(_all_finite(v) for v in raw.values())
    if isinstance(raw, (tuple, list)):
        return all(_all_finite(v) for v in raw)
    a = np.asarray(raw)
    if not np.issubdtype(a.dtype, np.inexact):
        return True
    if a.dtype.itemsize <= 4 and not np.iscomplexobj(a):
        return bool(np.isfinite(a).all())
    return bool((np.abs(a) <= _F32_MAX).all())  # NaN compares False, inf is past the bound


def int_action_bounds(space: Any) -> tuple[np.ndarray, np.ndarray]:
    """[low, high) of each element of an action of a Discrete, MultiDiscrete or MultiBinary
    space (arrays of the action's shape)."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return np.asarray(space.start), np.asarray(space.start + space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return np.asarray(space.start), np.asarray(space.start + space.nvec)
    if isinstance(space, gym.spaces.MultiBinary):
        return np.zeros(space.shape, np.int64), np.full(space.shape, 2, np.int64)
    raise TypeError(f"int_action_bounds: {space} has no integer actions")


def image_axes(space: Any) -> tuple[int, int, int] | None:
    """How to lay an env's own image observations out as [C, H, W]: the axes to transpose a
    uint8 Box of 3 dims by, channels last (1, 3 or 4 of them, as gymnasium's image envs give)
    or first; None for any other space (flattened into a vector). Pure."""
    import gymnasium as gym

    if not (
        isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3
    ):
        return None
    if space.shape[-1] in (1, 3, 4):
        return (2, 0, 1)
    if space.shape[0] in (1, 3, 4):
        return (0, 1, 2)
    return None


def _check_spaces(env_id: str, env: Any, pixels: bool) -> None:
    """A ``ConfigError`` for spaces the cycle cannot carry: actions that are not one array
    (Dict, Tuple, Text, ...) and, without pixels, observations of no fixed size (Sequence,
    Graph), which gymnasium cannot flatten into the float vector the policy reads."""
    import gymnasium as gym

    bad = []
    act = env.action_space
    arrays = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
    if not isinstance(act, arrays):
        bad.append(
            f"env_id={env_id!r}: its action space {act} is not one array; the policy returns "
            "one tensor of actions per step, so the space must be a Box, Discrete, "
            "MultiDiscrete or MultiBinary: wrap the env in a gymnasium.ActionWrapper whose action_space is a Box (or "
            "MultiDiscrete) and whose action() rebuilds the env's action from it"
        )
    if not pixels:
        try:
            flat = gym.spaces.flatten_space(env.observation_space)
        except (NotImplementedError, TypeError, ValueError) as e:
            flat, why = None, f" ({e})"
        else:
            why = ""
        if not isinstance(flat, gym.spaces.Box):
            bad.append(
                f"env_id={env_id!r}: its observation space {env.observation_space} cannot be "
                f"flattened into a vector of fixed size{why}; the policy reads one float vector "
                "per env: wrap the env in a gymnasium.ObservationWrapper that pads or summarises "
                "the observations into a Box"
            )
    if bad:
        raise ConfigError(bad, source="EnvConfig")


def _api_hint(e: BaseException) -> str:
    """Where ``e`` is what an env of the old gym API raises inside gymnasium's wrappers (a step
    of 4 values: obs, reward, done, info), a sentence saying so; else ''."""
    if isinstance(e, ValueError) and re.search(r"unpack \(expected 5, got 4\)", str(e)):
        return (
            "gymnasium's step() returns 5 values (observation, reward, terminated, truncated, "
            "info); 4 (observation, reward, done, info) is the old gym API: split done into "
            "terminated and truncated. "
        )
    return ""


def _show_kwargs(kwargs: dict[str, Any]) -> str:
    """``{'a': 'abc' (str), 'b': 2 (int)}``: env_kwargs with each value's type, which is what a
    wrong value usually gets wrong (a number that YAML or an override read as text). Text such
    as '1e-3', which YAML 1.1 reads as text for want of a dot, is named with the number's form."""
    out = []
    for k, v in kwargs.items():
        m = re.fullmatch(r"([-+]?\d+)([eE][-+]?\d+)", v.strip()) if isinstance(v, str) else None
        why = (
            f"str: YAML reads {v.strip()}, with no dot, as text; write {m[1]}.0{m[2]} for the number"
            if m
            else type(v).__name__
        )
        out.append(f"{k!r}: {v!r} ({why})")
    return "{" + ", ".join(out) + "}"


def _close_env(env: Any) -> None:
    """Close ``env``, first freeing its gymnasium viewers' GL objects in their own contexts.
    gymnasium's close frees a viewer's GL context but leaves its MjrContext to the garbage
    collector, which frees the same object ids in whatever context is current then: another
    env's, whose frames then came out blank (tested), or possibly the one-pass renderer's
    beside an env drawn by itself (not seen)."""
    viewers = getattr(getattr(env.unwrapped, "mujoco_renderer", None), "_viewers", None) or {}
    for viewer in viewers.values():
        con = getattr(viewer, "con", None)
        if con is not None and hasattr(viewer, "make_context_current"):
            viewer.make_context_current()
            con.free()
    env.close()


def _gym_frame(env: Any) -> np.ndarray:
    """``env.render()`` with the env's own GL context current. gymnasium makes a viewer's
    context current only when one env has several viewers; with several envs in a process the
    last context made current would draw for all (and freeing any context releases the
    thread's current one: ``eglReleaseThread``)."""
    viewer = getattr(getattr(env.unwrapped, "mujoco_renderer", None), "viewer", None)
    if viewer is not None and hasattr(viewer, "make_context_current"):
        viewer.make_context_current()
    return env.render()


def _generator_from_state(state: dict) -> np.random.Generator:
    bit_generator = getattr(np.random, state["bit_generator"])()
    bit_generator.state = state
    return np.random.Generator(bit_generator)
