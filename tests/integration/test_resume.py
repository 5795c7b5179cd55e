"""Checkpoint / resume: stopping after step k and resuming gives the uninterrupted run's parameters."""

from __future__ import annotations

import json

import pytest
from _tiny_grpo import COMMON as TINY
from _tiny_grpo import ROOT, STEPS, run_main, save_one_device_plan

_main = run_main
COMMON = ["placement=temporal", *TINY]  # the slow tests'
assert STEPS == 4  # the steps, checkpoints and kill steps below are those of a 4-step run


@pytest.fixture(scope="module")
def one_device_plan(tmp_path_factory):
    """The temporal plan with one device per component, as a plan file: the runs stopped and
    resumed here start three worker processes, not the temporal plan's five (seconds each on
    2 cores). Their parameters still equal the reference's: plans do not change them
    (test_placement_invariance)."""
    return save_one_device_plan(tmp_path_factory.mktemp("resume_plan") / "one_device.json")


@pytest.fixture(scope="module")
def common(one_device_plan):
    """The overrides of this file's default-suite runs: the reference's, on the one-device plan."""
    return [f"placement={one_device_plan}", *TINY]


@pytest.fixture(scope="module")
def straight(tiny_grpo_temporal):
    """An uninterrupted 4-step run: the reference the tests compare with (made once for the
    session: the placement-invariance test's temporal run)."""
    return tiny_grpo_temporal


