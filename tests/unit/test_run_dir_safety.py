"""A run directory's files the user wrote, and `loomrl resume` on what is not a run directory
(no Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loomrl.cli import _normalise_overrides, load_recipe_config, main, prepare_run_dir
from loomrl.runlog import config_text

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny_grpo.yaml"


def test_a_hand_written_config_in_the_run_directory_is_set_aside_not_written_over(tmp_path, capsys):
    mine = TINY.read_text() + "# my notes\n"
    (tmp_path / "config.yaml").write_text(mine)
    overrides = _normalise_overrides([f"output_dir={tmp_path}", "steps=1"])
    cfg = load_recipe_config(tmp_path / "config.yaml", overrides)[1]  # read before the move
    assert prepare_run_dir(cfg) is None
    (aside,) = tmp_path.glob("before-*")
    assert (aside / "config.yaml").read_text() == mine
    assert not (tmp_path / "config.yaml").exists()
    err = capsys.readouterr().err
    assert f"{tmp_path / 'config.yaml'} is not this run's config" in err
    assert f"moved to {aside / 'config.yaml'}" in err


def test_the_config_this_run_writes_is_no_reason_to_set_anything_aside(tmp_path, capsys):
    cfg = load_recipe_config(TINY, _normalise_overrides([f"output_dir={tmp_path}"]))[1]
    (tmp_path / "config.yaml").write_text(config_text(cfg))  # a run that failed at its start
    assert prepare_run_dir(cfg) is None
    assert not list(tmp_path.glob("before-*")) and (tmp_path / "config.yaml").is_file()
    assert capsys.readouterr().err == ""


def test_resume_of_what_is_not_a_directory_says_so(tmp_path, capsys):
    assert main(["resume", str(tmp_path / "nowhere")]) == 2
    assert f"{tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err
    (tmp_path / "afile").write_text("x")
    assert main(["resume", str(tmp_path / "afile")]) == 2
    assert f"{tmp_path / 'afile'} is a file, not a run directory" in capsys.readouterr().err
    assert main(["resume", str(tmp_path)]) == 2
    assert "has no config.yaml" in capsys.readouterr().err
    assert not (tmp_path / ".loomrl.lock").exists()  # no lock file left in what is no run's


@pytest.mark.parametrize("config_left", [True, False])  # a new run starting moves it aside
def test_resume_of_a_directory_a_run_holds_says_it_is_in_use_and_how_to_go_on(
    tmp_path, capsys, config_left
):
    import fcntl

    from loomrl.runlog import LOCK_FILE

    if config_left:
        (tmp_path / "config.yaml").write_text(TINY.read_text())
    with open(tmp_path / LOCK_FILE, "a+") as other:  # another process's hold, as it looks here
        other.write("pid 12345\n")
        other.flush()
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} is in use by a running loomrl run (pid 12345)" in err
    assert "wait for it to end, or stop it (Ctrl-C where it runs, or `kill 12345`)" in err
    assert "output_dir" not in err  # a resume cannot move elsewhere
    (tmp_path / "config.yaml").write_text(TINY.read_text())
    assert main(["resume", str(tmp_path)]) == 2  # free again: on to what the directory holds
    assert "no complete checkpoint to resume from" in capsys.readouterr().err
