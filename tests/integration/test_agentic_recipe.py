"""The agentic_search recipe end to end through the CLI on a tiny model, and its config errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loomrl.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_tiny_search_run_writes_its_summary_and_agent_metrics(cluster, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(
        [
            "run",
            str(ROOT / "examples/tiny_search.yaml"),
            "placement=temporal",
            # Costs from a file, not profiled (20 of this test's s on 2 cores): tiny GRPO's,
            # whose components (rollout, reward, actor) and tiny model are this recipe's.
            f"run.profile={ROOT / 'examples/profiles/tiny_grpo.yaml'}",
            "steps=2",
            "agent.tool_groups=auto",
            f"output_dir={out}",
        ]
    )
    assert rc == 0
    s = json.loads((out / "run_summary.json").read_text())
    assert s["steps"] == 2 and s["plan"]["mode"] == "temporal"
    # tool_groups auto: probed before planning, chosen by the planner, recorded.
    choice = json.loads((out / "tool_plan.json").read_text())
    tg = s["tool_groups"]
    assert tg["source"] == "auto" and tg["probe_rows"] == choice["rows"] == 4
    assert tg["probe_reused"] is False
    assert set(choice["predicted_s"]) == {"1", "2", "4"}  # 4 rows a call: groups of 4, 2, 1
    # Each rollout rank planned k for the rows its calls got; the last step used one of those.
    assert tg["by_rows"] and tg["groups"] in tg["by_rows"].values()
    assert s["metrics"]["tool_groups"] == tg["groups"]
    assert "tool_groups auto: k=" in capsys.readouterr().err
    assert set(s["plan"]["assignment"]) == {"rollout", "reward", "actor"}
    m = s["metrics"]
    for key in (
        "searches",
        "tool_failures",
        "answered",
        "reward_mean",
        "eval_accuracy",
        "time/tool_wait",
        "eval/time/tool_wait",  # evaluation's searches, apart from training's
        "eval/tool_groups",
        "eval_accuracy/hops1",  # tiny_search asks questions of one and two hops
        "eval_accuracy/hops2",
    ):
        assert key in m, key
    assert m["tool_failures"] == 0.0 and 0.0 <= m["eval_accuracy"] <= 1.0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("tokens" in r for r in rows)
    # Step 0 is the evaluation before training: its rollout calls count there, not in step 1.
    assert rows[0]["step"] == 0 and "eval/tool_groups" in rows[0] and "tool_groups" not in rows[0]

    # The trained actor, exported as a Hugging Face directory, is the run's final parameters.
    from loomrl.engines import EngineConfig, HFEngine

    hf = tmp_path / "hf"
    assert main(["export", str(out), str(hf)]) == 0
    assert (
        HFEngine(EngineConfig(model=str(hf), trainable=False)).param_sha256() == s["param_sha256"]
    )
    assert main(["export", str(out), str(hf)]) == 2  # not over an existing export
    assert main(["export", str(out), str(tmp_path / "x"), "--step", "7"]) == 2
    assert main(["export", str(tmp_path), str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert "exists and is not empty" in err and "at step 7 (steps saved: [2])" in err
    assert "has no config.yaml" in err

    # A resumed run keeps the probe it started with: a new one's timings could choose another
    # k, and k changes what is sampled. (It resumes on a plan of one device per component:
    # the probe's reuse does not depend on the plan, and three workers start, not six.)
    from _tiny_grpo import save_one_device_plan

    one = save_one_device_plan(tmp_path / "one_device.json", out / "profile.json")
    probe = (out / "tool_plan.json").read_text()
    assert main(["resume", str(out), "steps=3", f"placement={one}"]) == 0
    s = json.loads((out / "run_summary.json").read_text())
    assert s["steps"] == 3 and s["tool_groups"]["probe_reused"] is True
    assert (out / "tool_plan.json").read_text() == probe
    assert "the probe of" in capsys.readouterr().err


def test_config_mistakes_are_reported_together(tmp_path, capsys):
    rc = main(
        [
            "run",
            str(ROOT / "examples/tiny_search.yaml"),
            "agent.max_turns=0",
            "agent.tool_timeout_s=-1",
            "agent.top_kk=3",
            "agent.tool_groups=0",
            "task.name=arithmetic",
            f"output_dir={tmp_path}",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert "max_turns: must be >= 1" in err and "tool_timeout_s" in err
    assert "top_kk" in err and "top_k" in err  # unknown key, with the close match
    assert "tool_groups: must be >= 1 or 'auto'" in err
