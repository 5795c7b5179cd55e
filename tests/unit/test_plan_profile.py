"""Profile loading, validation (all problems at once) and fitting."""

from __future__ import annotations

import json
import warnings

import pytest

from loomrl.errors import ConfigError
from loomrl.plan import fit_component, fit_profile, load_profile
from loomrl.plan.profile import count_ranges


def base(**over):
    raw = {
        "devices": 4,
        "device_memory_gb": 80,
        "batch": 8,
        "granularities": [1, 2, 4, 8],
        "components": {
            "a": {
                "valid_devices": [1, 2],
                "time": {"alpha": 1.0, "per_item": {1: 2.0, 2: 1.0}},
                "memory_gb": 10,
            },
            "b": {
                "valid_devices": [1, 2],
                "time": {"alpha": 0.0, "per_item": {1: 1.0, 2: 0.5}},
                "memory_gb": {1: 20, 2: 12},
            },
        },
        "edges": [["a", "b"]],
    }
    raw.update(over)
    return raw


def test_load_dict_yaml_and_json(tmp_path):
    p = load_profile(base())
    assert p.components["a"].time(2, 4) == pytest.approx(5.0)
    assert p.components["a"].memory_gb == {1: 10.0, 2: 10.0}
    y = tmp_path / "p.yaml"
    import yaml

    y.write_text(yaml.safe_dump(base()))
    j = tmp_path / "p.json"
    j.write_text(json.dumps(base()))
    assert load_profile(y) == p
    assert load_profile(j).components == p.components
    assert load_profile(base(), devices=2).devices == 2


def test_a_key_given_twice_in_a_profile_or_plan_file_is_refused_naming_it(tmp_path):
    import yaml

    from loomrl.errors import PlanError
    from loomrl.plan import search

    text = yaml.safe_dump(base(), sort_keys=False)
    y = tmp_path / "p.yaml"
    y.write_text(text.replace("batch: 8\n", "batch: 8\nbatch: 4\n"))
    with pytest.raises(ConfigError) as e:
        load_profile(y)
    assert e.value.problems == [
        "duplicate key 'batch' on lines 3 and 4 \u2014 a key may be given once per mapping "
        "(YAML and JSON readers would silently keep the last); remove one of them"
    ]
    j = tmp_path / "p.json"
    j.write_text(json.dumps(base()).replace('"batch": 8', '"batch": 8, "batch": 4'))
    with pytest.raises(ConfigError, match=r"duplicate key 'batch' on line 1 \(columns 40 and 52\)"):
        load_profile(j)
    saved = tmp_path / "plan.json"
    search(load_profile(base())).save(saved)
    saved.write_text(saved.read_text().replace("{", '{"micro_batch": 3, ', 1))
    with pytest.raises(PlanError, match="duplicate key 'micro_batch' on lines 1 and 3 \u2014"):
        type(search(load_profile(base()))).load(saved)
    saved_yaml = tmp_path / "plan.yaml"
    search(load_profile(base())).save(saved_yaml)
    saved_yaml.write_text("micro_batch: 3\n" + saved_yaml.read_text())
    with pytest.raises(PlanError, match="duplicate key 'micro_batch' on lines 1 and"):
        type(search(load_profile(base()))).load(saved_yaml)


def test_all_problems_reported_together_with_did_you_mean():
    raw = base(granularites=[1], granularities=[3, 4])
    raw["components"]["a"]["swich_s"] = 1
    raw["components"]["b"]["valid_devices"] = [1, 2, 4]
    raw["edges"] = [["a", "bb"]]
    with pytest.raises(ConfigError) as ei:
        load_profile(raw)
    problems = ei.value.problems
    text = "\n".join(problems)
    assert len(problems) == 6, text
    assert "did you mean 'granularities'" in text
    assert "did you mean 'switch_s'" in text
    assert "3 does not divide batch=8" in text
    assert "no cost for valid device count(s) [4]" in text
    assert "unknown component 'bb'; did you mean 'b'" in text


def test_undeclared_cycle_is_an_error_and_declared_one_is_fine():
    raw = base(edges=[["a", "b"], ["b", "a"]])
    with pytest.raises(ConfigError, match="cycle among \\['a', 'b'\\] that is not declared"):
        load_profile(raw)
    raw["cycles"] = [{"members": ["a", "b"], "steps": 3}]
    p = load_profile(raw)
    assert p.cycles[0].steps == 3 and p.cycles[0].name == "a<->b"


def test_missing_cost_is_fitted_from_samples():
    raw = base()
    comp = raw["components"]["b"]
    comp["valid_devices"] = [1, 2, 4]
    comp["time"] = {}
    comp["memory_gb"] = {}
    # exact data of t = 0.5 + x * 2 / n, memory = 4 + 8 / n
    comp["samples"] = [[n, x, 0.5 + x * 2.0 / n, 4 + 8 / n] for n in (1, 2) for x in (1, 4, 16)]
    p = load_profile(raw)
    b = p.components["b"]
    assert b.alpha == pytest.approx(0.5, abs=1e-9)
    assert b.per_item[4] == pytest.approx(0.5, rel=1e-6)  # power law n^-1 extrapolated
    assert b.memory_gb[4] == pytest.approx(6.0, rel=1e-6)
    assert p.fit_reports[0].rel_err_max < 1e-9


