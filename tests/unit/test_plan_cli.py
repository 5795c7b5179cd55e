"""``loomrl plan`` through plan_main: output, JSON fields, exit status 2 with a message."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from loomrl.plan.cli import plan_main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "profiles"


def test_human_output(capsys):
    assert plan_main([str(EXAMPLES / "grpo_long_rollout.yaml"), "--devices", "8"]) == 0
    out = capsys.readouterr().out
    assert "best plan (temporal)" in out
    assert "rollout" in out and "0-7" in out
    for mode in ("temporal", "spatial", "hybrid"):
        assert mode in out
    assert "1.000x" in out


def test_human_output_shows_each_pure_modes_own_plan(capsys):
    """Beside the best plan, the best plan of every other pure mode that has one: its micro-batch,
    time and tree, as in the JSON's plans."""
    assert plan_main([str(EXAMPLES / "tiny_ppo.yaml"), "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plan_main([str(EXAMPLES / "tiny_ppo.yaml")]) == 0
    out = capsys.readouterr().out
    t = plans["temporal"]
    assert f"best temporal plan: micro-batch {t['micro_batch']}, {t['predicted_s']:.4f} s" in out
    assert "best hybrid plan" not in out  # the best plan is the hybrid one, shown above
    assert plans["spatial"] is None and "best spatial plan" not in out


def test_json_fields(capsys):
    assert plan_main([str(EXAMPLES / "ppo_actor_critic.yaml"), "--devices", "16", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("predicted_s", "micro_batch", "tree", "assignment", "modes", "search_s"):
        assert key in d
    assert d["tree"]["op"] == "spatial"
    assert set(d["modes"]) == {"temporal", "spatial", "hybrid"}
    assert d["devices"] == 16

    def nodes(t):
        yield t
        for c in t["children"]:
            yield from nodes(c)

    # PLANNER.md's four keys on every node; a component only on leaves.
    for t in nodes(d["tree"]):
        assert {"op", "component", "devices", "children"} <= set(t), t
        assert (t["component"] is None) == (t["op"] in ("temporal", "spatial")), t


def test_exhaustive_simulate_timeline(capsys, tmp_path):
    png = tmp_path / "t.png"
    rc = plan_main(
        [
            str(EXAMPLES / "grpo_long_rollout.yaml"),
            "--devices",
            "4",
            "--exhaustive",
            "--json",
            "--simulate",
            "--iterations",
            "5",
            "--timeline",
            str(png),
        ]
    )
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["method"] == "exhaustive"
    assert d["simulated"]["analytic_s"] == d["predicted_s"]
    assert png.exists()


def test_no_plan_fits_exits_2_naming_the_component(capsys, tmp_path):
    raw = yaml.safe_load((EXAMPLES / "grpo_long_rollout.yaml").read_text())
    raw["device_memory_gb"] = 15
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(raw))
    assert plan_main([str(p), "--devices", "8"]) == 2
    err = capsys.readouterr().err
    assert "component 'rollout' needs 21 GB per device" in err and "device_memory_gb is 15" in err
    assert "Traceback" not in err


def test_malformed_profile_exits_2(capsys, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(
        "devices: 8\ndevice_memory_gb: 80\nbatch: 8\ncomponents: {a: {valid_devices: [1], tiem: {}}}\n"
    )
    assert plan_main([str(p)]) == 2
    err = capsys.readouterr().err
    assert "invalid profile" in err and "did you mean 'time'" in err
    p.write_text("devices: [unclosed\n")
    assert plan_main([str(p)]) == 2
    assert plan_main([str(tmp_path / "missing.yaml")]) == 2


def test_costs_fitted_from_samples_report_their_error(tmp_path, capsys):
    """PLANNER.md: a fit from measured samples must report its error; `loomrl plan` prints it
    (and --json gives it under "fits")."""
    path = tmp_path / "fit.yaml"
    path.write_text(
        "devices: 4\ndevice_memory_gb: 80\nbatch: 8\ngranularities: [1, 2, 4, 8]\n"
        "components:\n"
        "  a:\n    valid_devices: [1, 2, 4]\n"
        "    samples: [[1, 2, 2.2, 10], [1, 8, 8.3, 10], [2, 2, 1.2, 6], [2, 8, 4.1, 6]]\n"
        "  b:\n    valid_devices: [1, 2]\n"
        "    time: {alpha: 0.1, per_item: {1: 1.0, 2: 0.5}}\n    memory_gb: 5\n"
        "edges: [[a, b]]\n"
    )
    assert plan_main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "costs fitted from samples:" in out
    assert re.search(r"a: 4 samples, mean rel\. error \d+\.\d+%, max \d+\.\d+%", out)
    assert plan_main([str(path), "--json"]) == 0
    (fit,) = json.loads(capsys.readouterr().out)["fits"]
    assert fit["component"] == "a" and fit["samples"] == 4 and fit["measured_devices"] == [1, 2]
    assert 0 < fit["rel_err_mean"] <= fit["rel_err_max"] < 0.1


def test_no_plan_of_a_mode_says_what_rules_it_out(capsys):
    demo = str(EXAMPLES / "demo_matmul.yaml")
    assert plan_main([demo, "--devices", "1", "--mode", "hybrid"]) == 2
    assert "no hybrid plan fits on 1 devices" in capsys.readouterr().err
    # A split cycle takes a device for each member, which the count of devices needed includes.
    pixels = str(EXAMPLES / "embodied_pixels_cpu2.yaml")
    assert plan_main([pixels, "--mode", "spatial"]) == 2
    err = capsys.readouterr().err
    assert "need at least 3 devices ({'env<->policy': 2, 'actor_train': 1})" in err


def test_profile_warnings_are_one_line_each(tmp_path, capsys):
    """A fit carried far past its samples warns as 'loomrl plan: warning: ...', runs shortened."""
    valid = list(range(1, 257))

    def comp(scale):
        samples = [[n, x, 0.2 + x * scale / n, 10 + 40 / n] for n in (1, 2, 4) for x in (4, 16)]
        return {"valid_devices": valid, "samples": samples}

    path = tmp_path / "p.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "devices": 256,
                "device_memory_gb": 80,
                "batch": 64,
                "granularities": [4, 16, 64],
                "components": {"gen": comp(2.0), "train": comp(1.0)},
                "edges": [["gen", "train"]],
            }
        )
    )
    assert plan_main([str(path)]) == 0
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 2, captured.err
    assert all(x.startswith("loomrl plan: warning: component ") for x in lines)
    assert "n = 33-256, more than 8x" in lines[0] and "UserWarning" not in captured.err
    assert "extrapolated to 3, 5-256" in captured.out


def test_argument_mistakes_exit_2_before_any_search(capsys, tmp_path):
    prof = str(EXAMPLES / "ppo_actor_critic.yaml")
    (tmp_path / "f").write_text("")  # a file where a folder of the path should be
    cases = [
        (["--devices", "0"], "--devices must be a positive integer, got 0"),
        (["--simulate", "--iterations", "0"], "--iterations must be from 1 to 100,000"),
        (["--simulate", "--sigma", "-1"], "--sigma must be a finite log-normal spread from 0"),
        (["--simulate", "--channel-capacity", "0"], "--channel-capacity must be >= 1"),
        (["--timeline", str(tmp_path / "f" / "x.png")], "is a file, not a directory"),
        (["--timeline", str(tmp_path / "x.txt")], "an image file ending in one of"),
        (["--save", str(tmp_path / "f" / "x.json")], "is a file, not a directory"),
    ]
    for extra, message in cases:
        assert plan_main([prof, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and "invalid profile" not in err, (extra, err)


def test_exhaustive_on_a_large_instance_warns(capsys, monkeypatch):
    import importlib

    import pytest

    search_mod = importlib.import_module("loomrl.plan.search")

    class Stop(Exception):
        pass

    def stop(*a, **k):  # the warning comes before the brute force; stop there
        raise Stop

    monkeypatch.setattr(search_mod, "exhaustive_all", stop)  # one pass for every mode
    with pytest.raises(Stop):
        plan_main([str(EXAMPLES / "ppo_actor_critic.yaml"), "--devices", "16", "--exhaustive"])
    assert "may take very long" in capsys.readouterr().err


def test_plan_files_that_are_not_plans_are_plan_errors(tmp_path):
    import pytest

    from loomrl.errors import PlanError
    from loomrl.plan.plan import Plan
    from loomrl.plan.profile import load_profile
    from loomrl.plan.search import search

    good = search(load_profile(EXAMPLES / "demo_matmul.yaml"), mode="temporal").to_dict()
    gap = json.loads(json.dumps(good))
    gap["tree"]["children"][0]["devices"] = [0, 5]
    bad_op = json.loads(json.dumps(good))
    bad_op["tree"]["op"] = "parallel"
    cases = {
        "broken.json": ("{not json", "cannot be read"),
        "profile.yaml": ((EXAMPLES / "demo_matmul.yaml").read_text(), "is a workload profile"),
        "list.json": ("[1, 2]", "is not a plan"),
        "gap.json": (json.dumps(gap), "not one contiguous range"),
        "op.json": (json.dumps(bad_op), "is not a valid plan"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(PlanError, match=message):
            Plan.load(tmp_path / name)
    with pytest.raises(PlanError, match="cannot be read"):
        Plan.load(tmp_path)  # a directory
    (tmp_path / "good.json").write_text(json.dumps(good))
    assert Plan.load(tmp_path / "good.json").assignment() == Plan.from_dict(good).assignment()


def test_negative_memory_and_a_plan_given_as_a_profile_are_named(tmp_path, capsys):
    prof = yaml.safe_load((EXAMPLES / "demo_matmul.yaml").read_text())
    first = next(iter(prof["components"]))
    prof["components"][first]["memory_gb"] = -5
    p = tmp_path / "neg.yaml"
    p.write_text(yaml.safe_dump(prof))
    assert plan_main([str(p)]) == 2
    assert f"components.{first}.memory_gb" in capsys.readouterr().err
    plan = tmp_path / "plan.json"
    assert plan_main([str(EXAMPLES / "demo_matmul.yaml"), "--save", str(plan)]) == 0
    capsys.readouterr()
    assert plan_main([str(plan)]) == 2
    err = capsys.readouterr().err
    assert "this is a plan" in err and err.count("\n") <= 2


def test_a_recipe_config_given_as_a_profile_is_named_in_one_line(capsys):
    """Each of the config's sections was an unknown key, each listing the known keys again."""
    assert plan_main([str(EXAMPLES.parent / "ppo_inverted_pendulum.yaml")]) == 2
    err = capsys.readouterr().err
    assert "this is a recipe config (recipe: embodied_ppo), not a workload profile" in err
    assert "profile.json" in err and "unknown key" not in err and err.count("\n") <= 2


def test_a_bad_or_missing_batch_is_the_only_problem_said(tmp_path, capsys):
    prof = yaml.safe_load((EXAMPLES / "demo_matmul.yaml").read_text())
    prof["granularities"] = [2, 4]
    for batch, said in ((0, "batch must be a positive integer, got 0"), (None, "'batch'")):
        if batch is None:
            prof.pop("batch")
        else:
            prof["batch"] = batch
        p = tmp_path / "b.yaml"
        p.write_text(yaml.safe_dump(prof))
        assert plan_main([str(p)]) == 2
        err = capsys.readouterr().err
        assert said in err and "does not divide" not in err, err


def _write(tmp_path, raw, name="p.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(raw))
    return str(p)


def _two(**over):
    """Components a -> b on 1 or 2 devices each."""
    comp = {"time": {"alpha": 0.1, "per_item": {1: 1.0, 2: 0.6}}, "memory_gb": 10}
    raw = {
        "devices": 4,
        "device_memory_gb": 80,
        "batch": 8,
        "granularities": [1, 2, 4, 8],
        "components": {
            "a": {"valid_devices": [1, 2], **comp, "switch_s": 0.5},
            "b": {"valid_devices": [1, 2], **comp, "switch_s": 0.5},
        },
        "edges": [["a", "b"]],
    }
    raw.update(over)
    return raw


def test_devices_past_the_limit_exit_2_naming_it(capsys, tmp_path):
    prof = _write(tmp_path, _two())
    for n in ("99999999999999999999", str(10**12), "1000001"):
        assert plan_main([prof, "--devices", n]) == 2
        err = capsys.readouterr().err
        assert "--devices must be at most 1,000,000" in err and "Traceback" not in err, err
    assert plan_main([_write(tmp_path, _two(devices=10**12), "big.yaml")]) == 2
    err = capsys.readouterr().err
    assert "invalid profile" in err and "devices must be a whole number" in err
    assert "1,000,000" in err
    from loomrl.plan.cli import build_parser

    assert "1,000,000" in build_parser().format_help()


def test_running_out_of_memory_in_the_search_exits_2(capsys, tmp_path, monkeypatch):
    import importlib

    search_mod = importlib.import_module("loomrl.plan.search")

    def too_big(*a, **k):
        raise MemoryError("Unable to allocate 7.28 TiB for an array")

    monkeypatch.setattr(search_mod, "search_all", too_big)
    assert plan_main([_write(tmp_path, _two()), "--devices", "1000000"]) == 2
    err = capsys.readouterr().err
    assert "out of memory while searching plans" in err and "--devices 1,000,000" in err
    assert "fewer --devices" in err


def test_a_cycle_that_fits_no_layout_states_both_constraints(capsys, tmp_path):
    raw = _two(devices=2, edges=[["a", "b"], ["b", "a"]], cycles=[{"members": ["a", "b"]}])
    raw["cycles"][0]["steps"] = 3
    raw["components"]["a"].update(valid_devices=[1], time={"alpha": 0.1, "per_item": {1: 1.0}})
    raw["components"]["b"].update(valid_devices=[2], time={"alpha": 0.1, "per_item": {2: 1.0}})
    assert plan_main([_write(tmp_path, raw)]) == 2
    err = capsys.readouterr().err
    assert "cycle 'a<->b' fits no layout on 2 devices" in err
    assert "'a' allows [1] and 'b' allows [2]: none is valid for both" in err
    assert "at least 1 + 2 = 3 devices" in err
    assert "valid_devices None" not in err and "needs at least 2 devices" not in err
    assert plan_main([_write(tmp_path, raw), "--devices", "3"]) == 0


def test_one_component_has_no_spatial_or_hybrid_plan(capsys, tmp_path):
    raw = _two(edges=[])
    del raw["components"]["b"]
    prof = _write(tmp_path, raw)
    assert plan_main([prof, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["mode"] == "temporal" and d["tree"]["op"] == "leaf"
    assert d["modes"] == {"temporal": d["predicted_s"], "spatial": None, "hybrid": None}
    assert d["plans"]["spatial"] is None
    assert plan_main([prof, "--mode", "spatial", "--json"]) == 2
    err = capsys.readouterr().err
    assert "no spatial plan exists" in err and "only 'a'" in err
    assert plan_main([prof, "--exhaustive", "--mode", "spatial"]) == 2
    assert plan_main([prof]) == 0
    out = capsys.readouterr().out
    assert re.search(r"spatial\s+infeasible", out) and re.search(
        r"temporal\s+[\d.]+ s\s+1\.000x", out
    )


def test_modes_include_the_iteration_overhead_like_the_best_plan(capsys, tmp_path):
    """A profile a run saved carries iteration_overhead_s: the best plan's predicted_s has it,
    so must the pure modes' times, or the best reads slower than every mode."""
    prof = _write(tmp_path, _two(iteration_overhead_s=0.25))
    bare = _write(tmp_path, _two(), "bare.yaml")
    assert plan_main([bare, "--json"]) == 0
    without = json.loads(capsys.readouterr().out)
    for extra in ([], ["--exhaustive"]):
        assert plan_main([prof, "--json", *extra]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["predicted_s"] == pytest.approx(without["predicted_s"] + 0.25)
        assert d["modes"][d["mode"]] == pytest.approx(d["predicted_s"])
        for mode, t in d["modes"].items():
            if t is not None:
                assert t == pytest.approx(without["modes"][mode] + 0.25)
                assert t == pytest.approx(d["plans"][mode]["predicted_s"])
    assert plan_main([prof]) == 0
    out = capsys.readouterr().out
    best = float(re.search(r"best plan \(\w+\): ([\d.]+) s", out).group(1))
    table = [float(x) for x in re.findall(r"^\s+\w+\s+([\d.]+) s\s+[\d.]+x$", out, re.M)]
    assert min(table) == pytest.approx(best, abs=1e-4)
