"""Mistakes a user makes with `loomrl plan`, `loomrl profile`, `loomrl run`'s run.profile and
`loomrl report`: each ends with one clear message (the key or flag, the value, the fix) and a
non-zero status, never a traceback, a hang or a plan silently unlike the one meant. All fast:
nothing here starts Ray or a worker."""

from __future__ import annotations

import copy
import errno
import json
import time
import warnings
from pathlib import Path

import pytest
import yaml

from loomrl.cli import main
from loomrl.errors import ConfigError, PlanError
from loomrl.plan.cli import plan_main
from loomrl.plan.plan import Plan
from loomrl.plan.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny_grpo.yaml"  # a grpo config (a recipe with a profile entry)
PROFILES = ROOT / "examples" / "profiles"

CHAIN = {
    "devices": 3,
    "device_memory_gb": 12,
    "batch": 4,
    "granularities": [1, 2, 4],
    "components": {
        "rollout": {
            "valid_devices": [1, 2],
            "time": {"alpha": 0.05, "per_item": {1: 0.2, 2: 0.11}},
            "memory_gb": 0.5,
        },
        "reward": {"valid_devices": [1], "time": {"per_item": {1: 0.01}}, "memory_gb": 0.3},
        "actor": {
            "valid_devices": [1, 2],
            "time": {"alpha": 0.05, "per_item": {1: 0.15, 2: 0.09}},
            "memory_gb": 0.6,
        },
    },
    "edges": [["rollout", "reward"], ["reward", "actor"]],
}


def _chain(**changes) -> dict:
    raw = copy.deepcopy(CHAIN)
    raw.update(changes)
    return raw


def _write(tmp_path: Path, raw: dict | str, name: str = "p.yaml") -> str:
    path = tmp_path / name
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw))
    return str(path)


def _fails(argv: list[str], capsys, status: int = 2) -> str:
    """Run `loomrl plan ARGV`: it exits ``status`` with one line on stderr, nothing on stdout."""
    assert plan_main(argv) == status
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err


# ----------------------------------------------------------------------------- the profile


def test_a_path_that_leaves_a_declared_cycle_and_comes_back_is_a_profile_error(tmp_path, capsys):
    """cycles [rollout <-> actor] with rollout -> reward -> actor: collapsed, the cycle node
    runs before and after reward. It passed the profile's checks and ended in the graph's
    ValueError traceback."""
    raw = _chain(cycles=[{"members": ["rollout", "actor"], "steps": 3}])
    with pytest.raises(ConfigError) as ei:
        load_profile(raw)
    (problem,) = ei.value.problems
    assert "edges form a cycle among ['actor', 'reward', 'rollout']" in problem
    assert "through cycles[0] (rollout <-> actor, which runs both ways)" in problem
    err = _fails([_write(tmp_path, raw)], capsys)
    assert err.startswith("loomrl plan: invalid profile ") and "remove an edge" in err
    # a cycle declared between components that exchange data directly still plans
    ok = _chain(cycles=[{"members": ["reward", "actor"], "steps": 3}])
    assert plan_main([_write(tmp_path, ok, "ok.yaml")]) == 0


