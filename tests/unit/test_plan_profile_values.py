"""Profile values the loader must refuse (NaN, inf, bools, strings, fractional device counts,
counts past the limit) and keys it must ask for, each said once with its key path."""

from __future__ import annotations

import copy
import math
import warnings

import pytest

import loomrl.plan.profile as profile_mod
from loomrl.errors import ConfigError
from loomrl.plan import MAX_DEVICES, load_profile

BASE = {
    "devices": 4,
    "device_memory_gb": 80,
    "batch": 8,
    "granularities": [1, 2, 4, 8],
    "components": {
        "a": {
            "valid_devices": [1, 2],
            "time": {"alpha": 0.1, "per_item": {1: 1.0, 2: 0.6}},
            "memory_gb": 10,
            "switch_s": 0.5,
        },
        "b": {
            "valid_devices": [1, 2],
            "time": {"alpha": 0.1, "per_item": {1: 1.0, 2: 0.6}},
            "memory_gb": {1: 10, 2: 8},
            "switch_s": 0.5,
        },
    },
    "edges": [["a", "b"]],
}


def _with(path: str, value):
    """BASE with the value at a dotted key path ("components.a.time.alpha") replaced."""
    raw = copy.deepcopy(BASE)
    *parents, last = (int(k) if k.isdigit() else k for k in path.split("."))
    node = raw
    for k in parents:
        node = node[k]
    node[last] = value
    return raw


def _problems(raw) -> list[str]:
    with warnings.catch_warnings():
        # numpy's RuntimeWarning on a NaN cost was the old symptom: an error now, never a warning
        warnings.simplefilter("error")
        with pytest.raises(ConfigError) as ei:
            load_profile(raw)
    return ei.value.problems


BAD_NUMBERS = [
    ("components.a.time.alpha", math.nan, "finite"),
    ("components.a.time.alpha", math.inf, "finite"),
    ("components.a.time.alpha", True, "a bool"),
    ("components.a.time.alpha", "fast", "a string"),
    ("components.a.time.alpha", "inf", "finite"),
    ("components.a.time.item_cv", math.nan, "finite"),
    ("components.a.switch_s", math.nan, "finite"),
    ("components.a.switch_s", True, "a bool"),
    ("components.a.switch_s", math.inf, "finite"),
    ("components.a.memory_gb", math.inf, "finite"),
    ("components.b.memory_gb.1", math.nan, "finite"),
    ("components.b.memory_gb.1", False, "a bool"),
    ("device_memory_gb", math.nan, "finite"),
    ("device_memory_gb", math.inf, "finite"),
    ("iteration_overhead_s", math.inf, "finite"),
    ("iteration_overhead_s", True, "a bool"),
]


@pytest.mark.parametrize("path, value, said", BAD_NUMBERS)
def test_a_number_that_is_not_finite_or_not_a_number_is_refused_naming_its_key(path, value, said):
    problems = _problems(_with(path, value))
    assert len(problems) == 1, problems
    key = path.replace(".1", "[1]") if path.endswith(".1") else path
    assert problems[0].startswith(key) and "must be a number" in problems[0], problems
    assert said in problems[0] and repr(value) in problems[0], problems


def test_numbers_yaml_reads_as_text_are_numbers_as_in_configs(tmp_path):
    # PyYAML (YAML 1.1) reads 1e-3, without a dot, as a string
    f = tmp_path / "p.yaml"
    f.write_text(
        "devices: 2\ndevice_memory_gb: 80\nbatch: 8\ncomponents:\n  a:\n"
        "    valid_devices: [1, 2]\n    time: {alpha: 1e-3, per_item: {1: 2e-2, 2: 1e-2}}\n"
    )
    comp = load_profile(f).components["a"]
    assert comp.alpha == pytest.approx(1e-3) and comp.per_item[2] == pytest.approx(1e-2)


@pytest.mark.parametrize("value", [math.nan, math.inf, True, "nan", -1.0])
def test_per_item_values_must_be_finite_numbers(value):
    raw = copy.deepcopy(BASE)
    raw["components"]["a"]["time"]["per_item"] = {1: value, 2: 0.6}
    (problem,) = _problems(raw)
    assert problem.startswith("components.a.time.per_item[1] must be a number of seconds >= 0")
    assert f"got {value!r}" in problem


