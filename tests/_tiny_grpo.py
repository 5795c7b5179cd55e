"""Runs of examples/tiny_grpo.yaml for the integration tests (the resume tests compare with an
uninterrupted run, the placement-invariance test compares plans): the overrides they share,
so that a run made once for the session serves both."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples/tiny_grpo.yaml"
PROFILE = ROOT / "examples/profiles/tiny_grpo.yaml"
SEED = 1
STEPS = 4  # the uninterrupted run's
# Every run of these tests: seed and profile fixed, the placement its own.
COMMON = [f"seed={SEED}", f"run.profile={PROFILE}"]


def save_one_device_plan(path: Path, profile: Path = PROFILE) -> Path:
    """The temporal plan of one device per component (rollout, reward, actor; 4 devices), from
    ``profile``, saved at ``path`` for ``placement=``: a launch starts three worker processes,
    where the tiny example's temporal plan starts five (seconds each on 2 cores)."""
    from loomrl.plan import fixed_plan, leaf, load_profile, temporal

    tree = temporal(leaf("rollout", 1), temporal(leaf("reward", 1), leaf("actor", 1)))
    fixed_plan(load_profile(profile), tree, 4).save(path)
    return path


def run_main(config: Path, overrides: list[str]) -> dict:
    """``loomrl run config overrides`` in this process (the session's Ray): the run's summary."""
    from loomrl.cli import _normalise_overrides, load_recipe_config

    mod, cfg = load_recipe_config(config, _normalise_overrides(overrides))
    return mod.main(cfg)
