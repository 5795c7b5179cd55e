"""SIGTERM (`kill`, a scheduler's time limit) stops a run as Ctrl-C does: workers stopped, a
summary saying how it ended, the command that resumes it, exit status 143."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_RUN_CLI = "import sys; from loomrl.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.slow  # about 45 s on 2 cores (the logic: test_cli and test_run_attempts)
@pytest.mark.timeout(240)
def test_a_sigterm_ends_the_run_as_interrupted_with_how_to_resume(cluster, tmp_path):
    import ray

    out = tmp_path / "run"
    env = {
        **os.environ,
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,  # this session's Ray: no new one
        "RAY_AUTH_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    argv = ["run", str(ROOT / "examples/tiny_grpo.yaml"), "placement=temporal", "steps=200"]
    argv += ["run.profile=calibrate", "run.checkpoint_every=1", f"output_dir={out}"]
    err_file = tmp_path / "stderr.txt"  # a file: a pipe nobody reads could fill and block it
    with open(err_file, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _RUN_CLI, *argv], env=env, stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        deadline = time.monotonic() + 180
        while not list((out / "checkpoints").glob("step-*")):
            assert proc.poll() is None, err_file.read_text()[-2000:]
            assert time.monotonic() < deadline, "the run saved no checkpoint in 180 s"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = err_file.read_text()
    assert code == 143, err[-2000:]
    assert "loomrl run: terminated (SIGTERM); continue from step" in err, err[-2000:]
    assert f"with `loomrl resume {out}`" in err
    assert "SIGTERM received" not in err and "Traceback" not in err, err[-2000:]  # no crash dump
    s = json.loads((out / "run_summary.json").read_text())
    assert s["status"] == "interrupted" and s["signal"] == "SIGTERM", s
    assert s["error"].startswith("Terminated: SIGTERM") and s["steps_done"] >= 1