def test_resume_is_bit_identical(cluster, straight, common, tmp_path):
    part = tmp_path / "part"
    _main(ROOT / "examples/tiny_grpo.yaml", [*common, "steps=2", f"output_dir={part}"])
    # Resume from the run directory's own config, as `loomrl resume DIR steps=4` does.
    _main(part / "config.yaml", [f"run.output_dir={part}", "resume=true", "steps=4"])
    a = json.loads((straight / "run_summary.json").read_text())
    b = json.loads((part / "run_summary.json").read_text())
    assert a["param_sha256"] == b["param_sha256"]
    steps = [json.loads(x)["step"] for x in (part / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 4 and 3 in steps
    assert steps == sorted(set(steps))  # each step once: no second row for the resumed step


def test_half_written_checkpoint_is_never_picked(tmp_path):
    from loomrl.checkpoint import latest_checkpoint, save_checkpoint

    save_checkpoint(tmp_path, 2, {"step": 2})
    good = latest_checkpoint(tmp_path)
    # A later step whose writer died before the manifest: a temp dir, and a dir with a bad file.
    (tmp_path / "checkpoints" / ".tmp-step-000004-999").mkdir()
    bad = save_checkpoint(tmp_path, 6, {"step": 6, "blob": list(range(10))})
    (bad / "meta.json").write_text("{}")
    assert latest_checkpoint(tmp_path) == good


def test_dead_worker_restarts_from_checkpoint(cluster, straight, common, tmp_path):
    """A rollout worker killed at step 3 ends in an automatic restart from the step-2 checkpoint
    and the same parameters as a run that never failed."""
    from loomrl.cli import _normalise_overrides, load_recipe_config, run_with_restarts

    common = [*common, "steps=4", "run.checkpoint_every=2"]
    clean = straight
    crashy = tmp_path / "crashy"
    # An earlier run in the same directory got further: a restart must not resume from it.
    from loomrl.checkpoint import list_checkpoints, save_checkpoint

    save_checkpoint(crashy, 10, {"step": 10, "note": "another run's"})
    mod, cfg = load_recipe_config(
        ROOT / "examples/tiny_grpo.yaml",
        _normalise_overrides(
            [*common, f"output_dir={crashy}", "run.max_restarts=1", "run.kill_worker_at_step=3"]
        ),
    )
    run_with_restarts(mod, cfg)
    restarts = (crashy / "restarts.jsonl").read_text().splitlines()
    assert len(restarts) == 1 and "died" in restarts[0]
    steps = [json.loads(x)["step"] for x in (crashy / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]  # rows after the step-2 checkpoint went with the restart
    timeline = [json.loads(x)["step"] for x in (crashy / "timeline.jsonl").read_text().splitlines()]
    assert timeline == [0, 1, 2, 3]
    a = json.loads((clean / "run_summary.json").read_text())
    b = json.loads((crashy / "run_summary.json").read_text())
    assert a["param_sha256"] == b["param_sha256"]
    # The summary keeps the failed attempt beside the one that finished.
    assert b["restarts"] == 1 and b["status"] == "finished" and b["steps_done"] == 4
    (first,) = b["attempts"]
    assert first["status"] == "failed" and first["steps_done"] == 3
    assert "died" in first["error"]
    assert b["wall_s_total"] == pytest.approx(b["wall_s"] + first["wall_s"])
    assert a["attempts"] == [] and a["wall_s_total"] == a["wall_s"]
    # The restarted attempt ran with resume=true; the saved config still starts a run afresh.
    assert "resume: false" in (crashy / "config.yaml").read_text()
    (aside,) = crashy.glob("checkpoints-before-*")  # kept whole, beside this run's own
    assert [s for s, _ in list_checkpoints(crashy)] == [2, 4]
    assert (aside / "step-000010").is_dir()


def test_a_worker_dead_before_the_first_checkpoint_restarts_at_step_0(
    cluster, straight, common, tmp_path
):
    """A rollout worker killed at step 1, before the step-2 checkpoint: the restart begins again
    at step 0 (not refused as a resume with nothing to resume from) and ends with the
    uninterrupted run's parameters."""
    from loomrl.cli import _normalise_overrides, load_recipe_config, run_with_restarts

    out = tmp_path / "early"
    over = [*common, "steps=4", "run.checkpoint_every=2", f"output_dir={out}"]
    mod, cfg = load_recipe_config(
        ROOT / "examples/tiny_grpo.yaml",
        _normalise_overrides([*over, "run.max_restarts=1", "run.kill_worker_at_step=1"]),
    )
    run_with_restarts(mod, cfg)
    a = json.loads((straight / "run_summary.json").read_text())
    b = json.loads((out / "run_summary.json").read_text())
    assert b["restarts"] == 1 and b["status"] == "finished"
    assert a["param_sha256"] == b["param_sha256"]
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]  # the failed attempt's rows went: each step once


_RUN_CLI = "import sys; from loomrl.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.slow  # about 40 s on 2 cores: a second driver and a resume (the logic: test_run_attempts)
def test_an_attempt_killed_outright_is_listed_when_the_run_resumes(cluster, tmp_path):
    """A run's driver killed by SIGKILL writes no summary; its ``.attempt.json`` remains, and the
    resumed run's summary lists that attempt as killed, with the steps it had completed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import ray

    out = tmp_path / "killed"
    env = {
        **os.environ,
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,  # this session's Ray: no new one
        "RAY_AUTH_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    argv = ["run", str(ROOT / "examples/tiny_grpo.yaml"), *COMMON, "steps=200"]
    argv += ["run.checkpoint_every=1", f"output_dir={out}"]
    err_file = tmp_path / "stderr.txt"  # a file: a pipe nobody reads could fill and block it
    with open(err_file, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _RUN_CLI, *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    mark_file = out / ".attempt.json"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, err_file.read_text()[-2000:]
            assert time.monotonic() < deadline, "the run did not complete two steps in 180 s"
            try:
                if json.loads(mark_file.read_text())["steps_done"] >= 2:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (out / "run_summary.json").exists()
    mark = json.loads(mark_file.read_text())
    from loomrl.checkpoint import list_checkpoints

    done = max(s for s, _ in list_checkpoints(out))
    _main(out / "config.yaml", [f"run.output_dir={out}", "resume=true", f"steps={done + 1}"])
    s = json.loads((out / "run_summary.json").read_text())
    (killed,) = s["attempts"]
    assert killed["status"] == "killed" and "SIGKILL" in killed["error"]
    assert killed["steps_done"] == mark["steps_done"] >= 2
    assert (
        killed["wall_s"] == pytest.approx(mark["updated"] - mark["started"])
        and killed["wall_s"] > 0
    )
    assert s["status"] == "finished" and s["steps_done"] == done + 1
    assert s["wall_s_total"] == pytest.approx(s["wall_s"] + killed["wall_s"])
    assert not mark_file.exists()  # a summary written: no attempt left unfinished


@pytest.mark.slow  # about a minute on 2 cores: a run that adapts, loses a worker and restarts
def test_a_restart_after_adapting_starts_on_the_adapted_plan(cluster, tmp_path):
    """The profile says the actor costs 100x what it does: the run adapts at step 2, its worker
    dies at step 5, and the restart from the step-4 checkpoint starts on the adapted plan and
    prediction, not on the profile's, which would miss by as much as before."""
    from loomrl.adapt import refresh_profile
    from loomrl.cli import _normalise_overrides, load_recipe_config, run_with_restarts
    from loomrl.plan import load_profile

    stale = refresh_profile(load_profile(ROOT / "examples/profiles/tiny_grpo.yaml"), {"actor": 100})
    prof = tmp_path / "stale.json"
    prof.write_text(json.dumps(stale.to_dict()))
    out = tmp_path / "run"
    over = [
        "seed=1",
        "steps=6",
        f"output_dir={out}",
        f"run.profile={prof}",
        "run.adapt=true",
        "run.adapt_window=2",
        "run.checkpoint_every=2",
        "run.max_restarts=1",
        "run.kill_worker_at_step=5",
    ]
    mod, cfg = load_recipe_config(ROOT / "examples/tiny_grpo.yaml", _normalise_overrides(over))
    s = run_with_restarts(mod, cfg)
    rows = [json.loads(x) for x in (out / "adapt.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 2 and rows[0]["attempt"] == 0
    adapted = json.loads((out / "adapted.json").read_text())
    assert adapted["attempt"] == 0 and s["restarts"] == 1
    assert s["adapt_start"]["start"] == "adapted"
    assert s["adapt_start"]["adapted_step"] == adapted["step"]
    timeline = [json.loads(x) for x in (out / "timeline.jsonl").read_text().splitlines()]
    restart = next(r for r in timeline if r["step"] == 4)  # the restart's first iteration
    assert restart["predicted_s"] == pytest.approx(adapted["plan"]["predicted_s"])
    assert adapted["plan"]["predicted_s"] < timeline[0]["predicted_s"] / 10  # the stale one
