"""``loomrl plan`` through plan_main: output, JSON fields, exit status 2 with a message."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_json_fields(capsys):
    assert plan_main([str(EXAMPLES / "ppo_actor_critic.yaml"), "--devices", "16", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("predicted_s", "micro_batch", "tree", "assignment", "modes", "search_s"):
        assert key in d
    assert d["tree"]["op"] == "spatial"
    assert set(d["modes"]) == {"temporal", "spatial", "hybrid"}
    assert d["devices"] == 16


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
