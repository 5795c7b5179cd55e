"""``loomrl plan`` on user mistakes and edge-case profiles: a one-line message naming the key,
the value and the fix, exit status 2, never a traceback or a hang."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from loomrl.plan.cli import _slowdown, plan_main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "profiles"


def _write(tmp_path, raw, name="p.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(raw))
    return str(p)


def _chain(per_item=1.0, **over):
    """Components a -> b on one device each, every call ``per_item`` s an item."""

    def comp():
        return {"valid_devices": [1], "time": {"per_item": {1: per_item}}}

    raw = {
        "devices": 2,
        "device_memory_gb": 10,
        "batch": 2,
        "granularities": [1, 2],
        "components": {"a": comp(), "b": comp()},
        "edges": [["a", "b"]],
    }
    raw.update(over)
    return raw


def test_slowdown_against_a_zero_second_best_has_no_ratio():
    assert _slowdown(2.0, 1.0).strip() == "2.000x"
    assert _slowdown(0.0, 0.0).strip() == "1.000x"
    assert "n/a" in _slowdown(1.0, 0.0)


def test_a_profile_of_zero_costs_prints_its_plans(tmp_path, capsys):
    raw = _chain(per_item=0)
    raw["components"]["b"]["switch_s"] = 1  # only the temporal plan pays for anything
    prof = _write(tmp_path, raw)
    assert plan_main([prof]) == 0
    out = capsys.readouterr().out
    assert re.search(r"spatial\s+0\.0000 s\s+1\.000x", out), out
    assert re.search(r"temporal\s+1\.0000 s\s+n/a", out), out
    png = tmp_path / "t.png"
    assert plan_main([prof, "--json", "--timeline", str(png)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["predicted_s"] == 0
    assert png.exists() and captured.err == ""


def _cycle_with_a_component_named_like_it(extra_edge: bool) -> dict:
    def comp():
        return {"valid_devices": [1], "time": {"per_item": {1: 1.0}}}

    raw = {
        "devices": 4,
        "device_memory_gb": 40,
        "batch": 4,
        "components": {
            "env": comp(),
            "policy": comp(),
            "env<->policy": {"valid_devices": [1, 2], "time": {"per_item": {1: 5.0, 2: 3.0}}},
        },
        "edges": [["env", "policy"], ["policy", "env"]],
        "cycles": [{"members": ["env", "policy"], "steps": 2}],
    }
    if extra_edge:
        raw["edges"].append(["policy", "env<->policy"])
    return raw


def test_a_component_named_like_a_cycle_node_is_refused(tmp_path, capsys):
    for extra_edge in (True, False):
        prof = _write(tmp_path, _cycle_with_a_component_named_like_it(extra_edge))
        assert plan_main([prof]) == 2
        err = capsys.readouterr().err
        assert "invalid profile" in err and "components: name 'env<->policy' contains '<->'" in err
        assert "rename the component" in err and "Traceback" not in err
    # a name with '<->' that no cycle has is refused too: it reads as a cycle in every plan
    raw = _chain()
    raw["components"]["x<->y"] = raw["components"].pop("b")
    raw["edges"] = [["a", "x<->y"]]
    assert plan_main([_write(tmp_path, raw)]) == 2
    assert "name 'x<->y' contains '<->'" in capsys.readouterr().err


def test_a_work_graph_refuses_a_component_named_like_its_cycle():
    import pytest

    from loomrl.plan.graph import WorkGraph
    from loomrl.plan.profile import CycleSpec

    cyc = CycleSpec(("env", "policy"), 2)
    with pytest.raises(ValueError, match=r"\['env<->policy'\] equal a cycle node's name"):
        WorkGraph(["env", "policy", "env<->policy"], [("env", "policy")], [cyc])


def test_an_output_path_that_cannot_be_written_exits_2_before_the_search(
    tmp_path, capsys, monkeypatch
):
    import errno
    import importlib
    import os

    from loomrl.plan.cli import _unwritable

    assert _unwritable(tmp_path / "plan.json") is None and os.listdir(tmp_path) == []
    search_mod = importlib.import_module("loomrl.plan.search")

    def no_search(*a, **k):
        raise AssertionError("searched before refusing the output path")

    def denied(**kwargs):  # what a read-only directory gives (root passes os.access)
        raise PermissionError(errno.EACCES, "Permission denied")

    prof = _write(tmp_path, _chain())
    with monkeypatch.context() as m:
        m.setattr(search_mod, "search_all", no_search)
        m.setattr("tempfile.mkstemp", denied)
        for flag, name in (("--save", "plan.json"), ("--timeline", "t.png")):
            assert plan_main([prof, flag, str(tmp_path / name)]) == 2
            err = capsys.readouterr().err
            assert f"{flag} {tmp_path / name}: cannot write there (Permission denied)" in err, err
            assert "Traceback" not in err
    # A write that fails after the check (a full disk) is reported as well.
    from loomrl.plan.plan import Plan

    def full(self, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Plan, "save", full)
    assert plan_main([prof, "--save", str(tmp_path / "plan.json")]) == 2
    err = capsys.readouterr().err
    assert "--save" in err and "writing failed (No space left on device)" in err, err


def test_sigma_must_be_finite_and_at_most_the_bound(tmp_path, capsys):
    prof = _write(tmp_path, _chain())
    for sigma in ("1e308", "nan", "inf", "-inf", "5.01", "-1"):
        assert plan_main([prof, "--simulate", "--json", f"--sigma={sigma}"]) == 2, sigma
        err = capsys.readouterr().err
        assert "--sigma must be a finite log-normal spread from 0 to 5" in err, err
        assert f"got {float(sigma)!r}" in err and "Traceback" not in err
    assert plan_main([prof, "--simulate", "--json", "--sigma", "5", "--iterations", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["simulated"]["sigma"] == 5
    from loomrl.plan.cli import build_parser

    assert "0 to 5" in " ".join(build_parser().format_help().split())


def test_simulate_refuses_a_sigma_or_iterations_out_of_range():
    import pytest

    from loomrl.plan.profile import load_profile
    from loomrl.plan.search import search
    from loomrl.plan.simulate import simulate

    prof = load_profile(_chain())
    plan = search(prof)
    with pytest.raises(ValueError, match=r"sigma must be a finite .* got nan"):
        simulate(plan, prof, sigma=float("nan"))
    with pytest.raises(ValueError, match=r"iterations must be from 1 to 100,000 .* got 0"):
        simulate(plan, prof, iterations=0)


def test_json_output_never_holds_nan_or_infinity():
    from loomrl.plan.cli import json_safe

    raw = {"a": float("nan"), "b": [1.0, float("inf"), (float("-inf"), 2)], "c": "nan", "d": 3}
    assert json_safe(raw) == {"a": None, "b": [1.0, None, [None, 2]], "c": "nan", "d": 3}
    json.dumps(json_safe(raw), allow_nan=False)


def test_iterations_are_capped_and_simulation_flags_need_simulate(tmp_path, capsys):
    prof = _write(tmp_path, _chain())
    assert plan_main([prof, "--simulate", "--iterations", "100000000"]) == 2
    err = capsys.readouterr().err
    assert "--iterations must be from 1 to 100,000" in err and "100,000,000" in err
    cases = [
        (["--sigma", "1"], "--sigma applies to --simulate only; add --simulate or drop it"),
        (
            ["--iterations", "5", "--channel-capacity", "2"],
            "--iterations and --channel-capacity apply to --simulate only; add --simulate or "
            "drop them",
        ),
    ]
    for extra, message in cases:
        assert plan_main([prof, *extra]) == 2
        assert message in capsys.readouterr().err
    assert plan_main([prof, "--simulate", "--iterations", "100000", "--sigma", "0"]) == 0
    assert "simulated (100000 iterations, sigma 0)" in capsys.readouterr().out


def _run_into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """Run ``python *args`` with stdout a pipe whose reader is already gone (`... | head -0`)."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run(
            [sys.executable, *args], stdout=w, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(w)


