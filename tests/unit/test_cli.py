"""The `loomrl` command's handling of user mistakes and of a used run directory (no Ray)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from loomrl.cli import _normalise_overrides, load_recipe_config, main, prepare_run_dir

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny_grpo.yaml"


def _cfg(tmp_path: Path, *extra: str):
    return load_recipe_config(
        TINY, _normalise_overrides([f"output_dir={tmp_path}", "steps=4", *extra])
    )[1]


@pytest.mark.parametrize(
    "text, message",
    [
        ("recipe: grpo\nrun: [1,\n", "not valid YAML"),
        ("- 1\n- 2\n", "expected a mapping of keys"),
        ("", "the file is empty (no keys) — a config names the recipe it runs, recipe: NAME"),
        ("# notes only\n", "the file is empty (no keys)"),
        ("batch: 4\n", "recipe: missing — a config names the recipe it runs"),
        (
            "recipe: [grpo]\n",
            "recipe: ['grpo'] is not a recipe (a recipe is named by one word: recipe: NAME)",
        ),
        ("recipe: {a: 1}\n", "recipe: {'a': 1} is not a recipe (a recipe is named by one"),
        ("recipe: grpx\n", "recipe: 'grpx' is not a recipe; choose one of"),
    ],
)
def test_config_mistakes_exit_2_with_a_message(tmp_path, capsys, text, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    assert main(["run", str(bad)]) == 2
    assert message in capsys.readouterr().err
    assert main(["profile", str(bad)]) == 2
    assert message in capsys.readouterr().err


def test_a_typo_of_a_short_override_suggests_it(capsys):
    assert main(["run", str(TINY), "stpes=2", "otput_dir=x"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'stpes' — did you mean 'steps' (short for 'run.steps')?" in err
    assert (
        "unknown key 'otput_dir' — did you mean 'output_dir' (short for 'run.output_dir')?" in err
    )


def test_a_short_key_written_in_a_file_says_where_it_goes_and_the_api_takes_short_overrides(
    tmp_path, capsys
):
    bad = tmp_path / "short.yaml"
    bad.write_text("recipe: demo\nsteps: 2\n")
    assert main(["run", str(bad)]) == 2
    assert (
        "unknown key 'steps' — 'steps' is short for 'run.steps' in a command-line override "
        "only; in a file write it under run: (run: {steps: ...})"
    ) in capsys.readouterr().err
    _, cfg = load_recipe_config(ROOT / "examples" / "demo_matmul.yaml", ["steps=2"])
    assert cfg.run.steps == 2


def test_a_directory_as_config_or_output_dir_exits_2(tmp_path, capsys):
    assert main(["run", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["run", str(TINY), f"output_dir={afile}"]) == 2
    assert "cannot be used as the run directory" in capsys.readouterr().err


def test_settings_that_would_lose_the_model_or_mean_every_step_are_refused(capsys):
    assert (
        main(
            [
                "run",
                str(TINY),
                "run.keep_checkpoints=0",
                "run.checkpoint_every=-1",
                "eval_every=-1",
                "threads=0",
                "run.iteration_timeout_s=-5",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    for key in ("keep_checkpoints", "checkpoint_every", "eval_every", "threads"):
        assert f"{key}: must be >=" in err, key
    assert "iteration_timeout_s=-5: use seconds > 0, 'auto'" in err
    assert main(["run", str(TINY), "run.iteration_timeout_s=never"]) == 2
    assert "iteration_timeout_s='never': use seconds > 0" in capsys.readouterr().err


def test_a_new_run_sets_the_earlier_runs_records_aside(tmp_path):
    from loomrl.checkpoint import save_checkpoint

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    save_checkpoint(tmp_path, 2, {"step": 2})
    assert prepare_run_dir(_cfg(tmp_path)) is None
    (aside,) = tmp_path.glob("before-*")
    assert (aside / "metrics.jsonl").is_file() and (aside / "checkpoints").is_dir()
    assert not (tmp_path / "metrics.jsonl").exists()


def test_resume_cuts_records_back_and_a_finished_run_is_left_alone(tmp_path, capsys):
    from loomrl.checkpoint import save_checkpoint

    metrics = "".join(json.dumps({"step": s}) + "\n" for s in range(5))
    (tmp_path / "metrics.jsonl").write_text(metrics)
    save_checkpoint(tmp_path, 2, {"step": 2})
    assert prepare_run_dir(_cfg(tmp_path, "resume=true")) is None
    assert [
        json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ] == [
        0,
        1,
        2,
    ]
    assert "resuming after step 2" in capsys.readouterr().err
    save_checkpoint(tmp_path, 4, {"step": 4})
    (tmp_path / "metrics.jsonl").write_text(metrics)
    why = prepare_run_dir(_cfg(tmp_path, "resume=true"))
    assert why is not None and "at step 4 of run.steps=4: nothing to resume" in why
    assert (tmp_path / "metrics.jsonl").read_text() == metrics  # untouched
    (tmp_path / "config.yaml").write_text(TINY.read_text())
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["resume", str(tmp_path), "run.steps=4"]) == 0
    assert "nothing to resume" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_resumed_run_that_finishes_says_where_its_summary_is_as_a_run_does(
    monkeypatch, tmp_path, capsys
):
    import loomrl.cli as cli
    from loomrl.checkpoint import save_checkpoint

    monkeypatch.setattr(cli, "run_with_restarts", lambda mod, cfg: {"steps": cfg.run.steps})
    (tmp_path / "config.yaml").write_text(TINY.read_text())
    save_checkpoint(tmp_path, 2, {"step": 2})
    assert main(["resume", str(tmp_path), "steps=4"]) == 0
    out = capsys.readouterr().out
    assert f"run finished: {tmp_path}/run_summary.json\n  steps: 4\n" in out


def test_resume_refuses_resume_false_which_would_set_the_run_aside(tmp_path, capsys):
    from loomrl.checkpoint import save_checkpoint

    (tmp_path / "config.yaml").write_text(TINY.read_text())
    save_checkpoint(tmp_path, 2, {"step": 2})
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["resume", str(tmp_path), "resume=false", "steps=4"]) == 2
    err = capsys.readouterr().err
    assert "resume=false: `loomrl resume` continues" in err and "drop it" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_export_to_a_file_exits_2(tmp_path, capsys):
    from loomrl.checkpoint import save_checkpoint

    (tmp_path / "config.yaml").write_text(TINY.read_text())
    save_checkpoint(tmp_path, 1, {"step": 1})
    afile = tmp_path / "out"
    afile.write_text("x")
    assert main(["export", str(tmp_path), str(afile)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(["export", str(tmp_path), ""]) == 2  # not "." (the current folder)
    assert "out_dir '' is an empty path; name a new directory" in capsys.readouterr().err


def test_export_refuses_a_config_yaml_naming_another_model_and_says_which_steps_exist(
    tmp_path, capsys
):
    from loomrl.checkpoint import save_checkpoint

    (tmp_path / "config.yaml").write_text(TINY.read_text())
    assert main(["export", str(tmp_path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "has no complete checkpoint to export (none was saved, or none is intact)" in err
    assert "run.checkpoint_every" in err

    save_checkpoint(tmp_path, 1, {"step": 1})
    assert main(["export", str(tmp_path), str(tmp_path / "out"), "--step", "3"]) == 2
    err = capsys.readouterr().err
    assert "at step 3 (steps saved: [1]); pass one of those to --step" in err

    # config.yaml edited by hand to another model: the weights would not fit it
    summary = {"status": "finished", "fixed_on_resume": {"model.path": "tiny-llama"}}
    (tmp_path / "run_summary.json").write_text(json.dumps(summary))
    edited = TINY.read_text().replace("path: tiny-llama", "path: tiny-qwen2")
    (tmp_path / "config.yaml").write_text(edited)
    assert main(["export", str(tmp_path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "model.path: " in err and "says 'tiny-qwen2', but the run's checkpoints" in err
    assert "put model.path back in" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_an_interrupt_exits_130_with_how_to_resume(monkeypatch, capsys, tmp_path):
    import loomrl.cli as cli
    from loomrl.checkpoint import save_checkpoint

    def interrupted(mod, cfg, checkpoint_at=None):
        if checkpoint_at is not None:
            save_checkpoint(cfg.run.output_dir, checkpoint_at, {"step": checkpoint_at})
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_with_restarts", interrupted)
    assert main(["run", str(TINY), f"output_dir={tmp_path}"]) == 130
    err = capsys.readouterr().err  # no checkpoint yet: a resume would fail, so none is offered
    assert "no checkpoint was saved, so this run cannot be resumed" in err
    assert "run.checkpoint_every=N" in err and "loomrl resume" not in err
    monkeypatch.setattr(cli, "run_with_restarts", lambda m, c: interrupted(m, c, 3))
    assert main(["run", str(TINY), f"output_dir={tmp_path}"]) == 130
    assert f"continue from step 3 with `loomrl resume {tmp_path}`" in capsys.readouterr().err
    demo = ROOT / "examples" / "demo_matmul.yaml"  # a recipe that does not resume: no hint
    assert main(["run", str(demo), f"output_dir={tmp_path / 'demo'}"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "resume" not in err


def test_an_interrupt_while_a_checkpoint_is_written_says_that_one_was_dropped(
    monkeypatch, capsys, tmp_path
):
    import loomrl.cli as cli
    from loomrl.checkpoint import save_checkpoint

    def interrupted_after(done, saved=()):
        def run(mod, cfg):
            for step in saved:
                save_checkpoint(cfg.run.output_dir, step, {"step": step})
            summary = {"status": "interrupted", "steps_done": done}
            (Path(cfg.run.output_dir) / "run_summary.json").write_text(json.dumps(summary))
            raise KeyboardInterrupt

        return run

    args = ["run", str(TINY), f"output_dir={tmp_path}", "run.checkpoint_every=2", "steps=5"]
    monkeypatch.setattr(cli, "run_with_restarts", interrupted_after(2))
    assert main(args) == 130
    err = capsys.readouterr().err
    assert (
        "no checkpoint was saved, so this run cannot be resumed (the interrupt came while " in err
    )
    assert "the checkpoint of step 2 was written: it was dropped)" in err
    monkeypatch.setattr(cli, "run_with_restarts", interrupted_after(4, saved=[2]))
    assert main(args) == 130
    err = capsys.readouterr().err
    assert f"continue from step 2 with `loomrl resume {tmp_path}` (the interrupt came" in err
    assert "checkpoint of step 4 was written" in err
    for done, saved in ((3, [2]), (5 - 1, [2, 4])):  # mid-iteration: nothing was being written
        monkeypatch.setattr(cli, "run_with_restarts", interrupted_after(done, saved))
        assert main(args) == 130
        assert "dropped" not in capsys.readouterr().err
    monkeypatch.setattr(cli, "run_with_restarts", interrupted_after(5, [4]))  # the last save
    assert main(args) == 130
    assert "checkpoint of step 5 was written" in capsys.readouterr().err


def test_a_new_run_keeps_in_place_the_plan_file_it_reads(tmp_path):
    from loomrl.plan import load_profile, search

    plan = search(load_profile(ROOT / "examples/profiles/tiny_grpo.yaml"), mode="temporal")
    plan.save(tmp_path / "plan.json")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert prepare_run_dir(_cfg(tmp_path, f"placement={tmp_path / 'plan.json'}")) is None
    (aside,) = tmp_path.glob("before-*")
    assert (tmp_path / "plan.json").is_file() and (aside / "plan.json").is_file()
    assert not (tmp_path / "metrics.jsonl").exists() and (aside / "metrics.jsonl").is_file()


def test_a_run_directory_in_use_by_another_run_is_refused(tmp_path):
    import fcntl

    from loomrl.errors import ConfigError
    from loomrl.runlog import LOCK_FILE

    with open(tmp_path / LOCK_FILE, "a+") as other:  # another process's hold, as it looks here
        other.write("pid 12345\n")
        other.flush()
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match=r"is in use by a running loomrl run \(pid 12345\)"):
            prepare_run_dir(_cfg(tmp_path))
    assert prepare_run_dir(_cfg(tmp_path)) is None  # free again once the holder is gone


def test_resume_refuses_what_would_not_continue_the_run(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text(TINY.read_text())
    assert main(["resume", str(tmp_path)]) == 2  # no checkpoint: nothing to continue
    assert "no complete checkpoint to resume from" in capsys.readouterr().err
    for override in (
        f"run.output_dir={tmp_path / 'elsewhere'}",
        "model.path=tiny-qwen2",
        "batch=8",
        "task.level=2",  # any key of the task: its problems are what the run trained on
        "task.options={eval_fraction: 0.2}",
    ):
        assert main(["resume", str(tmp_path), override]) == 2
        err = capsys.readouterr().err
        assert f"{override}: a resume continues" in err, err
        assert "(1 problem(s))" in err  # the way out is said in the problem, not counted apart
    assert (tmp_path / "config.yaml").read_text() == TINY.read_text()  # nothing written


def test_export_to_a_path_that_cannot_be_created_exits_2(tmp_path, capsys):
    from loomrl.checkpoint import save_checkpoint

    (tmp_path / "config.yaml").write_text(TINY.read_text())
    save_checkpoint(tmp_path, 1, {"step": 1})
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["export", str(tmp_path), str(afile / "sub")]) == 2
    assert "cannot be created" in capsys.readouterr().err


def test_a_ctrl_c_while_workers_stop_is_told_and_the_next_one_leaves(capsys):
    import os
    import signal

    from loomrl.run import _patient_interrupts

    before = signal.getsignal(signal.SIGINT)
    (restore,) = _patient_interrupts()
    try:
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C of a run: a notice only
        assert "stopping the workers; Ctrl-C again to leave now" in capsys.readouterr().err
        with pytest.raises(KeyboardInterrupt):  # the third: out
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, restore)
    assert restore is before


def test_a_sigterm_exits_143_with_how_to_resume_and_its_handler_goes(monkeypatch, capsys, tmp_path):
    import os
    import signal

    import loomrl.cli as cli
    from loomrl.checkpoint import save_checkpoint

    def terminated(mod, cfg):
        save_checkpoint(cfg.run.output_dir, 2, {"step": 2})
        os.kill(os.getpid(), signal.SIGTERM)  # `kill PID`, or a scheduler's time limit
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(cli, "run_with_restarts", terminated)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["run", str(TINY), f"output_dir={tmp_path}"]) == 143
    err = capsys.readouterr().err
    assert (
        f"loomrl run: terminated (SIGTERM); continue from step 2 with `loomrl resume {tmp_path}`"
        in err
    )
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_sigterm_raises_once_and_a_second_one_while_workers_stop_is_told(capsys):
    import os
    import signal

    from loomrl.run import Terminated, stop_on_sigterm

    before = stop_on_sigterm()
    try:
        with pytest.raises(Terminated, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # the workers are stopping: a notice only
        assert "stopping the workers after SIGTERM; SIGKILL leaves now" in capsys.readouterr().err
    finally:
        signal.signal(signal.SIGTERM, before)
    assert issubclass(Terminated, KeyboardInterrupt)  # every Ctrl-C path stops the run for it


def _left_pipe():
    """A stream into a pipe whose reader has left (`loomrl run ... | head`, head done)."""
    import os

    r, w = os.pipe()
    os.close(r)
    return open(w, "w")  # noqa: SIM115 - the test closes it


def test_a_run_whose_output_reader_left_goes_on_and_exits_0(monkeypatch, tmp_path):
    import loomrl.cli as cli
    from loomrl.runlog import RunLogger

    def trains(mod, cfg):  # says something on the way, as a run does, then finishes
        logger = RunLogger(cfg.run.output_dir, use_tensorboard=False, progress=False)
        logger.echo("plan (1.0s):")
        logger.log(1, {"reward_mean": 0.5})
        logger.close()
        return {"status": "finished", "steps": 1, "metrics": {"reward_mean": 0.5}}

    monkeypatch.setattr(cli, "run_with_restarts", trains)
    with _left_pipe() as out, _left_pipe() as err:
        monkeypatch.setattr(sys, "stdout", out)
        monkeypatch.setattr(sys, "stderr", err)
        assert main(["run", str(TINY), f"output_dir={tmp_path}"]) == 0
        print("later lines go nowhere, without an error", file=out, flush=True)
        print("on both streams", file=err, flush=True)
    assert (tmp_path / "metrics.jsonl").read_text().count("reward_mean") == 1


def test_output_into_a_pipe_its_reader_left_ends_quietly_with_141():
    """`loomrl plan ... --json | head -1`: the reader leaves after one line, the rest of the
    output cannot be written; the command exits 141 without a traceback."""
    import subprocess

    code = "from loomrl.cli import main; raise SystemExit(main())"
    profile = str(ROOT / "examples/profiles/tiny_grpo.yaml")
    cmd = [sys.executable, "-c", code, "plan", profile, "--devices", "4096", "--json"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline().startswith(b"{")  # 250 kB follow: more than a pipe holds
    p.stdout.close()
    err = p.stderr.read()
    p.stderr.close()
    assert p.wait(timeout=60) == 141
    assert err == b""


def test_a_sigterm_that_a_ray_wait_raised_as_a_plain_interrupt_still_exits_143(
    monkeypatch, capsys, tmp_path
):
    import os
    import signal

    import loomrl.cli as cli
    from loomrl.run import Terminated

    def blocked_in_ray(mod, cfg):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except Terminated:
            # ray.get / ray.wait raise a plain KeyboardInterrupt for what the handler raised
            raise KeyboardInterrupt from None
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(cli, "run_with_restarts", blocked_in_ray)
    assert main(["run", str(TINY), f"output_dir={tmp_path}"]) == 143
    assert "loomrl run: terminated (SIGTERM)" in capsys.readouterr().err
    # The next command in this process starts afresh: a Ctrl-C is a Ctrl-C.
    monkeypatch.setattr(
        cli, "run_with_restarts", lambda m, c: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    assert main(["run", str(TINY), f"output_dir={tmp_path / 'b'}"]) == 130


def test_a_sigterm_while_profiling_exits_143_and_leaves_no_profile(monkeypatch, capsys, tmp_path):
    import os
    import signal

    import loomrl.cluster
    import loomrl.profiler

    stopped = []

    class Started:
        num_devices = 2

        def shutdown(self):
            stopped.append(True)

    def ray_handler(signum, frame):  # what ray.init installs: a stack dump, then an exit
        raise SystemExit(signum)

    def start(**kwargs):
        signal.signal(signal.SIGTERM, ray_handler)
        return Started()

    def profiling(flow, sample, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the profile")

    monkeypatch.setattr(loomrl.cluster.Cluster, "start", staticmethod(start))
    monkeypatch.setattr(loomrl.profiler, "profile_flow", profiling)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["profile", str(TINY), f"output_dir={tmp_path}"]) == 143
    assert "loomrl profile: terminated (SIGTERM)" in capsys.readouterr().err
    assert stopped and list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_export_follows_the_umask_and_one_cut_short_leaves_no_model_dir(
    tmp_path, capsys, monkeypatch
):
    import errno
    import os
    import shutil
    import stat

    from loomrl.checkpoint import save_checkpoint
    from loomrl.engines.hf import HFEngine
    from loomrl.workers.reasoning import engine_config

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(TINY, run / "config.yaml")
    cfg = _cfg(run)
    actor = HFEngine(engine_config(cfg.model, trainable=True, seed=0)).state_dict()
    save_checkpoint(run, 1, {"actor": actor})
    before = os.umask(0o022)
    try:
        assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    finally:
        os.umask(before)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "hf").iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes

    def full(self, directory):  # the disk fills half-way through
        (directory / "model.safetensors").write_bytes(b"cut short")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(HFEngine, "save_pretrained", full)
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "cut")]) == 2
    assert "writing the model failed (No space left on device)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run"]  # no cut nor temp dir


def test_an_export_into_an_empty_out_dir_whose_folder_is_not_writable_fills_it(
    tmp_path, capsys, monkeypatch
):
    """An empty out_dir made for the export (in a folder only an admin writes in) takes the
    model, where no hidden copy can be staged beside it."""
    import errno
    import shutil
    from pathlib import Path

    from loomrl.checkpoint import save_checkpoint
    from loomrl.engines.hf import HFEngine
    from loomrl.workers.reasoning import engine_config

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(TINY, run / "config.yaml")
    actor = HFEngine(engine_config(_cfg(run).model, trainable=True, seed=0)).state_dict()
    save_checkpoint(run, 1, {"actor": actor})
    out = tmp_path / "shared" / "hf"
    out.mkdir(parents=True)
    mkdir = Path.mkdir

    def no_write_beside(self, *args, **kwargs):  # root passes permission bits: refuse by hand
        if self.parent == out.parent and self != out:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", no_write_beside)
    assert main(["export", str(run), str(out)]) == 0, capsys.readouterr().err
    names = sorted(p.name for p in out.iterdir())
    assert "model.safetensors" in names and "config.json" in names
    assert not [n for n in names if n.startswith(".")]  # no staging folder left
    assert sorted(p.name for p in out.parent.iterdir()) == ["hf"]
    # A missing out_dir there is still refused, naming it.
    assert main(["export", str(run), str(out.parent / "new")]) == 2
    assert "cannot be created (Permission denied)" in capsys.readouterr().err
    # "." names an empty folder too: the one the user stands in, kept and filled.
    monkeypatch.undo()
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["export", str(run), "."]) == 0, capsys.readouterr().err
    assert (here / "model.safetensors").is_file()
    assert not [p.name for p in here.iterdir() if p.name.startswith(".")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here", "run", "shared"]


def test_profile_into_an_output_dir_that_cannot_be_one_exits_2_before_ray(
    tmp_path, capsys, monkeypatch
):
    import loomrl.cluster

    def start(**kwargs):
        raise AssertionError("Ray started before the output_dir was checked")

    monkeypatch.setattr(loomrl.cluster.Cluster, "start", staticmethod(start))
    (tmp_path / "f").write_text("x")
    assert main(["profile", str(TINY), f"output_dir={tmp_path / 'f'}"]) == 2
    err = capsys.readouterr().err
    assert f"run.output_dir={str(tmp_path / 'f')!r}: cannot be used as the run directory" in err
    assert "Traceback" not in err


def test_profile_into_an_output_dir_whose_profile_yaml_is_a_directory_exits_2_before_ray(
    tmp_path, capsys, monkeypatch
):
    import loomrl.cluster

    def start(**kwargs):
        raise AssertionError("Ray started before profile.yaml was checked")

    monkeypatch.setattr(loomrl.cluster.Cluster, "start", staticmethod(start))
    (tmp_path / "profile.yaml").mkdir()
    (tmp_path / "profile.yaml" / "notes.txt").write_text("mine")
    assert main(["profile", str(TINY), f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'profile.yaml'} is a directory, and the profile is written to" in err
    assert "pass output_dir=DIR" in err and "Traceback" not in err
    assert (tmp_path / "profile.yaml" / "notes.txt").read_text() == "mine"


def test_profile_of_a_recipe_without_one_says_where_its_runs_write_their_profile(capsys):
    config = ROOT / "examples/ppo_inverted_pendulum.yaml"
    assert main(["profile", str(config)]) == 2
    err = capsys.readouterr().err
    assert (
        f"recipe 'embodied_ppo' has no profile entry point: its runs measure their own costs; "
        f"`loomrl run {config}` writes them to run.output_dir/profile.json" in err
    )
    assert "Traceback" not in err


def test_resume_refuses_a_config_yaml_changed_in_what_the_checkpoints_depend_on(
    tmp_path, capsys, monkeypatch
):
    """config.yaml edited by hand, or replaced by another recipe's, after the run: its
    checkpoint would be loaded into another recipe (a KeyError traceback) or continue on other
    prompts."""
    import shutil
    import signal

    import loomrl.cli as cli
    import loomrl.cluster
    from loomrl.checkpoint import save_checkpoint
    from loomrl.run import Run

    class Started:
        def shutdown(self):
            pass

    monkeypatch.setattr(loomrl.cluster.Cluster, "start", staticmethod(lambda **kw: Started()))
    monkeypatch.setattr(cli, "run_with_restarts", lambda mod, cfg: {"resumed": True})
    before = signal.getsignal(signal.SIGTERM)
    cfg = _cfg(tmp_path)
    run = Run(cfg, cfg.run)  # writes config.yaml; killed after its checkpoint of step 1
    save_checkpoint(tmp_path, 1, {"step": 1})
    kept = (tmp_path / "config.yaml").read_text()
    assert main(["resume", str(tmp_path)]) == 0  # unchanged: resumes

    shutil.copy(ROOT / "examples" / "tiny_ppo.yaml", tmp_path / "config.yaml")
    assert main(["resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        "recipe: " in err and "says 'ppo', but the run's checkpoints were made with 'grpo'" in err
    )
    assert "put those keys back" in err and "Traceback" not in err

    (tmp_path / "config.yaml").write_text(kept.replace("batch: 4", "batch: 8"))
    assert main(["resume", str(tmp_path)]) == 2
    assert "batch: " in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text(kept.replace("lr: 0.001", "lr: 0.0005", 1))
    assert main(["resume", str(tmp_path)]) == 0  # the learning rate may change
    # The finished summary records it as the attempt's marker did.
    run.summary(1, None, {})
    (tmp_path / "config.yaml").write_text(kept.replace("batch: 4", "batch: 8"))
    assert main(["resume", str(tmp_path), "steps=5"]) == 2
    run.close()
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_last_recipe_override_picks_the_recipe_as_the_last_of_any_key_wins(tmp_path):
    mod, cfg = load_recipe_config(
        TINY, _normalise_overrides([f"output_dir={tmp_path}", "recipe=demo", "recipe=grpo"])
    )
    assert (mod.__name__, cfg.recipe) == ("loomrl.recipes.reasoning_grpo", "grpo")