def test_a_device_count_key_must_be_whole():
    raw = copy.deepcopy(BASE)
    raw["components"]["a"]["time"]["per_item"] = {1.5: 1.0, 2: 0.6}
    problems = _problems(raw)
    assert any(
        "components.a.time.per_item has key 1.5, which is not a device count" in p for p in problems
    ), problems
    # String keys of whole numbers are what JSON writes: those are counts
    raw["components"]["a"]["time"]["per_item"] = {"1": 1.0, "2": 0.6}
    assert load_profile(raw).components["a"].per_item == {1: 1.0, 2: 0.6}


@pytest.mark.parametrize(
    "value, said", [(-3, "got -3"), (1.5, "got 1.5"), (True, "a bool"), (math.nan, "got nan")]
)
def test_cpu_cores_must_be_whole_and_not_negative(value, said):
    raw = _with("components.a.cpu_cores", value)
    (problem,) = _problems(raw)
    assert problem.startswith("components.a.cpu_cores must be a whole number of CPU cores >= 0")
    assert said in problem
    raw = _with("components.a.cpu_cores", {1: value, 2: 1})
    (problem,) = _problems(raw)
    assert problem.startswith("components.a.cpu_cores[1] must be a whole number of CPU cores")


def test_cycle_numbers_must_be_finite():
    raw = copy.deepcopy(BASE)
    raw["edges"] = [["a", "b"], ["b", "a"]]
    raw["cycles"] = [{"members": ["a", "b"], "steps": 2, "overlap_slowdown": math.inf}]
    (problem,) = _problems(raw)
    assert problem.startswith("cycles[0].overlap_slowdown must be a number >= 1 and finite")


def test_samples_are_checked_row_by_row():
    raw = copy.deepcopy(BASE)
    comp = raw["components"]["a"]
    del comp["time"]
    comp["samples"] = [[1, 4, 1.0, 10], [1.5, 4, 1.0, 10], [2, 4, math.nan, 8], [2, 0, 1.0, 8]]
    problems = _problems(raw)
    assert len(problems) == 3, problems
    assert problems[0].startswith("components.a.samples[1] n_devices must be a whole number")
    assert problems[1].startswith("components.a.samples[2] seconds must be a number of seconds")
    assert problems[2].startswith("components.a.samples[3] items must be a number > 0")


def test_every_problem_of_a_profile_is_reported_at_once():
    raw = copy.deepcopy(BASE)
    raw["components"]["a"]["time"]["alpha"] = math.nan
    raw["components"]["a"]["switch_s"] = True
    raw["components"]["b"]["time"]["per_item"][2] = math.inf
    raw["device_memory_gb"] = math.nan
    assert len(_problems(raw)) == 4


def test_a_missing_time_or_per_item_is_an_error_naming_the_key():
    raw = copy.deepcopy(BASE)
    del raw["components"]["a"]["time"]
    (problem,) = _problems(raw)
    assert problem.startswith("components.a: missing required key 'time'")
    raw = copy.deepcopy(BASE)
    del raw["components"]["a"]["time"]["per_item"]
    (problem,) = _problems(raw)
    assert problem.startswith("components.a.time: missing required key 'per_item'")