def test_a_closed_stdout_pipe_ends_quietly():
    proc = _run_into_a_closed_pipe("-m", "loomrl.plan", str(EXAMPLES / "tiny_ppo.yaml"))
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


def test_divisors_and_the_nearest_few():
    from loomrl.plan.profile import divisors, nearest

    assert divisors(1) == [1] and divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert divisors(97) == [1, 97]
    assert all(divisors(n) == [d for d in range(1, n + 1) if n % d == 0] for n in range(1, 300))
    assert len(divisors(10**9)) == 100 and divisors(10**9)[-2:] == [5 * 10**8, 10**9]
    assert nearest([1, 2, 4, 5, 8, 10], 3, 3) == [1, 2, 4]  # 1 and 5 tie: the smaller
    assert nearest([1, 2, 4, 5, 8, 10], 9, 2) == [8, 10]


def test_a_granularity_of_a_huge_batch_lists_a_few_divisors(tmp_path, capsys):
    raw = _chain(batch=10**9, granularities=[3])
    assert plan_main([_write(tmp_path, raw)]) == 2  # a loop to 10**9 took minutes
    err = capsys.readouterr().err
    assert "granularities: 3 does not divide batch=1000000000; use a divisor of it, e.g. " in err
    assert "[1, 2, 4, 5, 8, 10, 16, 20] (100 in all)" in err
    assert plan_main([_write(tmp_path, _chain(batch=12, granularities=[5]))]) == 2
    assert "use one of [1, 2, 3, 4, 6, 12]" in capsys.readouterr().err