def test_fit_component_reports_error_and_warns_far_extrapolation():
    samples = [
        ("gen", n, x, 1.0 + x * 3.0 * n**-0.8 * (1.02 if x == 8 else 1.0), 10.0 + 20 / n)
        for n in (1, 2, 4)
        for x in (2, 8)
    ]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        comp, rep = fit_component(samples, valid_devices=[1, 2, 4, 8, 64])
    assert any("more than 8x" in str(x.message) for x in w)
    assert rep.extrapolated_devices == (8, 64)
    assert 0 < rep.rel_err_max < 0.05
    assert rep.exponent == pytest.approx(0.8, abs=0.05)
    assert comp.per_item[8] < comp.per_item[4]
    assert "poor fit" not in str(rep)
    # samples the model cannot follow (times that jump around): the report says so
    noisy = [(c, n, x, t * (5.0 if (n * x) % 3 == 2 else 0.2), m) for c, n, x, t, m in samples]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, bad = fit_component(noisy, valid_devices=[1, 2, 4])
    assert bad.rel_err_mean > 0.25 and "a poor fit" in str(bad)


def test_count_ranges_and_report_name_many_counts_briefly():
    assert count_ranges([9, 3, 5, 6, 7]) == "3, 5-7, 9"
    assert count_ranges([4]) == "4" and count_ranges([]) == "none"
    samples = [("gen", n, x, 1.0 + x / n, 10.0) for n in (1, 2, 4) for x in (2, 8)]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _, rep = fit_component(samples, valid_devices=list(range(1, 1025)))
    assert "extrapolated to 3, 5-1024" in str(rep)
    assert any("n = 33-1024, more than 8x" in str(x.message) for x in w)


def test_fit_profile_builds_a_valid_profile():
    samples = [
        (c, n, x, a + x * s / n, 5.0)
        for c, a, s in (("a", 0.1, 1.0), ("b", 0.2, 2.0))
        for n in (1, 2)
        for x in (1, 3)
    ]
    p = fit_profile(
        samples,
        devices=2,
        device_memory_gb=40,
        batch=4,
        granularities=[1, 2, 4],
        edges=[("a", "b")],
    )
    assert set(p.components) == {"a", "b"}
    assert p.components["b"].time(2, 3) == pytest.approx(0.2 + 3.0)
    assert len(p.fit_reports) == 2
    # A cycle given as a CycleSpec keeps every field, not only its members and steps.
    from loomrl.plan.profile import CycleSpec

    spec = CycleSpec(("a", "b"), 3, overlap_slowdown=1.2, hop_s=0.5, min_group=2)
    q = fit_profile(samples, 2, 40, 4, [1, 2, 4], edges=[("a", "b"), ("b", "a")], cycles=[spec])
    assert q.cycles == (spec,)


def test_item_cv_adds_the_slowest_ranks_excess_and_zero_is_the_baseline():
    raw = base()
    raw["components"]["a"]["time"]["item_cv"] = 0.5
    prof = load_profile(raw)
    a, b = prof.components["a"], prof.components["b"]
    assert b.time(2, 8) == 0.0 + 8 * 0.5  # no item_cv: the baseline formula exactly
    assert a.time(1, 8) == 1.0 + 8 * 2.0  # one device: no other rank to wait for
    # Two ranks of 4 items: the slower exceeds the mean by cv * sqrt(4) * e(2) item costs.
    from loomrl.plan.profile import expected_max_normal

    excess = 0.5 * 1.0 * (8 * 2) ** 0.5 * expected_max_normal(2)
    assert a.time(2, 8) == pytest.approx(1.0 + 8 * 1.0 + excess)
    # The excess shrinks relative to the work as shares grow.
    rel = [(a.time(2, x) - 1.0) / (x * 1.0) - 1 for x in (2, 8, 64)]
    assert rel[0] > rel[1] > rel[2] > 0
    assert load_profile(prof.to_dict()).components["a"].item_cv == 0.5
    assert "item_cv" not in prof.to_dict()["components"]["b"]["time"]


def test_expected_max_normal_matches_known_values():
    from loomrl.plan.profile import expected_max_normal

    assert expected_max_normal(1) == 0.0
    # Exact: 0.5642 (k=2), 1.0294 (k=4), 1.5388 (k=10); Blom's approximation is within 0.03.
    for k, exact in ((2, 0.5642), (4, 1.0294), (10, 1.5388)):
        assert abs(expected_max_normal(k) - exact) < 0.03


def test_negative_item_cv_is_refused_with_the_key():
    raw = base()
    raw["components"]["a"]["time"]["item_cv"] = -1
    with pytest.raises(ConfigError, match=r"components\.a\.time\.item_cv"):
        load_profile(raw)