def test_a_missing_alpha_or_memory_is_zero_as_documented_and_fitted_from_samples():
    raw = copy.deepcopy(BASE)
    del raw["components"]["a"]["time"]["alpha"]
    del raw["components"]["a"]["memory_gb"]
    a = load_profile(raw).components["a"]
    assert a.alpha == 0.0 and a.memory_gb == {1: 0.0, 2: 0.0}
    assert "``time.alpha`` 0" in profile_mod.__doc__ and "``memory_gb`` 0" in profile_mod.__doc__
    # With samples, what the profile leaves out comes from their fit, not from 0.
    raw["components"]["a"]["time"]["alpha"] = 0.1
    raw["components"]["a"]["samples"] = [
        [n, x, 0.5 + x * 2.0 / n, 4 + 8 / n] for n in (1, 2) for x in (1, 4)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = load_profile(raw).components["a"]
    assert a.alpha == pytest.approx(0.1)  # stated: kept
    assert a.memory_gb == {1: pytest.approx(12.0), 2: pytest.approx(8.0)}
    # The fit's alpha goes with its own per_item, never beside per-item costs measured apart.
    del raw["components"]["a"]["time"]["alpha"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert load_profile(raw).components["a"].alpha == 0.0
        del raw["components"]["a"]["time"]["per_item"]
        a = load_profile(raw).components["a"]
    assert a.alpha == pytest.approx(0.5) and a.per_item[1] == pytest.approx(2.0)
    # A device's memory under 1 GB is memory (a CPU slot's share of a small host)
    raw["device_memory_gb"] = 0.5
    raw["components"]["a"]["memory_gb"] = 0.25
    assert load_profile(raw).device_memory_gb == 0.5


@pytest.mark.parametrize("key", ["device_memory_gb", "devices", "batch"])
def test_a_missing_top_level_key_is_said_once(key):
    raw = copy.deepcopy(BASE)
    del raw[key]
    (problem,) = _problems(raw)
    assert problem.startswith(f"missing required key {key!r}")


def test_missing_components_is_said_once_not_as_unknown_edge_names():
    raw = copy.deepcopy(BASE)
    del raw["components"]
    (problem,) = _problems(raw)
    assert problem.startswith("missing required key 'components'")
    raw["components"] = ["a", "b"]
    (problem,) = _problems(raw)
    assert problem.startswith("components must be a non-empty mapping")


@pytest.mark.parametrize("devices", [MAX_DEVICES + 1, 10**12, 99999999999999999999])
def test_device_counts_past_the_limit_are_refused(devices):
    with pytest.raises(ConfigError, match=r"devices must be a whole number .* to 1,000,000"):
        load_profile(copy.deepcopy(BASE), devices=devices)
    raw = copy.deepcopy(BASE)
    raw["components"]["a"]["valid_devices"] = [1, devices]
    raw["components"]["a"]["time"]["per_item"][devices] = 0.1
    with pytest.raises(ConfigError, match=r"components\.a\.valid_devices .* 1 to 1,000,000"):
        load_profile(raw)
    assert load_profile(copy.deepcopy(BASE), devices=MAX_DEVICES).devices == MAX_DEVICES


def test_a_cycle_of_one_component_twice_says_its_members_must_differ():
    raw = copy.deepcopy(BASE)
    raw["cycles"] = [{"members": ["a", "a"], "steps": 2}]
    (problem,) = _problems(raw)
    assert problem.startswith("cycles[0].members names 'a' twice")
    assert "two members must be different components" in problem


def test_a_search_for_more_devices_than_the_limit_is_refused():
    from loomrl.plan import search_all

    prof = load_profile(copy.deepcopy(BASE))
    with pytest.raises(ConfigError, match=r"devices must be a whole number .* 1,000,000"):
        search_all(prof, devices=10**12)


def test_edges_and_cycles_must_be_lists():
    problems = _problems({**_with("edges", 5), "cycles": 5})
    assert "edges must be a list [[source, destination], ...], got 5" in problems
    assert any(p.startswith("cycles must be a list") for p in problems)


def test_a_profile_path_that_is_a_directory_or_not_utf8_is_said(tmp_path):
    with pytest.raises(ConfigError, match="is a directory; name a YAML or JSON file"):
        load_profile(tmp_path)
    bad = tmp_path / "p.yaml"
    bad.write_bytes(b"devices: 4\n\xff\n")
    with pytest.raises(ConfigError, match=r"p.yaml:2 is not UTF-8 text \(byte 0xff\)"):
        load_profile(bad)


def test_host_only_count_needs_its_own_costs_beside_samples():
    """Samples (n >= 1) fit a scaling in devices; they cannot give count 0's cost."""
    raw = _with(
        "components.a", {"valid_devices": [0, 1], "samples": [[1, 4, 1.0, 1], [1, 8, 2.0, 1]]}
    )
    raw["edges"], raw["cycles"] = [], [{"members": ["a", "b"], "steps": 2}]  # 0: a cycle member
    assert _problems(raw) == [
        "components.a: valid device count 0 (host cores only) needs its own time.per_item[0] "
        "and memory_gb[0]; samples (n_devices >= 1) cannot give them"
    ]
    a = raw["components"]["a"]
    a["time"], a["memory_gb"] = {"per_item": {0: 0.3}}, {0: 0.0}
    comp = load_profile(raw).components["a"]
    assert comp.per_item[0] == 0.3 and comp.per_item[1] == pytest.approx(0.25)