def test_a_cycle_lists_its_group_counts_of_a_huge_batch_at_once():
    from loomrl.plan.profile import CycleSpec

    assert CycleSpec(("a", "b"), 2, min_group=4).group_counts(36) == [1, 2, 3, 4, 6, 9]
    assert CycleSpec(("a", "b"), 2).group_counts(36, limited=False)[-1] == 36
    assert len(CycleSpec(("a", "b"), 2).group_counts(10**12)) == 169


def _ring(batch: int, b_per_item: float = 1.0, hop_s: float = 0.0) -> dict:
    """A 2-cycle a <-> b (2 steps) on one device each; split, it runs ``batch`` ring groups."""
    return {
        "devices": 2,
        "device_memory_gb": 40,
        "batch": batch,
        "components": {
            "a": {"valid_devices": [1], "time": {"per_item": {1: 1.0}}},
            "b": {"valid_devices": [1], "time": {"per_item": {1: b_per_item}}},
        },
        "edges": [["a", "b"], ["b", "a"]],
        "cycles": [{"members": ["a", "b"], "steps": 2, "hop_s": hop_s}],
    }


def _busy(intervals) -> dict:
    from loomrl.report import busy_seconds

    rows: dict = {}
    for i in intervals:
        rows.setdefault((i.component, i.kind), []).append((i.start, i.end))
    return {k: busy_seconds(v) for k, v in rows.items()}


def test_a_ring_of_many_groups_predicts_a_short_timeline(tmp_path, capsys):
    """20,000 ring groups made 80,000 intervals per returned plan; back to back, a side's calls
    are one busy stretch. Every side stays busy 2 steps x 20,000 groups x its call."""
    from loomrl.plan.profile import load_profile
    from loomrl.plan.search import search

    for b_per_item, hop in ((1.0, 0.0), (2.0, 0.5)):
        prof = load_profile(_ring(20_000, b_per_item, hop))
        plan = search(prof)
        assert plan.tree.groups == 20_000
        assert len(plan.timeline) <= 10
        busy = _busy(plan.timeline)
        assert busy[("a", "run")] == 2 * 20_000 * 1.0
        assert busy[("b", "run")] == 2 * 20_000 * b_per_item
        assert max(i.end for i in plan.timeline) == plan.predicted_s
    assert plan_main([_write(tmp_path, _ring(20_000)), "--json"]) == 0
    out = capsys.readouterr().out
    assert len(json.loads(out)["timeline"]) == 2 and len(out) < 10_000