def test_a_vast_aliased_value_is_quoted_briefly_and_fast(tmp_path, capsys):
    """YAML aliases nested nine deep stand for 9**9 items: the message quoting the value took
    14 s and printed 312 MB."""
    lines = ['a_: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}_: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    body = yaml.safe_dump(_chain()).replace("edges:", "old_edges:")
    path = _write(tmp_path, "\n".join(lines) + "\n" + body + "edges: *h\n")
    t = time.perf_counter()
    err = _fails([path], capsys)
    assert time.perf_counter() - t < 10
    assert len(err) < 20_000, len(err)
    # the unknown keys are listed together, with the known keys once
    assert "top level: unknown keys 'a_', 'b_'" in err and err.count("known keys:") == 1
    assert "and 1 more" in err  # nine unknown keys (a_..i_); the old_edges one has a match
    assert "edges: [[" in err and "...]" in err


def test_many_problems_are_cut_to_the_first_ones(tmp_path, capsys):
    raw = _chain(edges=[["rollout", f"c{i}"] for i in range(40)])
    err = _fails([_write(tmp_path, raw)], capsys)
    assert err.count("names unknown component") == 12
    assert "and 28 more problem(s) of the same file" in err


def test_an_empty_samples_list_is_named_not_taken_for_a_missing_time(tmp_path, capsys):
    raw = _chain()
    del raw["components"]["rollout"]["time"]
    raw["components"]["rollout"]["samples"] = []
    err = _fails([_write(tmp_path, raw)], capsys)
    assert "components.rollout.samples must be a non-empty list of measured rows" in err
    assert "missing required key 'time'" not in err
    raw["components"]["rollout"]["samples"] = 0  # falsy, not a list: refused, not ignored
    err = _fails([_write(tmp_path, raw)], capsys)
    assert "components.rollout.samples must be a non-empty list" in err and "got 0" in err


def test_components_no_edge_links_plan_with_a_warning(tmp_path, capsys):
    """A forgotten edge plans a wrong overlap; a profile file that links no component, or
    leaves one out, still plans, and says so."""
    raw = _chain()
    raw["components"]["lonely"] = copy.deepcopy(raw["components"]["reward"])
    assert plan_main([_write(tmp_path, raw)]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "component(s) ['lonely'] are in no edge or cycle" in err
    assert plan_main([_write(tmp_path, _chain(edges=[]), "none.yaml")]) == 0
    assert "3 components and no edges: the planner takes them as independent" in (
        capsys.readouterr().err
    )
    # a mapping built in code (the profiler's fit, tests' random instances) is not warned of
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_profile(_chain(edges=[]))
    # a failing command says its error alone
    bad = _chain(edges=[], batch=0)
    err = _fails([_write(tmp_path, bad, "bad.yaml")], capsys)
    assert "batch must be a positive integer" in err and "warning" not in err


def test_costs_for_device_counts_valid_devices_leaves_out_are_warned_of(tmp_path, capsys):
    raw = _chain()
    raw["components"]["rollout"]["time"]["per_item"][4] = 0.06  # 4 not in valid_devices
    assert plan_main([_write(tmp_path, raw)]) == 0
    err = capsys.readouterr().err
    assert (
        "components.rollout.time.per_item has values for device count(s) 4, which "
        "components.rollout.valid_devices [1, 2] leaves out: the planner never uses them" in err
    )


def test_a_file_far_too_large_for_a_profile_is_not_read_whole(tmp_path, capsys):
    """A checkpoint named by mistake (2 GB) was read whole: 14 s and 4 GB of memory."""
    big = tmp_path / "step-5.pt"
    with open(big, "wb") as f:
        f.truncate(2 * 2**30)  # sparse: no disk used
    t = time.perf_counter()
    err = _fails([str(big)], capsys)
    assert time.perf_counter() - t < 5
    assert "holds more than 64 MB (2,048 MB); a workload profile is a small YAML or JSON" in err
    err = _fails(["/dev/zero"], capsys)  # a read of it never ends
    assert "profile file '/dev/zero' is a device, not a file" in err


def test_a_profile_named_json_in_capitals_is_read_as_json(tmp_path, capsys):
    path = tmp_path / "P.JSON"
    path.write_text(json.dumps(_chain()))
    assert plan_main([str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["predicted_s"] > 0


# ------------------------------------------------------------------------------ the flags


def test_save_over_the_profile_itself_is_refused_and_the_profile_kept(tmp_path, capsys):
    path = _write(tmp_path, _chain())
    before = Path(path).read_text()
    err = _fails([path, "--save", path], capsys)
    assert f"--save {path}: is the profile being planned" in err and "name another file" in err
    link = tmp_path / "link.yaml"
    link.symlink_to(path)
    _fails([str(link), "--save", path], capsys)
    assert Path(path).read_text() == before


def test_save_and_timeline_naming_one_file_is_refused(tmp_path, capsys):
    path = _write(tmp_path, _chain())
    same = str(tmp_path / "out.svg")
    err = _fails([path, "--save", same, "--timeline", same], capsys)
    assert "--timeline writes the same file; give them different files" in err


@pytest.mark.parametrize("flag", ["--save", "--timeline"])
def test_an_empty_output_path_is_named_as_such(tmp_path, capsys, flag):
    """--save '' was "--save : is a directory" (Path('') is the current folder)."""
    err = _fails([_write(tmp_path, _chain()), flag, ""], capsys)
    assert f"{flag} '': an empty path; name a file" in err


def test_save_to_an_image_name_points_to_timeline(tmp_path, capsys):
    err = _fails([_write(tmp_path, _chain()), "--save", str(tmp_path / "plan.png")], capsys)
    assert "--save writes the plan as text" in err and "--timeline " in err
    assert not (tmp_path / "plan.png").exists()


@pytest.mark.parametrize("name", ["plan.JSON", "plan.Json"])
def test_save_to_json_in_any_case_writes_json_that_loads_back(tmp_path, capsys, name):
    """plan.JSON was written as YAML: JSON tools could not read it."""
    out = tmp_path / name
    assert plan_main([_write(tmp_path, _chain()), "--save", str(out)]) == 0
    capsys.readouterr()
    d = json.loads(out.read_text())
    assert Plan.load(out) == Plan.from_dict(d)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


def test_exhaustive_stops_at_its_time_limit_with_a_message(monkeypatch, capsys):
    """6 components on 16 devices: the brute force ran for hours (a warning, then nothing)."""
    import loomrl.plan.cli as cli

    monkeypatch.setattr(cli, "EXHAUSTIVE_LIMIT_S", 0.3)
    t = time.perf_counter()
    assert plan_main([str(PROFILES / "ppo_actor_critic.yaml"), "--exhaustive"]) == 2
    assert time.perf_counter() - t < 30
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert "--exhaustive: the brute force over every plan of 6 components on 16 devices" in err
    assert "did not end within 0.3 s and was stopped" in err
    assert "drop --exhaustive for the exact DP search" in err


def test_exhaustive_all_is_one_pass_equal_to_each_modes_brute_force():
    from loomrl.plan.search import ExhaustiveTooLong, exhaustive, exhaustive_all, search_all

    prof = load_profile(PROFILES / "tiny_grpo.yaml")
    every = exhaustive_all(prof)
    dp = search_all(prof)
    for mode, plan in every.items():
        assert plan is not None and plan.method == "exhaustive"
        assert plan.predicted_s == pytest.approx(dp[mode].predicted_s)
        assert plan.predicted_s == exhaustive(prof, mode=mode).predicted_s
        assert plan.modes == pytest.approx(dp["best"].modes)
    with pytest.raises(ExhaustiveTooLong):
        exhaustive(prof, deadline=time.perf_counter() - 1)


def test_ctrl_c_in_a_search_exits_130_without_a_traceback(tmp_path, capsys, monkeypatch):
    import importlib

    search = importlib.import_module("loomrl.plan.search")  # loomrl.plan.search: a function too

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(search, "search_all", interrupted)
    err = _fails([_write(tmp_path, _chain())], capsys, status=130)
    assert err == "loomrl plan: interrupted\n"


@pytest.mark.parametrize(
    "words, hint",
    [
        (["devices=4"], "loomrl plan takes flags, not key=value: --devices 4"),
        (["devices=4", "mode=spatial"], "key=value: --devices 4, --mode spatial"),
        (["--devcies", "4"], "did you mean: --devcies -> --devices?"),
    ],
)
def test_an_override_or_a_misspelt_flag_names_the_flag_to_use(tmp_path, capsys, words, hint):
    with pytest.raises(SystemExit) as ei:
        plan_main([_write(tmp_path, _chain()), *words])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("loomrl plan: unrecognized arguments: ") and hint in err
    assert len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------- loomrl profile and run


def _no_profiling(monkeypatch):
    """Fail the test if the grpo recipe's profiling (Ray, workers) would start."""
    import loomrl.recipes.reasoning_grpo as grpo

    def profile(cfg):
        raise AssertionError("profiling started")

    monkeypatch.setattr(grpo, "profile", profile)


@pytest.mark.parametrize(
    "override",
    ["run.profile={path}", "run={{profile: {path}}}", "run.profile=calibrate"],
)
def test_profile_refuses_run_profile_naming_the_flag_to_use(
    tmp_path, capsys, monkeypatch, override
):
    """`loomrl profile CONFIG run.profile=FILE` measured, wrote run.output_dir/profile.yaml and
    left FILE alone: the value was silently ignored."""
    _no_profiling(monkeypatch)
    path = tmp_path / "mine.yaml"
    assert main(["profile", str(TINY), override.format(path=path), f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "`loomrl profile` neither reads nor writes run.profile" in err
    assert "pass output_dir=DIR (the profile goes to DIR/profile.yaml)" in err
    assert "Traceback" not in err and not path.exists()


def test_profile_leaves_the_configs_own_run_profile_unused(tmp_path, capsys, monkeypatch):
    """A config for `loomrl run` may name a profile (or calibrate, as the examples do): profiling
    measures anew, so a missing file, or calibrate beside placement=auto, must not stop it."""
    import loomrl.recipes.reasoning_grpo as grpo

    seen = []
    monkeypatch.setattr(grpo, "profile", lambda cfg: seen.append(cfg) or "profiled")
    config = tmp_path / "c.yaml"
    text = TINY.read_text()
    assert "\nrun:\n" in text
    config.write_text(text.replace("\nrun:\n", "\nrun:\n  profile: /nonexistent/p.yaml\n", 1))
    assert main(["profile", str(config), f"output_dir={tmp_path / 'o'}", "run.profile=null"]) == 0
    assert main(["profile", str(config), f"output_dir={tmp_path / 'o'}"]) == 0
    assert [c.run.profile for c in seen] == [None, None]
    assert "profiled" in capsys.readouterr().out


def test_profile_help_documents_run_profile(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "run.profile=FILE is refused here" in out and "output_dir=DIR" in out


def test_profile_with_a_micro_batch_that_does_not_divide_the_batch_fails_before_ray(
    tmp_path, capsys, monkeypatch
):
    """It was measured for minutes, then refused as the fit's 'granularities: 3 does not
    divide batch=4'."""
    _no_profiling(monkeypatch)
    assert main(["profile", str(TINY), "micro_batch=3", f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "run.micro_batch=3 does not divide batch=4" in err and "one of [1, 2, 4]" in err


def test_profile_flow_refuses_such_a_micro_batch_before_measuring():
    from loomrl.profiler import profile_flow

    with pytest.raises(PlanError, match=r"micro_batch=3 does not divide the 4 items profiled"):
        profile_flow(None, [1, 2, 3, 4], micro_batch=3)  # no flow touched


@pytest.mark.parametrize(
    "text, needle",
    [
        ("devices: 3\nbatch: [4\n", "cannot parse"),  # truncated
        ("tree: {op: leaf}\nmicro_batch: 1\n", "this is a plan"),
        ("devices: 3\n", "missing required key 'components'"),
    ],
)
def test_run_with_a_run_profile_that_is_no_profile_fails_before_ray(
    tmp_path, capsys, monkeypatch, text, needle
):
    import loomrl.cli as cli

    def started(*a, **k):
        raise AssertionError("the run started")

    monkeypatch.setattr(cli, "prepare_run_dir", started)
    path = tmp_path / "prof.yaml"
    path.write_text(text)
    argv = ["run", str(TINY), f"run.profile={path}", f"output_dir={tmp_path / 'o'}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"run.profile={path}: not a usable workload profile: " in err and needle in err
    assert "drop run.profile to measure the costs" in err and "Traceback" not in err


# ------------------------------------------------------------------------------ loomrl report


def test_report_out_empty_a_file_or_unwritable_exits_2(tmp_path, capsys, monkeypatch):
    from test_report import write_run

    import loomrl.report as report

    run = write_run(tmp_path / "run")
    assert report.report_main([str(run), "--out", ""]) == 2
    assert "--out '' is an empty path" in capsys.readouterr().err
    assert not (run / report.FIGURE_FILE).exists()  # not written into RUN_DIR instead
    (tmp_path / "f").write_text("x")
    assert report.report_main([str(run), "--out", str(tmp_path / "f")]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report, "export_chrome_trace", full)
    assert report.report_main([str(run), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "writing into" in err and "No space left on device" in err and "Traceback" not in err
