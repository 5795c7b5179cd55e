"""Simulators for embodied RL: batched gymnasium envs with seeding, autoreset bookkeeping,
episode statistics, failure isolation and offload/onload. No torch here."""

from loomrl.envs.vec import (
    ActionShapeError,
    EnvConfig,
    EnvEvent,
    EnvFailureError,
    EpisodeStats,
    RenderingUnavailable,
    StepResult,
    VecEnv,
    check_env_id,
    probe_rendering,
    select_render_backend,
)

__all__ = [
    "ActionShapeError",
    "EnvConfig",
    "EnvEvent",
    "EnvFailureError",
    "EpisodeStats",
    "RenderingUnavailable",
    "StepResult",
    "VecEnv",
    "check_env_id",
    "probe_rendering",
    "select_render_backend",
]