def test_coarsen_keeps_each_rows_busy_seconds_and_end():
    from loomrl.plan.simulate import coarsen

    spans = [("a", (0, 1), 2.0 * j, 2.0 * j + 1, j, "run") for j in range(10)]
    spans += [("b", (1, 2), 2.0 * j + 1, 2.0 * j + 1.5, 0, "run") for j in range(10)]
    spans.append(("a", (0, 1), -1.0, 0.0, -1, "switch"))
    assert [(i.start, i.end) for i in coarsen(spans, 21)[:2]] == [(0, 1), (2, 3)]
    out = coarsen(spans, 8)
    assert len(out) <= 8
    assert _busy(out) == {("a", "run"): 10, ("b", "run"): 5, ("a", "switch"): 1}
    runs_a = [i for i in out if i.component == "a" and i.kind == "run"]
    assert runs_a[-1].end == 19 and {i.micro_batch for i in runs_a} == {-1}
    assert {i.micro_batch for i in out if i.component == "b"} == {0}  # one micro-batch: kept
    assert len(coarsen(spans, 1)) == 3  # one per row, at the least


def test_a_stream_of_many_micro_batches_keeps_at_most_the_limit():
    from loomrl.plan.profile import load_profile
    from loomrl.plan.search import search
    from loomrl.plan.simulate import predicted_timeline

    raw = _chain(batch=2000, granularities=[1])
    raw["components"]["a"]["time"]["alpha"] = 0.1
    prof = load_profile(raw)
    plan = search(prof, mode="spatial")
    full = predicted_timeline(plan.tree, prof, plan.micro_batch, limit=10**9)
    assert len(full) == 4000  # each component's call of each micro-batch
    short = predicted_timeline(plan.tree, prof, plan.micro_batch, limit=100)
    assert len(short) <= 100
    assert _busy(short) == pytest.approx(_busy(full), rel=1e-12)
    assert max(i.end for i in short) == max(i.end for i in full)


def test_costs_past_the_limit_are_refused_naming_the_key(tmp_path, capsys):
    """1e308 s is finite, but the search's sums and products of it overflow to inf, and a plan
    of inf seconds read as 'no plan fits (memory 10 GB, cores inf)'."""
    raw = _chain()
    raw["components"]["a"]["time"] = {"alpha": 1e308, "per_item": {1: 1e308}}
    assert plan_main([_write(tmp_path, raw)]) == 2
    err = capsys.readouterr().err
    assert "invalid profile" in err
    assert "components.a.time.alpha is 1e+308 s, past the planner's limit of 1e+100" in err
    assert "components.a.time.per_item[1] is 1e+308 s an item; on the batch of 2" in err
    assert "warning" not in err and "no plan fits" not in err
    # per_item within the limit alone, but not once times the batch
    raw = _chain(batch=10**6, granularities=[10**6])
    raw["components"]["b"]["time"]["per_item"] = {1: 1e97}
    raw["components"]["b"]["memory_gb"] = 1e200
    raw["components"]["b"]["switch_s"] = 1e101
    assert plan_main([_write(tmp_path, raw)]) == 2
    err = capsys.readouterr().err
    assert "components.b.time.per_item[1] is 1e+97 s an item; on the batch of 1000000" in err
    assert "components.b.memory_gb[1] is 1e+200 GB" in err
    assert "components.b.switch_s is 1e+101 s" in err
    raw = _chain(device_memory_gb=1e300, iteration_overhead_s=1e150)
    assert plan_main([_write(tmp_path, raw)]) == 2
    err = capsys.readouterr().err
    assert "device_memory_gb is 1e+300 GB" in err and "iteration_overhead_s is 1e+150 s" in err
    assert plan_main([_write(tmp_path, _chain(per_item=1e99))]) == 0  # 2 items: within it
    capsys.readouterr()


def test_cycle_steps_and_hops_past_the_limits_are_refused(tmp_path, capsys):
    raw = _ring(4, hop_s=1e200)
    raw["cycles"][0]["steps"] = 10**400
    raw["cycles"][0]["overlap_slowdown"] = 1e300
    raw["components"]["a"]["valid_devices"] = [0, 1]  # 0: a cycle member's host cores
    raw["components"]["a"]["time"]["per_item"][0] = 1.0
    assert plan_main([_write(tmp_path, raw)]) == 2
    err = capsys.readouterr().err
    assert "cycles[0].steps must be at most 100,000" in err and "a number of 401 digits" in err
    assert "cycles[0].hop_s is 1e+200 s" in err
    assert "cycles[0].overlap_slowdown is 1e+300," in err
    assert "only a cycle member may have" not in err  # a is one, though its cycle is refused


