"""The `loomrl` command: run | plan | profile | report | resume | export.

``loomrl run CONFIG [key=value ...]`` loads a recipe config (its ``recipe:`` key picks the recipe),
applies overrides and runs it. User mistakes (bad config, impossible plan, missing files) end with
a one-paragraph message and exit status 2, not a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from loomrl import __version__
from loomrl.errors import ConfigError, LoomError, PlacementError, PlanError
from loomrl.runlog import quiet_closed_stdout, say

RECIPES = {
    "demo": "loomrl.recipes.demo",
    "grpo": "loomrl.recipes.reasoning_grpo",
    "ppo": "loomrl.recipes.reasoning_ppo",
    "embodied_ppo": "loomrl.recipes.embodied_ppo",
    "agentic_search": "loomrl.recipes.agentic_search",
}


def _recipe_module(config: Path | dict, overrides: list[str]) -> Any:
    from loomrl.config import _read_yaml

    data = config if isinstance(config, dict) else _read_yaml(Path(config))
    if not isinstance(data, dict):
        raise ConfigError(
            [
                f"<top level>: expected a mapping of keys (recipe: ..., run: ...), got {type(data).__name__}"
            ],
            source=str(config),
        )
    # The last recipe= wins, as the last of any override does in load_config.
    name = next((o.split("=", 1)[1] for o in reversed(overrides) if o.startswith("recipe=")), None)
    name = name or data.get("recipe")
    if name is None:
        where = None if isinstance(config, dict) else str(config)
        first = "the file is empty (no keys)" if not data else "recipe: missing"
        raise ConfigError(
            [
                f"{first} — a config names the recipe it runs, recipe: NAME with NAME one of "
                f"{sorted(RECIPES)}, and sets that recipe's keys (as examples/tiny_grpo.yaml "
                "does)"
            ],
            source=where,
        )
    # recipe: [grpo] (a list) is unhashable: the membership test alone would raise TypeError.
    if not isinstance(name, str) or name not in RECIPES:
        import difflib

        word = name[0] if isinstance(name, list) and len(name) == 1 else name
        hint = difflib.get_close_matches(str(word), RECIPES, n=1)
        form = "" if isinstance(name, str) else " (a recipe is named by one word: recipe: NAME)"
        raise ConfigError(
            [
                f"recipe: {name!r} is not a recipe{form}; choose one of {sorted(RECIPES)}"
                + (f" — did you mean {hint[0]!r}?" if hint else "")
            ],
            source=str(config) if not isinstance(config, dict) else None,
        )
    return importlib.import_module(RECIPES[name])


def load_recipe_config(config: str | Path, overrides: list[str]) -> tuple[Any, Any]:
    from loomrl.config import load_config

    path = Path(config)
    if not path.exists():
        raise ConfigError([f"config file {str(path)!r} does not exist"])
    overrides = _normalise_overrides(overrides)  # the short forms, as the command line takes
    mod = _recipe_module(path, overrides)
    short = {k: f"run.{k}" for k in _TOP_LEVEL_RUN_KEYS}
    return mod, load_config(mod.Config, path, overrides, short_keys=short)


_RUN_DIR_LOCK: Any = None  # this process's hold on its run directory (runlog.lock_run_dir)


def _hold_run_dir(out: Path, resume: bool) -> None:
    """Hold ``out`` until this process exits (``runlog.lock_run_dir``), unless it holds it."""
    from loomrl.runlog import lock_run_dir

    global _RUN_DIR_LOCK
    if _RUN_DIR_LOCK is None or Path(_RUN_DIR_LOCK.name).parent != out:
        _RUN_DIR_LOCK = lock_run_dir(out, resume=resume)


def _fixed_on_resume(override: str) -> bool:
    from loomrl.run import FIXED_ON_RESUME

    key = override.split("=", 1)[0]
    return any(key == k or key.startswith(k + ".") for k in FIXED_ON_RESUME)


def _check_config_kept(
    run_dir: Path, cfg: Any, cfg_file: Path, keys: tuple[str, ...] | None = None, fix: str = ""
) -> None:
    """Refuse a resume whose config.yaml was changed (by hand, or replaced by another run's)
    in a key the checkpoints depend on: their state would be loaded into another recipe or
    model, or continue on other prompts. ``keys``: those compared (default: all recorded);
    ``fix``: the closing advice (default: a resume's)."""
    from loomrl.run import fixed_on_resume, recorded_fixed_on_resume

    then = recorded_fixed_on_resume(run_dir)
    if then is None:
        return
    now = fixed_on_resume(cfg)
    compared = then.keys() | now.keys() if keys is None else set(keys)
    changed = [k for k in sorted(compared) if then.get(k) != now.get(k)]
    if changed:
        raise ConfigError(
            [
                f"{k}: {cfg_file} says {_shown(now.get(k))}, but the run's checkpoints were made "
                f"with {_shown(then.get(k))}"
                for k in changed
            ]
            + [
                fix
                or f"a resume continues {run_dir} as its checkpoint left it: put those keys back "
                f"in {cfg_file}, or start a new run with `loomrl run {cfg_file}` (the earlier "
                "records are then set aside)"
            ]
        )


def _shown(value: Any) -> str:
    return "nothing" if value is None else repr(value)


def _make_output_dir(cfg: Any) -> Path:
    """``run.output_dir``, made if missing; a ConfigError naming it when it cannot be."""
    out = Path(cfg.run.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            [
                f"run.output_dir={str(out)!r}: cannot be used as the run directory "
                f"({e.strerror or e}); choose a directory that can be created and written"
            ]
        ) from None
    return out


def prepare_run_dir(cfg: Any, restart: bool = False) -> str | None:
    """Ready ``run.output_dir`` for a run: a new run sets an earlier run's records there aside
    (``runlog.set_aside_records``); a resumed one (``resume: true``) cuts the step records back
    to the checkpoint it resumes from. Returns why there is nothing to run (a resume of a run
    that already reached ``run.steps``, left untouched), else None.

    ``restart``: the automatic restart after a dead worker (``run_with_restarts``), for which a
    run that died before its first complete checkpoint begins again at step 0 (its rows all
    dropped) instead of being refused as a resume with nothing to resume from."""
    from loomrl.runlog import config_text, set_aside_records, trim_records

    out = _make_output_dir(cfg)
    _hold_run_dir(out, resume=getattr(cfg, "resume", False))
    if not getattr(cfg, "resume", False):
        reads = [x for x in (cfg.run.placement, cfg.run.profile) if x and Path(x).is_file()]
        # The config was read already (also when it is the run directory's config.yaml), so
        # one there that this run would write over can be moved.
        moved = set_aside_records(out, keep=reads, config=config_text(cfg))
        if moved is not None and [p.name for p in moved.iterdir()] == ["config.yaml"]:
            say(
                f"loomrl: {out / 'config.yaml'} is not this run's config, which the run writes "
                f"there: moved to {moved / 'config.yaml'}",
                sys.stderr,
            )
        elif moved is not None:
            say(
                f"loomrl: an earlier run's records in {out} moved to {moved} (move them back to "
                "continue that run instead)",
                sys.stderr,
            )
        return None
    from loomrl.checkpoint import latest_checkpoint, list_checkpoints

    path = latest_checkpoint(out)
    if path is None and restart:
        # Nothing saved yet: the attempt that died kept no step; its rows (step 0's opening
        # evaluation included, which the restart logs again) go with it.
        dropped = trim_records(out, -1)
        say(
            f"loomrl: no complete checkpoint in {out} yet: restarting at step 0"
            + ("; rows of the failed attempt dropped: " if dropped else "")
            + ", ".join(f"{n} of {k}" for k, n in dropped.items()),
            sys.stderr,
        )
        return None
    if path is None:
        raise ConfigError(
            [
                f"{out} has no complete checkpoint to resume from; start it over with "
                "`loomrl run` (its records are then set aside), or set run.checkpoint_every"
            ]
        )
    done = next(s for s, p in list_checkpoints(out) if p == path)
    if done >= cfg.run.steps:
        return (
            f"{out} is at step {done} of run.steps={cfg.run.steps}: nothing to resume "
            f"(pass run.steps=N with N > {done} to train on); the run directory is unchanged"
        )
    dropped = trim_records(out, done)
    if dropped:
        say(
            f"loomrl: resuming after step {done}; rows written after that checkpoint dropped: "
            + ", ".join(f"{n} of {k}" for k, n in dropped.items()),
            sys.stderr,
        )
    return None


def _resumable_at(args: argparse.Namespace, cfg: Any) -> None:
    """Where an interrupted run can be continued (main's Ctrl-C message), for recipes that
    resume."""
    if hasattr(cfg, "resume"):
        args.resume_dir, args.checkpoint_every = cfg.run.output_dir, cfg.run.checkpoint_every
        args.steps = cfg.run.steps


def _resume_hint(args: argparse.Namespace) -> str:
    """The Ctrl-C message's way on: resume from the last checkpoint, where there is one."""
    out = getattr(args, "resume_dir", None)
    if out is None:
        return ""
    from loomrl.checkpoint import list_checkpoints

    try:  # not verified (hashing a large checkpoint would hold the exit up); resume does
        saved = list_checkpoints(out)
    except Exception:
        return ""
    cut = _checkpoint_cut_short(args, saved[-1][0] if saved else 0)
    if saved:
        return f"; continue from step {saved[-1][0]} with `loomrl resume {out}`" + cut
    how = " (set run.checkpoint_every=N to save one every N steps)"
    return "; no checkpoint was saved, so this run cannot be resumed" + (
        cut or (how if not getattr(args, "checkpoint_every", 0) else "")
    )


def _checkpoint_cut_short(args: argparse.Namespace, last: int) -> str:
    """Said when the interrupt came while the checkpoint of the run's last step was written
    (a save of a large model takes many seconds; it is dropped whole, never left half)."""
    from loomrl.run import _number, _read_json

    summary = _read_json(Path(args.resume_dir) / "run_summary.json") or {}
    done = _number(summary.get("steps_done"))
    every = getattr(args, "checkpoint_every", 0) or 0
    if done is None or summary.get("status") != "interrupted":
        return ""
    done = int(done)
    due = done if done == getattr(args, "steps", None) else (done // every * every if every else 0)
    if due != done or due <= last:
        return ""
    return f" (the interrupt came while the checkpoint of step {due} was written: it was dropped)"


def cmd_run(args: argparse.Namespace) -> int:
    mod, cfg = load_recipe_config(args.config, args.overrides)
    _check_run_profile(cfg)
    _resumable_at(args, cfg)
    done = prepare_run_dir(cfg)
    if done:
        say(f"loomrl run: {done}")
        return 0
    _finished(cfg, run_with_restarts(mod, cfg))
    return 0


def _finished(cfg: Any, summary: dict) -> None:
    """What ``loomrl run`` and ``loomrl resume`` print of a run that finished."""
    say(f"run finished: {cfg.run.output_dir}/run_summary.json")
    _print_summary(summary)


def run_with_restarts(mod: Any, cfg: Any) -> dict:
    """Run a recipe; when a worker dies, restart from the last complete checkpoint
    (up to ``run.max_restarts`` times), recording each restart in ``restarts.jsonl``."""
    import json
    import time

    from loomrl.errors import WorkerDiedError

    restarts = 0
    while True:
        try:
            return mod.main(cfg)
        except WorkerDiedError as e:
            if restarts >= cfg.run.max_restarts:
                raise
            restarts += 1
            out = Path(cfg.run.output_dir)
            with open(out / "restarts.jsonl", "a") as f:
                f.write(
                    json.dumps({"time": time.time(), "restart": restarts, "error": str(e)[:2000]})
                    + "\n"
                )
            say(
                f"loomrl: {e.worker} rank {e.rank} died; restarting from the last checkpoint "
                f"({restarts}/{cfg.run.max_restarts})",
                sys.stderr,
            )
            if hasattr(cfg, "resume"):
                cfg = dataclasses.replace(cfg, resume=True)
                # rows written after the last checkpoint go (all of them if none was saved)
                prepare_run_dir(cfg, restart=True)


def _run_dir_config(run_dir: Path) -> Path:
    """The config.yaml of a run directory named on the command line."""
    if not run_dir.exists():
        raise ConfigError([f"{run_dir} does not exist; name the output_dir of a loomrl run"])
    if not run_dir.is_dir():
        raise ConfigError([f"{run_dir} is a file, not a run directory; name a run's output_dir"])
    cfg_file = run_dir / "config.yaml"
    if not cfg_file.exists():
        raise ConfigError([f"{run_dir} has no config.yaml: is it a loomrl run directory?"])
    return cfg_file


def cmd_resume(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    from loomrl.run import FIXED_ON_RESUME
    from loomrl.runlog import LOCK_FILE

    if run_dir.is_dir() and (run_dir / LOCK_FILE).exists():
        # Held before config.yaml is looked for: a new run starting in run_dir moves it aside.
        # (Without the lock file no run holds the directory; prepare_run_dir takes it then.)
        _hold_run_dir(run_dir, resume=True)
    cfg_file = _run_dir_config(run_dir)
    moved = [o for o in args.overrides if o.split("=", 1)[0] == "run.output_dir"]
    changed = [o for o in args.overrides if _fixed_on_resume(o)]
    # resume=false would make this a new run, which sets the records it should continue aside
    fresh = [o for o in args.overrides if o.split("=", 1)[0] == "resume"]
    if fresh:
        raise ConfigError(
            [
                f"{o}: `loomrl resume` continues {run_dir}, so resume is not an override it "
                f"takes; drop it (to start the run over instead: `loomrl run {cfg_file}`)"
                for o in fresh
            ]
        )
    if moved or changed:
        how = (
            "copy the run directory to continue elsewhere; start a new run (loomrl run) to "
            f"change {', '.join(FIXED_ON_RESUME)}"
        )
        raise ConfigError(
            [
                f"{o}: a resume continues {run_dir} as its checkpoint left it; {how}"
                for o in moved + changed
            ]
        )
    mod = _recipe_module(cfg_file, [])
    if not any(f.name == "resume" for f in dataclasses.fields(mod.Config)):
        name = mod.__name__.rsplit(".", 1)[-1]
        raise ConfigError(
            [
                f"{run_dir} is a run of {name}, which keeps no checkpoints and cannot be "
                f"resumed; start it again with `loomrl run {cfg_file}`"
            ]
        )
    overrides = [f"run.output_dir={run_dir}", "resume=true", *args.overrides]
    mod, cfg = load_recipe_config(cfg_file, overrides)
    _check_config_kept(run_dir, cfg, cfg_file)
    _check_run_profile(cfg)
    _resumable_at(args, cfg)
    done = prepare_run_dir(cfg)
    if done:
        say(f"loomrl resume: {done}")
        return 0
    _finished(cfg, run_with_restarts(mod, cfg))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write a run's trained policy (the actor) as a Hugging Face model directory."""
    if not args.out_dir.strip():
        # Path("") is ".": the model would go into the current folder, not where asked
        raise ConfigError(
            [f"out_dir {args.out_dir!r} is an empty path; name a new directory for the model"]
        )
    run_dir, out = Path(args.run_dir), Path(args.out_dir)
    cfg_file = _run_dir_config(run_dir)
    mod, cfg = load_recipe_config(cfg_file, [])
    if not hasattr(cfg, "model"):
        raise ConfigError(
            [
                f"recipe {cfg.recipe!r} trains no Hugging Face model: export takes runs of "
                "grpo, ppo or agentic_search"
            ]
        )
    # The checkpoint's weights fit the model they were trained from only: another model.path
    # in config.yaml (edited by hand) would fail inside torch with a shape mismatch.
    _check_config_kept(
        run_dir,
        cfg,
        cfg_file,
        keys=("model.path",),
        fix=f"export loads the checkpoint into the model config.yaml names: put model.path "
        f"back in {cfg_file}",
    )
    from loomrl.checkpoint import (
        follow_umask,
        latest_checkpoint,
        list_checkpoints,
        load_checkpoint,
    )

    if args.step is None:
        path = latest_checkpoint(run_dir)
    else:
        path = dict(list_checkpoints(run_dir)).get(args.step)
    if path is None:
        steps = [s for s, _ in list_checkpoints(run_dir)]
        raise ConfigError(
            [
                f"{run_dir} has no complete checkpoint"
                + (
                    f" at step {args.step} (steps saved: {steps}); pass one of those to --step, "
                    "or drop --step to export the last one"
                    if args.step is not None and steps
                    else " to export (none was saved, or none is intact): a run saves one every "
                    "run.checkpoint_every steps; `loomrl resume` with that set saves them"
                )
            ]
        )
    if out.exists() and not out.is_dir():
        raise ConfigError([f"out_dir {str(out)!r} is a file; name a new directory"])
    if out.exists() and any(out.iterdir()):
        raise ConfigError([f"out_dir {str(out)!r} exists and is not empty; name a new directory"])
    from loomrl.engines.hf import HFEngine
    from loomrl.workers.reasoning import engine_config

    # Written under a hidden name and moved into place once whole: an export cut short (Ctrl-C,
    # a full disk) leaves no out_dir that loads as a model. A new out_dir is staged beside it and
    # renamed; an empty folder the user made (".", or one in a folder they cannot write in) is
    # staged inside and kept, its files moved in.
    inside = out.is_dir()
    tmp = (
        out / f".export-{os.getpid()}"
        if inside
        else out.parent / f".{out.name}.export-{os.getpid()}"
    )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as e:
        raise ConfigError(
            [f"out_dir {str(out)!r} cannot be created ({e.strerror or e}); name a writable path"]
        ) from None
    try:
        state = load_checkpoint(path, weights_only=False)
        engine = HFEngine(engine_config(cfg.model, trainable=True, seed=cfg.run.seed))
        engine.load_state_dict(state["actor"])
        try:
            engine.save_pretrained(tmp)
            follow_umask(tmp)  # model.safetensors comes 0600, the rest 0666 less the umask
            if inside:
                for p in tmp.iterdir():
                    p.rename(out / p.name)
            else:
                tmp.rename(out)
        except OSError as e:
            raise ConfigError(
                [f"out_dir {str(out)!r}: writing the model failed ({e.strerror or e})"]
            ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"exported {path.name} of {run_dir} to {out} (load it as model.path={out})")
    return 0


def _refuse_profile_override(overrides: list[str]) -> None:
    """``loomrl profile CONFIG run.profile=FILE`` is refused: profiling reads no profile and
    writes its own to run.output_dir/profile.yaml, so FILE would be silently ignored (neither
    read nor written)."""
    from loomrl.config import parse_overrides

    parsed = parse_overrides(overrides)  # malformed ones: the ConfigError load_config gives
    run = parsed.get("run")
    value = parsed.get("run.profile", run.get("profile") if isinstance(run, dict) else None)
    if value is None:  # not given, or run.profile=null: nothing to ignore
        return
    use = (
        "run.profile=calibrate is for `loomrl run`, which takes the costs from its second "
        "iteration instead of profiling"
        if value == "calibrate"
        else "to plan from an existing profile instead, it is "
        f"`loomrl run CONFIG run.profile={value}` (or `loomrl plan {value}`)"
    )
    raise ConfigError(
        [
            f"run.profile={value}: `loomrl profile` neither reads nor writes run.profile; it "
            "measures the config's components and writes a new profile to "
            "run.output_dir/profile.yaml. To choose where, pass output_dir=DIR (the profile "
            f"goes to DIR/profile.yaml); {use}"
        ]
    )


def _check_run_profile(cfg: Any) -> None:
    """A run.profile file that is no usable workload profile (malformed, truncated, a plan or a
    config) is a ConfigError naming run.profile before Ray and the workers start, not after."""
    path = getattr(getattr(cfg, "run", None), "profile", None)
    if not isinstance(path, str) or path == "calibrate" or not Path(path).is_file():
        return  # none, calibrate, or missing (which the config's validation says)
    import warnings

    from loomrl.plan.profile import load_profile

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # said when the run plans from it
            load_profile(path)
    except ConfigError as e:
        shown = [" ".join(x.split()) for x in e.problems[:6]]
        more = f"; and {len(e.problems) - 6} more" if len(e.problems) > 6 else ""
        raise ConfigError(
            [
                f"run.profile={path}: not a usable workload profile: {'; '.join(shown)}{more}; "
                "fix the file (`loomrl plan FILE` checks it), or drop run.profile to measure "
                "the costs"
            ]
        ) from None


def _check_profile_micro_batch(cfg: Any) -> None:
    """run.micro_batch must divide the batch the profile is measured on (the recipes that
    profile time ``batch`` items): said before Ray starts, not as the fit's "granularities"
    problem after minutes of measuring."""
    m, batch = cfg.run.micro_batch, getattr(cfg, "batch", None)
    if m is None or not isinstance(batch, int) or batch < 1 or batch % m == 0:
        return
    from loomrl.plan.profile import divisors, nearest

    ok = divisors(batch)
    some = ok if len(ok) <= 8 else nearest(ok, m, 8)
    raise ConfigError(
        [
            f"run.micro_batch={m} does not divide batch={batch} (every micro-batch holds as "
            f"many items); set micro_batch to one of {some}, or null to let the planner choose"
        ]
    )


def cmd_profile(args: argparse.Namespace) -> int:
    """Profile the components of a config's workflow, print the fit and the plan it leads to."""
    from loomrl.run import PROFILE_FILE

    _refuse_profile_override(args.overrides)
    # The config's own run.profile (a file or calibrate, for `loomrl run`) is left out: the
    # profile measures anew, and a file it never reads must not stop it.
    overrides = [*args.overrides, "run.steps=1", "run.profile=null"]
    mod, cfg = load_recipe_config(args.config, overrides)
    if not hasattr(mod, "profile"):
        raise ConfigError(
            [
                f"recipe {cfg.recipe!r} has no profile entry point: its runs measure their own "
                f"costs; `loomrl run {args.config}` writes them to run.output_dir/profile.json, "
                "which loomrl plan and run.profile= take"
            ]
        )
    _check_profile_micro_batch(cfg)
    # Before Ray starts: a path that cannot be a directory, or a profile file that cannot be
    # written there, is a mistake to say now, not after minutes of measuring.
    target = _make_output_dir(cfg) / PROFILE_FILE
    if target.is_dir():
        raise ConfigError(
            [
                f"run.output_dir={cfg.run.output_dir}: {target} is a directory, and the profile "
                f"is written to run.output_dir/{PROFILE_FILE}; move that directory, or pass "
                "output_dir=DIR to profile into another one"
            ]
        )
    out = mod.profile(cfg)
    # The recipe's closing hint names the config as CONFIG (it is given a config, not its file)
    say(out.replace("loomrl run CONFIG ", f"loomrl run {shlex.quote(str(args.config))} "))
    return 0


def _print_summary(s: dict) -> None:
    keys = ("steps", "predicted_iteration_s", "measured_iteration_s", "param_sha256")
    since = s.get("measured_since_prediction_s")
    for k in keys:
        if k in s:
            say(f"  {k}: {s[k]}")
        if k == "measured_iteration_s" and since is not None and since != s.get(k):
            say(f"  measured_since_prediction_s: {since}")
    if s.get("plan"):
        say(f"  plan: {s['plan'].get('mode')} {s['plan'].get('assignment')}")
    for k, v in (s.get("metrics") or {}).items():
        say(f"  {k}: {v}")


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # stdout's reader left (`loomrl report DIR | head`): done, quietly, also at exit
        if not quiet_closed_stdout():
            raise  # another pipe (a socket, a user's): a real failure
        return 141


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "plan":
        from loomrl.plan.cli import plan_main

        return plan_main(argv[1:])
    if argv and argv[0] == "report":
        from loomrl.report import report_main

        return report_main(argv[1:])
    p = argparse.ArgumentParser(prog="loomrl", description="Flexible RL: one workflow, any plan.")
    p.add_argument("--version", action="version", version=f"loomrl {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    from loomrl.run import FIXED_ON_RESUME

    short = " ".join(f"{k}=" for k in _TOP_LEVEL_RUN_KEYS)
    overrides_help = (
        f"key=value overrides (YAML values), e.g. run.steps=5; run.* keys also as {short}"
    )
    r = sub.add_parser(
        "run",
        help="run a recipe config: loomrl run CONFIG [key=value ...]",
        description="Run a recipe config (its recipe: key picks the recipe) into run.output_dir: "
        "config.yaml, metrics.jsonl, TensorBoard events, plan.json, timeline.jsonl and "
        "run_summary.json (checkpoints/ and plots/ where the recipe keeps them). Ctrl-C or "
        "SIGTERM stops it (status 130 or 143) and names the command that resumes it.",
    )
    r.add_argument("config", metavar="CONFIG", help="a recipe config, e.g. examples/tiny_grpo.yaml")
    r.add_argument("overrides", nargs="*", default=[], metavar="key=value", help=overrides_help)
    r.set_defaults(fn=cmd_run)
    pr = sub.add_parser(
        "profile",
        help="profile a config's components and plan them",
        description="Profile a config's components on its own workers, write profile.yaml to "
        "run.output_dir (choose it with output_dir=DIR), print the best plan of each mode and "
        "the run.profile= command that plans from it. run.profile=FILE is refused here: it "
        "names a profile that `loomrl run` plans from, and profiling neither reads nor writes "
        "it (the config's own run.profile is left unused). Ctrl-C or SIGTERM stops it (status "
        "130 or 143).",
    )
    pr.add_argument(
        "config", metavar="CONFIG", help="a recipe config, e.g. examples/tiny_grpo.yaml"
    )
    pr.add_argument("overrides", nargs="*", default=[], metavar="key=value", help=overrides_help)
    pr.set_defaults(fn=cmd_profile)
    rs = sub.add_parser(
        "resume",
        help="continue a run from its last complete checkpoint",
        description="Continue the run in RUN_DIR from its last complete checkpoint, with its "
        "config.yaml; its step records are cut back to that checkpoint. A run that reached "
        "run.steps is left unchanged: pass run.steps=N to train on.",
    )
    rs.add_argument("run_dir", metavar="RUN_DIR", help="the output_dir of a `loomrl run`")
    rs.add_argument(
        "overrides",
        nargs="*",
        default=[],
        metavar="key=value",
        help=f"{overrides_help}; not run.output_dir, nor {', '.join(FIXED_ON_RESUME)}",
    )
    rs.set_defaults(fn=cmd_resume)
    ex = sub.add_parser(
        "export",
        help="write a run's trained model as a Hugging Face directory",
        description="Write a run's trained actor (its last complete checkpoint, or --step N) as "
        "a Hugging Face model directory, usable as model.path.",
    )
    ex.add_argument(
        "run_dir", metavar="RUN_DIR", help="the output_dir of a `loomrl run` that saved checkpoints"
    )
    ex.add_argument(
        "out_dir", metavar="OUT_DIR", help="a new (or empty) directory to write the model into"
    )
    ex.add_argument(
        "--step", type=int, default=None, metavar="N", help="a checkpoint's step (default: last)"
    )
    ex.set_defaults(fn=cmd_export)
    sub.add_parser("plan", help="plan a workload profile (loomrl plan PROFILE --devices N)")
    sub.add_parser("report", help="predicted vs measured timeline of a run (loomrl report RUN_DIR)")
    args = p.parse_args(argv)
    args.overrides = _normalise_overrides(getattr(args, "overrides", []) or [])
    from loomrl.run import put_back_sigterm, stop_on_sigterm, terminated

    before = stop_on_sigterm()  # also before Ray starts (the run sets it again after)
    try:
        return args.fn(args)
    except (ConfigError, PlanError, PlacementError, LoomError) as e:
        say(f"loomrl {args.cmd}: {brief(e)}", sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        # The run's finally blocks have stopped its workers; what was checkpointed stays.
        term = terminated(e)
        how = "terminated (SIGTERM)" if term else "interrupted"
        say(f"loomrl {args.cmd}: {how}{_resume_hint(args)}", sys.stderr)
        return 128 + (signal.SIGTERM if term else signal.SIGINT)
    finally:
        put_back_sigterm(before)


def brief(e: BaseException) -> str:
    """What the command line says of an error: a worker's failure with one of loomrl's own
    errors as its cause is said without the worker's traceback (kept in run_summary.json)."""
    from loomrl.errors import RemoteError

    if isinstance(e, RemoteError) and e.expected:
        return e.headline
    return str(e)


_TOP_LEVEL_RUN_KEYS = (
    "placement",
    "steps",
    "seed",
    "output_dir",
    "devices",
    "num_gpus",
    "micro_batch",
    "threads",
)


def _normalise_overrides(overrides: list[str]) -> list[str]:
    """Accept the short forms `placement=spatial steps=5 seed=1 output_dir=DIR` for run.* keys."""
    out = []
    for o in overrides:
        k = o.split("=", 1)[0]
        out.append(f"run.{o}" if k in _TOP_LEVEL_RUN_KEYS else o)
    return out


if __name__ == "__main__":
    sys.exit(main())
