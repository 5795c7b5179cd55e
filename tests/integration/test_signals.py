"""SIGTERM (`kill`, a scheduler's time limit) stops a run as Ctrl-C does: workers stopped, a
summary saying how it ended, the command that resumes it, exit status 143."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
_RUN_CLI = "import sys; from loomrl.cli import main; sys.exit(main(sys.argv[1:]))"


def _sigterm_once(argv: list[str], tmp_path: Path, ready: Any, within_s: float) -> tuple[int, str]:
    """Run ``loomrl ARGV`` on this session's Ray, send it SIGTERM once ``ready(stderr)`` holds
    (within ``within_s``), and return its exit status and stderr."""
    import ray

    env = {
        **os.environ,
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,  # this session's Ray: no new one
        "RAY_AUTH_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    err_file = tmp_path / "stderr.txt"  # a file: a pipe nobody reads could fill and block it
    with open(err_file, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _RUN_CLI, *argv], env=env, stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        deadline = time.monotonic() + within_s
        while not ready(err_file.read_text()):
            assert proc.poll() is None, err_file.read_text()[-2000:]
            assert time.monotonic() < deadline, f"not ready for SIGTERM in {within_s} s"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return code, err_file.read_text()


@dataclasses.dataclass
class Cfg:
    run: Any
    resume: bool = False


@pytest.mark.slow  # about 45 s on 2 cores (the logic: test_cli and test_run_attempts)
@pytest.mark.timeout(240)
def test_a_sigterm_ends_the_run_as_interrupted_with_how_to_resume(cluster, tmp_path):
    out = tmp_path / "run"
    argv = ["run", str(ROOT / "examples/tiny_grpo.yaml"), "placement=temporal", "steps=200"]
    argv += ["run.profile=calibrate", "run.checkpoint_every=1", f"output_dir={out}"]
    code, err = _sigterm_once(
        argv, tmp_path, lambda _: bool(list((out / "checkpoints").glob("step-*"))), 180
    )
    assert code == 143, err[-2000:]
    assert "loomrl run: terminated (SIGTERM); continue from step" in err, err[-2000:]
    assert f"with `loomrl resume {out}`" in err
    assert "SIGTERM received" not in err and "Traceback" not in err, err[-2000:]  # no crash dump
    s = json.loads((out / "run_summary.json").read_text())
    assert s["status"] == "interrupted" and s["signal"] == "SIGTERM", s
    assert s["error"].startswith("Terminated: SIGTERM") and s["steps_done"] >= 1


def test_a_sigterm_that_a_ray_wait_raised_as_a_plain_interrupt_is_summarised_as_sigterm(
    tmp_path, monkeypatch
):
    """ray.get and ray.wait raise a plain KeyboardInterrupt in place of the handler's
    Terminated: the summary still names SIGTERM."""
    import loomrl.cluster
    from loomrl.run import Run, RunConfig, Terminated

    class Started:
        def shutdown(self):
            pass

    monkeypatch.setattr(loomrl.cluster.Cluster, "start", staticmethod(lambda **kw: Started()))
    before = signal.getsignal(signal.SIGTERM)
    rc = RunConfig(output_dir=str(tmp_path), tensorboard=False, progress=False)
    run = Run(Cfg(rc), rc)
    try:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except Terminated:
            run._write_failure(KeyboardInterrupt())  # what Ray's wait raised for it
    finally:
        run.close()
    assert signal.getsignal(signal.SIGTERM) is before
    s = json.loads((tmp_path / "run_summary.json").read_text())
    assert (s["status"], s["signal"]) == ("interrupted", "SIGTERM"), s
    assert s["error"] == "Terminated: SIGTERM (kill, or a scheduler's time limit)"


_PROFILE_SECONDS = 60  # profiling tiny_grpo takes ~15 s on 2 cores; the SIGTERM comes early


@pytest.mark.timeout(240)  # about 12 s on 2 cores (the logic: test_cli)
def test_a_sigterm_ends_loomrl_profile_cleanly_with_143_and_no_profile(cluster, tmp_path):
    out = tmp_path / "prof"
    argv = ["profile", str(ROOT / "examples/tiny_grpo.yaml"), f"output_dir={out}"]
    code, err = _sigterm_once(
        argv, tmp_path, lambda err: "loomrl profile: profiling" in err, _PROFILE_SECONDS
    )
    assert code == 143, err[-2000:]
    assert "loomrl profile: terminated (SIGTERM)" in err, err[-2000:]
    assert "SIGTERM received" not in err and "Traceback" not in err, err[-2000:]
    assert list(out.iterdir()) == []  # no profile.yaml, whole or cut short