def test_python_m_loomrl_runs_the_loomrl_command():
    proc = subprocess.run(
        [sys.executable, "-m", "loomrl", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: loomrl") and "plan" in proc.stdout
    proc = _run_into_a_closed_pipe("-m", "loomrl", "plan", str(EXAMPLES / "tiny_ppo.yaml"))
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


def test_the_device_count_is_named_by_where_it_came_from(tmp_path, capsys):
    raw = _chain(devices=1)
    raw["components"]["b"]["valid_devices"] = [2]
    raw["components"]["b"]["time"]["per_item"] = {2: 1.0}
    prof = _write(tmp_path, raw)
    assert plan_main([prof]) == 2
    err = capsys.readouterr().err
    # the count, wherever it came from (the profile's devices here), without a flag not given
    assert "component 'b' needs at least 2 devices (valid_devices [2]), but only 1 are " in err
    assert "available (plan for more with --devices N)" in err and "--devices 1" not in err
    assert plan_main([prof, "--devices", "1"]) == 2
    assert "but only 1 are available" in capsys.readouterr().err
    cyc = _ring(4)
    cyc["components"]["b"]["valid_devices"] = [2]
    cyc["components"]["b"]["time"]["per_item"] = {2: 1.0}
    assert plan_main([_write(tmp_path, cyc)]) == 2
    assert "cycle 'a<->b' fits no layout on 2 devices" in capsys.readouterr().err


def test_the_header_names_the_mode_asked_for(tmp_path, capsys):
    prof = _write(tmp_path, _chain())
    assert plan_main([prof]) == 0
    assert re.search(r"^best plan \((temporal|spatial|hybrid)\): ", capsys.readouterr().out, re.M)
    for mode in ("spatial", "temporal"):
        assert plan_main([prof, "--mode", mode]) == 0
        out = capsys.readouterr().out
        assert f"\nfastest {mode} plan (--mode {mode}): " in out and "best plan" not in out
    assert plan_main([prof, "--mode", "spatial", "--exhaustive"]) == 0
    assert "fastest spatial plan (--mode spatial, exhaustive search): " in capsys.readouterr().out


def test_output_paths_in_missing_folders_are_written_there_and_bad_ones_refused_first(
    tmp_path, capsys, monkeypatch
):
    """Like loomrl report --out, --save and --timeline make the folders that do not exist yet;
    a path under a file, or under a folder that cannot be written, is refused before the
    search, and no folder is made for it."""
    import errno
    import importlib

    prof = _write(tmp_path, _chain())
    save, png = tmp_path / "a" / "b" / "plan.json", tmp_path / "c" / "t.png"
    assert plan_main([prof, "--save", str(save), "--timeline", str(png)]) == 0
    assert json.loads(save.read_text())["mode"] and png.read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()

    search_mod = importlib.import_module("loomrl.plan.search")

    def no_search(*a, **k):
        raise AssertionError("searched before refusing the output path")

    (tmp_path / "afile").write_text("x")
    with monkeypatch.context() as m:
        m.setattr(search_mod, "search_all", no_search)
        for flag, name in (("--save", "plan.json"), ("--timeline", "t.png")):
            bad = tmp_path / "afile" / "sub" / name
            assert plan_main([prof, flag, str(bad)]) == 2
            err = capsys.readouterr().err
            assert f"{flag} {bad}: {str(tmp_path / 'afile')!r} is a file, not a directory" in err

        def denied(**kwargs):  # what a read-only directory gives (root passes os.access)
            raise PermissionError(errno.EACCES, "Permission denied")

        m.setattr("tempfile.mkstemp", denied)
        new = tmp_path / "new" / "plan.json"
        assert plan_main([prof, "--save", str(new)]) == 2
        assert "cannot write there (Permission denied)" in capsys.readouterr().err
        assert not (tmp_path / "new").exists()
