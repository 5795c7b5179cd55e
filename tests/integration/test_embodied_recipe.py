"""The embodied PPO recipe end to end (tiny settings), its plan mapping and its refusals."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from loomrl.cycle import (
    CyclePlacement,
    best_split_plan,
    check_cores,
    cycle_profile,
    placement_from_plan,
    split_plans,
)
from loomrl.errors import ConfigError, PlacementError, PlanError
from loomrl.worker import Worker

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/ppo_inverted_pendulum.yaml"
TINY = [
    "run.steps=2",
    "env.num_envs=4",
    "env.cpu_cores=0.5",
    "ppo.rollout_steps=64",
    "ppo.num_minibatches=4",
    "ppo.epochs=2",
    "target_return=null",
    "probe_reps=2",
    "run.progress=false",
]


def _costs(env_s: float = 1e-3, pol_s: float = 1e-3) -> dict:
    """Synthetic measurements: t = 1 ms + 0.1 ms per env for both sides."""
    return {
        "samples": {
            "env": [(x, env_s + 1e-4 * x) for x in (1, 2, 4)],
            "policy": [(x, pol_s + 1e-4 * x) for x in (1, 2, 4)],
        },
        "update_s": 0.5,
    }


@pytest.fixture(scope="module")
def auto_run(cluster, tmp_path_factory):
    """One CLI run with placement=auto and a wide trial margin, read by the tests of the CLI run
    and of the trials (measuring and trying plans is most of a run's time): its directory and
    what it said on stderr."""
    import contextlib
    import io

    from loomrl.cli import main as cli

    out = tmp_path_factory.mktemp("auto") / "run"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli(
            [
                "run",
                str(EXAMPLE),
                *TINY,
                "run.placement=auto",
                "auto_trial_steps=4",
                "auto_trial_margin=1000",
                f"run.output_dir={out}",
            ]
        )
    assert rc == 0, err.getvalue()
    return out, err.getvalue()


def test_cli_runs_two_iterations_and_writes_the_summary(auto_run):
    out, _ = auto_run
    s = json.loads((out / "run_summary.json").read_text())
    assert s["status"] == "finished" and s["steps"] == s["steps_done"] == 2
    assert len(s["iteration_s"]) == 2
    assert "episode_return" in s["metrics"] and s["metrics"]["env_steps"] == 128
    assert s["plan"]["mode"] in ("temporal", "hybrid", "spatial")
    assert s["predicted_iteration_s"] > 0 and s["measured_iteration_s"] > 0
    assert s["planning_s"] > 0  # measuring, searching and trials, before the first iteration
    assert len(s["param_sha256"]) == 64
    # cycle_handoff auto on a one-node cluster: replies and actions over sockets
    assert s["cycle_handoff"] == "pipe"
    trials = json.loads((out / "trials.json").read_text())["trials"]
    assert trials and all(t["handoff"] == "pipe" for t in trials)
    assert s["policy_cuda_graphs"] == {  # CPU: neither act nor the PPO step is recorded
        "enabled": False,
        "captures": 0,
        "failed": None,
        "update_captures": 0,
        "update_failed": None,
    }
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    logged = [json.loads(x) for x in lines]
    # every env step needs at least one policy call (ready ring groups are served together)
    assert all(m["policy_calls"] >= 16 for m in logged), logged  # S = 64 / 4 steps
    assert [m["policy_graph_captures"] for m in logged] == [0, 0]  # none on CPU
    assert (out / "plan.json").exists() and (out / "profile.json").exists()
    assert (out / "plots" / "episode_return.png").exists()
    # The probe's costs, and what each cycle model says of the plan that ran.
    costs = json.loads((out / "cycle_costs.json").read_text())
    assert {"env", "policy", "both"} <= set(costs["samples"]) and costs["update_s"] > 0
    # the cycle runs over a pipe: the probe timed pipe rollouts at its sizes too
    assert costs["handoff"] == "pipe"
    assert {x for x, _ in costs["samples"]["pipe"]} == {x for x, _ in costs["samples"]["env"]}
    trials = json.loads((out / "trials.json").read_text())
    assert costs["model_s"] == pytest.approx(trials["trials"][trials["chosen"]]["predicted_s"])
    # cycle_model auto: chained, on a pipe cycle priced from its pipe rollouts.
    assert costs["model_s"] == pytest.approx(costs["model_chained_s"])
    assert costs["model_split_hops_s"] > 0 and costs["model_fixed_hops_s"] > 0


def test_same_weights_under_every_placement(cluster, tmp_path):
    """Co-located or split, 1 or k ring groups: the trajectories, hence the weights, are equal."""
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config, main

    out = {}
    for placement, groups, handoff in (
        ("temporal", None, "auto"),
        ("hybrid", 4, "direct"),
        ("hybrid", 2, "driver"),
    ):
        key = f"{placement}{groups or ''}"
        extra = [
            f"run.placement={placement}",
            f"cycle_handoff={handoff}",
            f"run.output_dir={tmp_path / key}",
            f"run.profile={ROOT / 'examples/profiles/embodied_pixels_cpu2.yaml'}",  # no probing
        ]
        if groups:
            extra.append(f"groups={groups}")
        out[key] = main(load_config(Config, EXAMPLE, [*TINY, *extra]))
    t, h, d = out["temporal"], out["hybrid4"], out["hybrid2"]
    assert t["placement"]["colocated"] and not h["placement"]["colocated"]
    assert h["placement"]["groups"] == 4 and d["placement"]["groups"] == 2
    assert (t["cycle_handoff"], h["cycle_handoff"], d["cycle_handoff"]) == (
        "pipe",
        "direct",
        "driver",
    )
    for other in (h, d):
        assert t["param_sha256"] == other["param_sha256"]
        assert t["metrics"]["episode_return"] == other["metrics"]["episode_return"]


def test_same_weights_under_every_placement_with_pixels(cluster, tmp_path, capfd):
    """With pixels drawn in one pass per env worker, each env in its own cell: two env workers
    whose groups are slices of both (k = 2), or one group (k = 1), see the same frames, so the
    weights are equal."""
    from loomrl.config import load_config
    from loomrl.envs import probe_rendering
    from loomrl.recipes.embodied_ppo import Config, main

    if (why := probe_rendering("egl", timeout_s=60)) is not None:
        pytest.skip(f"headless EGL rendering unavailable: {why}")
    pixels = [
        "env.pixels=true",
        # 64x64: at 16x16 a frame drawn in another cell rounds too few pixels differently for
        # two iterations to show it
        "env.image_size=64",
        "policy_kwargs.channels=[4,8,8]",
        "policy_kwargs.feature_dim=16",
        f"run.profile={ROOT / 'examples/profiles/embodied_pixels_cpu2.yaml'}",  # no probing
    ]
    out = {}
    for placement, groups in (("temporal", None), ("hybrid", 2)):
        extra = [f"run.placement={placement}", f"run.output_dir={tmp_path / placement}"]
        if groups:
            extra.append(f"groups={groups}")
        out[placement] = main(load_config(Config, EXAMPLE, [*TINY, *pixels, *extra]))
    t, h = out["temporal"], out["hybrid"]
    assert t["placement"]["groups"] == 1 and h["placement"]["groups"] == 2
    assert t["param_sha256"] == h["param_sha256"]
    assert "pixels: drawn in one pass per env worker" in capfd.readouterr().err


def test_plan_from_a_profile_file_skips_measuring(cluster, tmp_path):
    from loomrl.cli import main as cli
    from loomrl.plan import load_profile, search_all

    prof = ROOT / "examples/profiles/embodied_cycle_gpu_sim.yaml"
    out = tmp_path / "run"
    assert cli(["run", str(EXAMPLE), *TINY, f"run.profile={prof}", f"run.output_dir={out}"]) == 0
    s = json.loads((out / "run_summary.json").read_text())
    want = search_all(load_profile(prof, devices=cluster.num_devices))["best"]
    assert s["plan"]["assignment"] == {k: list(v) for k, v in want.assignment().items()}
    assert s["predicted_iteration_s"] == pytest.approx(want.predicted_s)
    assert s["placement"]["env_devices"] == want.assignment()["env"]


def test_pinned_plan_file_with_too_many_env_cores_is_refused(cluster, tmp_path):
    """4 env workers x 1 core on a node with 2 CPUs: refused before any worker starts."""
    from loomrl.cli import main as cli
    from loomrl.plan import cycle, fixed_plan, leaf, temporal

    prof = cycle_profile(
        _costs(), num_envs=4, steps=16, devices=4, env_cores=1, cpu_cores_per_node=None
    )
    plan = fixed_plan(prof, temporal(cycle("env", "policy", 4, used=4), leaf("actor_train", 1)), 4)
    path = tmp_path / "plan.json"
    plan.save(path)
    with pytest.raises(PlacementError, match=r"4 env worker\(s\).*4 cores, but the node has 2"):
        from loomrl.config import load_config
        from loomrl.recipes.embodied_ppo import Config, main

        main(
            load_config(
                Config,
                EXAMPLE,
                [
                    *TINY[:-1],
                    "env.cpu_cores=1",
                    f"run.placement={path}",
                    f"run.output_dir={tmp_path / 'r'}",
                ],
            )
        )
    code = cli(
        [
            "run",
            str(EXAMPLE),
            *TINY,
            "env.cpu_cores=1",
            f"run.placement={path}",
            f"run.output_dir={tmp_path / 'r2'}",
        ]
    )
    assert code == 2


def test_pinned_plan_file_for_another_num_envs_is_refused(cluster, tmp_path):
    """A plan made for 8 envs, pinned on a run of 4: its groups and prediction are another
    run's, so it is refused naming both counts, before any worker starts."""
    from loomrl.cli import main as cli
    from loomrl.plan import cycle, fixed_plan, leaf, temporal

    prof = cycle_profile(
        _costs(), num_envs=8, steps=16, devices=2, env_cores=0.5, cpu_cores_per_node=None
    )
    plan = fixed_plan(prof, temporal(cycle("env", "policy", 2, used=2), leaf("actor_train", 1)), 8)
    path = tmp_path / "plan.json"
    plan.save(path)
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config, main

    args = [*TINY, f"run.placement={path}"]
    with pytest.raises(
        PlanError, match=r"plan is for env.num_envs=8 but this run has env.num_envs=4"
    ):
        main(load_config(Config, EXAMPLE, [*args, f"run.output_dir={tmp_path / 'r'}"]))
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == ""  # no iteration ran
    assert cli(["run", str(EXAMPLE), *args, f"run.output_dir={tmp_path / 'r2'}"]) == 2


def test_auto_times_close_candidates_and_runs_the_fastest(auto_run):
    """With a wide margin both the co-located and the split plan are timed on real rollouts; the
    run uses the one measured fastest, and says so in trials.json."""
    out, said = auto_run  # what it said is what it did before the plan, in order
    s = json.loads((out / "run_summary.json").read_text())
    assert (
        said.index("measuring env and policy costs") < said.index("trial: ") < said.index("plan:")
    )
    trials = json.loads((out / "trials.json").read_text())
    rows = trials["trials"]
    assert len(rows) >= 2
    assert len({json.dumps(r["placement"], sort_keys=True) for r in rows}) == len(rows)
    assert {r["placement"]["colocated"] for r in rows} == {True, False}
    fastest = min(rows, key=lambda r: r["rollout_s"])
    assert rows[trials["chosen"]] is not None and rows[trials["chosen"]] == fastest
    assert s["placement"] == fastest["placement"]
    assert trials["seconds"] > 0


def test_split_plans_give_the_fastest_split_cycle_per_ring_group_count():
    from loomrl.plan import cycle, fixed_plan, leaf, temporal

    prof = cycle_profile(
        _costs(env_s=4e-3), num_envs=4, steps=16, devices=3, env_cores=1, cpu_cores_per_node=3
    )
    plans = split_plans(prof)
    places = [placement_from_plan(p, 4) for p in plans]
    assert sorted(pl.groups for pl in places) == [1, 2, 4]  # every k that divides 4 envs, once
    assert [p.predicted_s for p in plans] == sorted(p.predicted_s for p in plans)
    assert not any(pl.colocated for pl in places)
    for plan, pl in zip(plans, places, strict=True):  # the best over every split of 3 devices
        options = []
        for split in ((1, 1), (1, 2), (2, 1)):
            tree = temporal(
                cycle("env", "policy", 3, split=split, groups=pl.groups), leaf("actor_train", 3)
            )
            try:
                options.append(fixed_plan(prof, tree, 4).predicted_s)
            except PlanError:
                pass
        assert len(options) >= 2 and plan.predicted_s == pytest.approx(min(options))


def test_ring_groups_stay_as_large_as_the_probe_timed():
    """Under fixed_hops a call's fixed cost is hop latency, so groups smaller than any the probe
    timed look free; the cycle's min_group keeps the planner to the sizes measured."""
    from loomrl.plan import load_profile

    sizes = (16, 32, 64)
    costs = {
        "samples": {side: [(x, 2e-3 + 1e-4 * x) for x in sizes] for side in ("env", "policy")},
        "update_s": 0.5,
    }
    prof = cycle_profile(costs, num_envs=64, steps=16, devices=2, env_cores=1, cpu_cores_per_node=4)
    assert prof.cycles[0].min_group == 16
    assert sorted(placement_from_plan(p, 64).groups for p in split_plans(prof)) == [1, 2, 4]
    raw = prof.to_dict()
    del raw["cycles"][0]["min_group"]
    assert placement_from_plan(best_split_plan(load_profile(raw)), 64).groups == 64
    # Carried below the probed sizes the fits would rank k = 8 first; the window of k the trial
    # times stays where the allowed k put it (4 and its neighbour 2), and k = 8 joins it because
    # 4 is the largest k allowed.
    from loomrl.cycle import split_plans_and_past
    from loomrl.cycle_trial import _near_best_k
    from loomrl.recipes.embodied_ppo import Config

    cfg = Config()
    cfg.env.num_envs = 64
    splits, past = split_plans_and_past(prof)
    every = sorted(splits + past, key=lambda p: p.predicted_s)
    assert sorted(placement_from_plan(p, 64).groups for p in every) == [1, 2, 4, 8]
    assert placement_from_plan(every[0], 64).groups == 8
    assert [placement_from_plan(p, 64).groups for p in past] == [8]
    near = _near_best_k(splits, cfg, None, past)
    assert sorted(placement_from_plan(p, 64).groups for p in near) == [2, 4, 8]
    # A window that does not reach the largest allowed k leaves the past-limit plan out (best
    # k = 1 here: the window is 1 and 2).
    by_groups = sorted(splits, key=lambda p: placement_from_plan(p, 64).groups)
    ks = [placement_from_plan(p, 64).groups for p in _near_best_k(by_groups, cfg, None, past)]
    assert ks == [1, 2]


@pytest.mark.parametrize("placement", ["hybrid", "auto", "temporal"])
def test_trials_time_the_first_k_past_the_probed_sizes_and_only_a_trial_picks_it(
    placement, monkeypatch
):
    from types import SimpleNamespace

    from loomrl import cycle_trial
    from loomrl.cycle_trial import trial
    from loomrl.plan import search_all
    from loomrl.recipes.embodied_ppo import Config

    costs = {
        "samples": {
            side: [(x, 2e-3 + 1e-4 * x) for x in (16, 32, 64)] for side in ("env", "policy")
        },
        "update_s": 0.5,
    }
    prof = cycle_profile(costs, num_envs=64, steps=16, devices=2, env_cores=1, cpu_cores_per_node=4)
    cfg = Config()
    cfg.env.num_envs, cfg.run.placement = 64, placement
    chosen = (
        best_split_plan(prof)
        if placement == "hybrid"
        else search_all(prof)["best" if placement == "auto" else placement]
    )
    assert placement_from_plan(chosen, 64).groups <= 4  # the search keeps to the probed sizes
    seen, ladders = [], []

    def fake_choose(run, cfg, cands, steps, probe, ladder=()):  # k = 8 wins wherever it runs
        seen.append([place.groups for _, place in cands])
        ladders.append([place.groups for _, place in ladder])
        return next((p for p, place in cands if place.groups == 8), cands[0][0]), 0.16

    monkeypatch.setattr(cycle_trial, "choose_by_trial", fake_choose)
    node = SimpleNamespace(num_cpus=4)
    run = SimpleNamespace(
        cluster=SimpleNamespace(devices=[SimpleNamespace(node=0, kind="cpu")] * 2, nodes=[node])
    )
    out = trial(run, cfg, prof, chosen, 16, None, probe=None)
    if placement == "temporal":  # a pinned temporal plan is timed alone
        assert seen == [[1]] and placement_from_plan(out, 64).colocated
        assert ladders == [[]]  # nothing to walk
    else:
        assert 8 in seen[0] and 4 in seen[0]
        assert ladders == [[1, 2, 4, 8]]  # the first k past the probed sizes is a rung too
        assert placement_from_plan(out, 64).groups == 8
        assert out.predicted_s == pytest.approx(0.5 + 0.16)  # update + the trial's rollout


@pytest.mark.parametrize("placement", ["hybrid", "auto"])
def test_split_cycles_at_the_k_next_to_the_best_are_timed_whatever_the_margin(
    placement, monkeypatch
):
    """The model can misprice a split cycle by more than the margin (direct hand-offs it never
    probed): the k next to its best are timed even at margin 0; for auto, the best co-located
    plan too."""
    from types import SimpleNamespace

    from loomrl import cycle_trial
    from loomrl.cycle_trial import _near_best_k, trial
    from loomrl.plan import search_all
    from loomrl.recipes.embodied_ppo import Config

    prof = cycle_profile(
        _costs(), num_envs=16, steps=16, devices=2, env_cores=1, cpu_cores_per_node=2
    )
    cfg = Config()
    cfg.env.num_envs, cfg.run.placement, cfg.auto_trial_margin = 16, placement, 0.0
    near_plans = _near_best_k(split_plans(prof), cfg, None)
    near = sorted(placement_from_plan(p, 16).groups for p in near_plans)
    assert len(near) >= 2
    # at margin 0 a neighbour's own prediction would have left it out
    best = best_split_plan(prof) if placement == "hybrid" else search_all(prof)["best"]
    assert [p for p in near_plans if p.predicted_s > best.predicted_s]
    seen, ladders = [], []

    def fake_choose(run, cfg, cands, steps, probe, ladder=()):
        seen.append(sorted((place.colocated, place.groups) for _, place in cands))
        ladders.append(ladder)
        return cands[0][0], 0.1

    monkeypatch.setattr(cycle_trial, "choose_by_trial", fake_choose)
    node = SimpleNamespace(num_cpus=2)
    run = SimpleNamespace(
        cluster=SimpleNamespace(devices=[SimpleNamespace(node=0, kind="cpu")] * 2, nodes=[node])
    )
    trial(run, cfg, prof, best, 16, None, probe=None)
    (timed,) = seen
    assert [k for colocated, k in timed if not colocated] == near
    assert any(colocated for colocated, _ in timed) == (placement == "auto")
    # The ladder the trial may walk: a split plan at every k the profile allows, by k.
    (ladder,) = ladders
    assert [place.groups for _, place in ladder] == sorted(
        placement_from_plan(p, 16).groups for p in split_plans(prof)
    )
    assert [place.groups for _, place in ladder] == [1, 2, 4, 8, 16]
    assert not any(place.colocated for _, place in ladder)


def _trial_cand(k: int, workers: int = 2, colocated: bool = False) -> tuple:
    """A (plan, placement) trial candidate: a split cycle at k groups on ``workers`` env workers
    (``colocated``: a temporal plan, k = 1)."""
    from types import SimpleNamespace

    mode = {"mode": "temporal" if colocated else "hybrid", "colocated": colocated, "groups": k}
    return SimpleNamespace(predicted_s=1.0), SimpleNamespace(
        workers=workers,
        groups=k,
        colocated=colocated,
        describe=lambda: mode,
        launch_devices=(0,),
        policy_devices=(0,) if colocated else (1,),
    )


def _trial_on_fakes(
    monkeypatch,
    tmp_path,
    fake_cycle,
    cands,
    steps,
    fits=lambda place: True,
    ladder=(),
    has_cuda=False,
    confirm=0,
    probes=None,
):
    """``choose_by_trial`` over ``cands`` (8 envs, auto_trial_steps 8, ``confirm`` rollouts
    after the choice), ``fake_cycle`` standing for the cycle; the probe has 2 env workers and
    can time the candidates ``fits`` says; the cluster is CPU-only unless ``has_cuda``."""
    from types import SimpleNamespace

    from loomrl import cycle_trial
    from loomrl.cycle_trial import choose_by_trial
    from loomrl.recipes.embodied_ppo import Config

    monkeypatch.setattr(cycle_trial, "EnvPolicyCycle", fake_cycle)
    # a PPO update of the cycle's policy (before each timed S-step rollout): the fake records it
    monkeypatch.setattr(cycle_trial, "_update_policy", lambda cycle: cycle.update())
    cfg = Config()
    cfg.env.num_envs, cfg.auto_trial_steps, cfg.auto_trial_confirm = 8, 8, confirm
    probe = SimpleNamespace(env=SimpleNamespace(world_size=2), policy=None, can_time=fits)
    probe.alive, probe.kill = True, lambda: setattr(probe, "alive", False)
    if probes is not None:  # for the caller to look at after
        probes.append(probe)
    run = SimpleNamespace(
        cluster=SimpleNamespace(has_cuda=has_cuda, nodes=[0]),
        dir=tmp_path,
        logger=SimpleNamespace(echo=lambda msg: None),
    )
    return choose_by_trial(run, cfg, cands, steps, probe, ladder)


def _fake_cycle(calls: list, wall_s) -> type:
    """A stand-in for EnvPolicyCycle: ``collect(n)`` records (k, n) in ``calls`` and takes
    ``wall_s(k, n)`` seconds; ``update()`` (a PPO update of its policy) records (k, "update")."""
    from types import SimpleNamespace

    class FakeCycle:
        def __init__(self, envs, policy, envs_per_worker, groups, pipelined, handoff="driver", **_):
            self.k, self.handoff = groups, handoff

        def collect(self, n):
            calls.append((self.k, n))
            return SimpleNamespace(wall_s=wall_s(self.k, n))

        def update(self):
            calls.append((self.k, "update"))

    return FakeCycle


def _after_update(*groups: int, n: int = 16) -> list[tuple]:
    """What a fake cycle records for timed rollouts of ``n`` steps at ring-group counts
    ``groups`` in turn, each after a PPO update of its policy (as the run's rollouts come)."""
    return [c for k in groups for c in ((k, "update"), (k, n))]


def _rollouts(calls: list[tuple]) -> list[tuple]:
    """The rollouts among a fake cycle's ``calls`` (its policy's updates left out)."""
    return [c for c in calls if c[1] != "update"]


def test_a_trial_walks_past_its_window_while_the_fastest_is_at_its_edge(monkeypatch, tmp_path):
    calls = []
    # Seconds per step by k: the window is k = 4 and 8, the best k is 2 (beyond it).
    per_step = {1: 0.012, 2: 0.006, 4: 0.008, 8: 0.010, 16: 0.020}
    FakeCycle = _fake_cycle(calls, lambda k, n: per_step[k] * n)
    cands = [_trial_cand(k) for k in (4, 8)]
    ladder = [_trial_cand(k) for k in (1, 2, 4, 8, 16)]
    plan, rollout_s = _trial_on_fakes(
        monkeypatch, tmp_path, FakeCycle, cands, 16, ladder=ladder, confirm=2
    )
    # The window's warm-ups and three passes; k = 2 (past the edge k = 4) with a warm-up and
    # three passes in turns with k = 4; k = 2 wins at the new edge, so k = 1 in turns with
    # k = 2; k = 1 loses and the walk stops (k = 16, on the other side, is never timed); the
    # chosen k = 2 is timed again for its prediction.
    assert calls == (
        [(4, 16), (8, 16)]
        + _after_update(4, 8) * 3
        + [(2, 16)]
        + _after_update(4, 2) * 3
        + [(1, 16)]
        + _after_update(2, 1) * 3
        + _after_update(2) * 2
    )
    assert plan is ladder[1][0] and rollout_s == pytest.approx(0.006 * 16)
    rows = json.loads((tmp_path / "trials.json").read_text())["trials"]
    assert [(r["placement"]["groups"], r["walked"]) for r in rows] == [
        (4, False),
        (8, False),
        (2, True),
        (1, True),
    ]


def test_the_chosen_plan_is_predicted_from_rollouts_timed_after_the_choice(monkeypatch, tmp_path):
    # k = 2 ran a lucky spell while the candidates took turns (0.004 s a step against k = 4's
    # 0.005), then ran at its usual 0.006: it is chosen, and predicted at what it ran after.
    calls = []

    def wall_s(k: int, n: int) -> float:
        lucky = _rollouts(calls).count((2, 16)) <= 4  # its warm-up and three passes
        return (0.004 if lucky else 0.006) * n if k == 2 else 0.005 * n

    FakeCycle = _fake_cycle(calls, wall_s)
    cands = [_trial_cand(k) for k in (2, 4)]
    plan, rollout_s = _trial_on_fakes(monkeypatch, tmp_path, FakeCycle, cands, 16, confirm=5)
    assert plan is cands[0][0]
    assert calls == [(2, 16), (4, 16)] + _after_update(2, 4) * 3 + _after_update(2) * 5
    assert rollout_s == pytest.approx(0.006 * 16)
    rows = json.loads((tmp_path / "trials.json").read_text())["trials"]
    assert rows[0]["rollout_s"] == pytest.approx(0.004 * 16)  # the turns' estimate, kept
    assert rows[0]["confirmed_s"] == {"16": [pytest.approx(0.006 * 16)] * 5}
    assert json.loads((tmp_path / "trials.json").read_text())["rollout_s"] == rollout_s
    assert "confirmed_s" not in rows[1]


def test_a_lone_plan_is_predicted_from_rollouts_after_its_warm_up_spell(monkeypatch, tmp_path):
    # Temporal's one plan: its first rollouts run slow (0.008 s a step over its warm-up and
    # three timed ones), then at its usual 0.005. Its prediction comes from the later ones.
    calls = []
    FakeCycle = _fake_cycle(
        calls, lambda k, n: (0.008 if len(_rollouts(calls)) <= 4 else 0.005) * n
    )
    plan, alone = _trial_on_fakes(monkeypatch, tmp_path, FakeCycle, [_trial_cand(4)], 16, confirm=5)
    assert calls == [(4, 16)] + _after_update(4) * 3 + _after_update(4) * 5
    assert alone == pytest.approx(0.005 * 16)
    trials = json.loads((tmp_path / "trials.json").read_text())
    assert trials["trials"][0]["rollout_s"] == pytest.approx(0.008 * 16)  # the turns' own
    assert trials["rollout_s"] == alone
    # With confirm = 0 the turns are its prediction.
    calls.clear()
    _, turns = _trial_on_fakes(monkeypatch, tmp_path, FakeCycle, [_trial_cand(4)], 16, confirm=0)
    assert calls == [(4, 16)] + _after_update(4) * 3 and turns == pytest.approx(0.008 * 16)


def test_confirmation_is_made_on_the_workers_that_will_run(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from loomrl import cycle_trial

    calls = []
    FakeCycle = _fake_cycle(calls, lambda k, n: 0.001 * k * n)
    # At S = 32 > 2 L the chosen one is timed again at both lengths, 8 and 16 steps.
    cands = [_trial_cand(k) for k in (2, 4)]
    _, rollout_s = _trial_on_fakes(monkeypatch, tmp_path, FakeCycle, cands, 32, confirm=3)
    assert calls[-6:] == [(2, 8), (2, 16)] * 3 and rollout_s == pytest.approx(0.002 * 32)
    assert calls == _rollouts(calls)  # back to back: an update per shape would record its graph
    # A co-located plan and the split k = 1 beside accelerators are one cycle on the probe's
    # workers: timed once in the turns, and once again after (the co-located one, first, wins).
    calls.clear()
    both = [_trial_cand(1, colocated=True), _trial_cand(1)]
    plan, _ = _trial_on_fakes(monkeypatch, tmp_path, FakeCycle, both, 16, has_cuda=True, confirm=3)
    assert calls == [(1, 16)] + _after_update(1) * 3 + _after_update(1) * 3
    assert plan is both[0][0]
    # The probe gave its workers back for a candidate on fresh ones (the node's cores): the
    # chosen one, timed on the probe's, gets fresh workers of its own, timed after a warm-up,
    # which the run is then handed; the other candidate's are ended.
    calls.clear()
    starts, killed, probes = [], [], []

    def fresh_cycle(cluster, cfg, place, **_):
        starts.append(place.groups)
        if len(starts) == 1:
            raise PlacementError("the probe holds the cores")
        worker = SimpleNamespace(kill=lambda k=place.groups: killed.append(k), k=place.groups)
        return worker, worker, FakeCycle(None, None, 0, place.groups, True)

    monkeypatch.setattr(cycle_trial, "start_cycle", fresh_cycle)
    cands = [_trial_cand(2), _trial_cand(4), _trial_cand(8, workers=4)]
    plan, rollout_s = _trial_on_fakes(
        monkeypatch,
        tmp_path,
        FakeCycle,
        cands,
        16,
        fits=lambda p: p.workers == 2,
        confirm=3,
        probes=probes,
    )
    assert probes[0].alive and probes[0].env.k == 2 and probes[0].policy.k == 2  # for the run
    assert plan is cands[0][0] and rollout_s == pytest.approx(0.002 * 16)
    assert starts == [8, 8, 2] and killed == [8, 8]  # env and policy of k = 8; k = 2's kept
    # k = 8's turns, then k = 2's own: a warm-up and three rollouts
    assert calls[-14:] == [(8, 16)] + _after_update(8) * 3 + [(2, 16)] + _after_update(2) * 3
    trials = json.loads((tmp_path / "trials.json").read_text())
    assert trials["trials"][0]["confirmed_s"] == {"16": [pytest.approx(0.032)] * 3}


def test_a_pick_timed_on_fresh_workers_keeps_them_for_the_run(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from loomrl import cycle_trial
    from loomrl.cycle_trial import choose_by_trial
    from loomrl.recipes.embodied_ppo import Config

    calls, killed = [], []
    FakeCycle = _fake_cycle(calls, lambda k, n: 0.001 * n if k == 1 else 0.003 * n)

    def fresh_cycle(cluster, cfg, place, **_):
        worker = SimpleNamespace(kill=lambda: killed.append(place.groups), world_size=4)
        return worker, worker, FakeCycle(None, None, 0, place.groups, True)

    monkeypatch.setattr(cycle_trial, "start_cycle", fresh_cycle)
    monkeypatch.setattr(cycle_trial, "EnvPolicyCycle", FakeCycle)
    monkeypatch.setattr(cycle_trial, "_update_policy", lambda cycle: cycle.update())
    cfg = Config()
    cfg.env.num_envs, cfg.auto_trial_steps, cfg.auto_trial_confirm = 8, 8, 2
    probe = SimpleNamespace(env=SimpleNamespace(world_size=2), policy=None, alive=True)
    probe.can_time = lambda p: p.workers == 2
    ended = []  # the probe's own workers, ended when it adopts the pick's

    def kill():
        ended.append(probe.env.world_size)
        probe.alive = False

    probe.kill = kill
    run = SimpleNamespace(
        cluster=SimpleNamespace(has_cuda=False, nodes=[0]),
        dir=tmp_path,
        logger=SimpleNamespace(echo=lambda msg: None),
    )
    # k = 1 on 4 fresh env workers is the fastest: its workers stay up, become the probe's (for
    # the run), and are timed again there, with no second launch.
    fast = _trial_cand(1, workers=4)
    fast[1].launch_devices, fast[1].policy_devices = (0,), (1,)
    plan, rollout_s = choose_by_trial(run, cfg, [_trial_cand(2), fast], 16, probe)
    assert plan is fast[0] and rollout_s == pytest.approx(0.001 * 16)
    # its warm-up, 3 passes, 2 more
    assert killed == [] and calls[-11:] == [(1, 16)] + _after_update(1) * 3 + _after_update(1) * 2
    assert probe.alive and probe.env.world_size == 4 and probe.env_devices == (0,)
    assert probe.policy_devices == (1,) and ended == [2]
    trials = json.loads((tmp_path / "trials.json").read_text())
    assert trials["trials"][1]["confirmed_s"] == {"16": [pytest.approx(0.016)] * 2}
    # The only candidate (as temporal's one plan is), its fresh workers are kept the same way
    # and timed again there.
    calls.clear()
    probe.alive, probe.env = True, SimpleNamespace(world_size=2)
    plan, _ = choose_by_trial(run, cfg, [fast], 16, probe)
    assert calls == [(1, 16)] + _after_update(1) * 3 + _after_update(1) * 2
    assert killed == [] and probe.env.world_size == 4
    assert ended == [2, 2]


@pytest.mark.parametrize(
    ("window", "fits", "timed_ks"),
    [
        ((2, 4, 8), lambda p: True, {2, 4, 8}),  # the best (k = 4) inside the window: no walk
        ((8, 16), lambda p: True, {2, 4, 8, 16}),  # down from 8: 4 wins, then 2 loses
        ((8, 16), lambda p: p.groups != 4, {8, 16}),  # the next rung not on the probe's workers
        ((4,), lambda p: p.groups != 2, {4, 8}),  # k = 2 not there: up to k = 8, which loses
    ],
)
def test_a_trial_walks_only_next_to_the_fastest_and_only_on_the_probes_workers(
    monkeypatch, tmp_path, window, fits, timed_ks
):
    calls = []
    per_step = {1: 0.012, 2: 0.009, 4: 0.006, 8: 0.008, 16: 0.010}
    FakeCycle = _fake_cycle(calls, lambda k, n: per_step[k] * n)
    ladder = [_trial_cand(k) for k in (1, 2, 4, 8, 16)]
    cands = [_trial_cand(k) for k in window]
    plan, _ = _trial_on_fakes(monkeypatch, tmp_path, FakeCycle, cands, 16, fits=fits, ladder=ladder)
    assert {k for k, _ in calls} == timed_ks
    best = min(timed_ks, key=per_step.__getitem__)
    assert plan is next(c[0] for c in [*cands, *ladder] if c[1].groups == best)


def test_the_next_rung_is_an_untimed_neighbour_of_the_best():
    from loomrl.cycle_trial import _next_rung

    ladder = [_trial_cand(k) for k in (1, 2, 4, 8)]
    timed = [_trial_cand(k) for k in (2, 4)]
    assert _next_rung(0, timed, timed, ladder)[1].groups == 1
    assert _next_rung(1, timed, timed, ladder)[1].groups == 8
    # gaps next to the best are filled: k = 1 and 8 timed, k = 2 and 4 not
    ends = [ladder[0], ladder[3]]
    assert _next_rung(0, ends, ends, ladder)[1].groups == 2
    assert _next_rung(1, ends, ends, ladder)[1].groups == 4
    # both neighbours untimed: the lower first
    assert _next_rung(0, ladder[2:3], ladder[2:3], ladder)[1].groups == 2
    # at the ladder's end with its one neighbour timed, or between timed neighbours: nothing
    assert _next_rung(0, ladder[:1], ladder[:1], ladder)[1].groups == 2
    assert _next_rung(1, ladder[:3], ladder[:3], ladder) is None
    assert _next_rung(3, ladder, ladder, ladder) is None
    elsewhere = _trial_cand(1, workers=4, colocated=True)  # on other workers: not a rung
    assert _next_rung(0, [elsewhere, *timed], [elsewhere, *timed], ladder) is None
    # Beside accelerators a co-located plan on the probe's workers runs the rung at k = 1: k = 2
    # has both neighbours timed then, and the split k = 1 is not timed a second time.
    colocated = _trial_cand(1, colocated=True)
    both = [colocated, *timed]
    assert _next_rung(1, both, both, ladder) is None
    assert _next_rung(2, both, both, ladder)[1].groups == 8
    # On CPU core slots it puts env and policy on one core: not a rung, so k = 1 is untimed.
    assert _next_rung(1, both, both, ladder, slots=True)[1].groups == 1


def test_a_trial_fills_the_gap_between_a_co_located_plan_and_its_window(monkeypatch, tmp_path):
    # Beside accelerators auto times the co-located plan (the rung k = 1) and the window 4, 8,
    # 16; k = 4 is the fastest of those, but k = 2, between k = 1 and the window, is faster
    # still (pixels on one H200, 64 envs). The walk times it and keeps it.
    calls = []
    per_step = {1: 0.010, 2: 0.006, 4: 0.008, 8: 0.012, 16: 0.020}
    FakeCycle = _fake_cycle(calls, lambda k, n: per_step[k] * n)
    cands = [_trial_cand(1, colocated=True), *(_trial_cand(k) for k in (4, 8, 16))]
    ladder = [_trial_cand(k) for k in (1, 2, 4, 8, 16)]
    plan, rollout_s = _trial_on_fakes(
        monkeypatch, tmp_path, FakeCycle, cands, 16, ladder=ladder, has_cuda=True
    )
    assert plan is ladder[1][0] and rollout_s == pytest.approx(0.006 * 16)
    rows = json.loads((tmp_path / "trials.json").read_text())["trials"]
    assert [(r["placement"]["groups"], r["walked"]) for r in rows][-1] == (2, True)
    # the split k = 1 is not timed again
    assert sum(1 for k, _ in _rollouts(calls) if k == 1) == 4


def test_a_trial_walks_at_most_trial_walk_rungs(monkeypatch, tmp_path):
    from loomrl.cycle_trial import TRIAL_WALK

    calls = []
    ks = (1, 2, 4, 8, 16, 32, 64)  # the smaller the k the faster: the edge always wins
    FakeCycle = _fake_cycle(calls, lambda k, n: 0.001 * (1 + ks.index(k)) * n)
    cands = [_trial_cand(k) for k in (32, 64)]
    ladder = [_trial_cand(k) for k in ks]
    plan, _ = _trial_on_fakes(monkeypatch, tmp_path, FakeCycle, cands, 16, ladder=ladder)
    walked = [k for k in (16, 8, 4, 2, 1) if (k, 16) in calls]
    assert TRIAL_WALK == 3 and walked == [16, 8, 4]
    assert plan is ladder[2][0]  # k = 4, the last rung timed


def test_a_walk_beside_a_co_located_plan_and_one_on_fresh_workers(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from loomrl import cycle_trial

    calls, per_step = [], {1: 0.010, 2: 0.008, 4: 0.006}

    class FakeCycle:
        def __init__(self, envs, policy, n, groups, *_, handoff="driver", tag="probe", **__):
            self.tag, self.handoff = (tag, groups), handoff

        def collect(self, n):
            calls.append((*self.tag, n))
            return SimpleNamespace(
                wall_s=(0.02 if self.tag[0] == "fresh" else per_step[self.tag[1]]) * n
            )

        def update(self):
            calls.append((*self.tag, "update"))

    def fresh_cycle(cluster, cfg, place, **_):
        gone = SimpleNamespace(kill=lambda: None)
        return gone, gone, FakeCycle(None, None, 0, place.groups, True, tag="fresh")

    monkeypatch.setattr(cycle_trial, "start_cycle", fresh_cycle)
    colocated = _trial_cand(1, colocated=True)
    fresh = _trial_cand(1, workers=4)
    cands = [fresh, colocated, _trial_cand(2)]
    ladder = [_trial_cand(k) for k in (1, 2, 4)]
    plan, _ = _trial_on_fakes(
        monkeypatch,
        tmp_path,
        FakeCycle,
        cands,
        16,
        fits=lambda p: p.workers == 2,
        ladder=ladder,
        has_cuda=True,
    )
    # k = 2 wins at the top of the rungs timed (the co-located plan is the rung k = 1), so k = 4
    # is timed in turns with it; the split k = 1 never is; the fresh workers' plan runs last.
    probe_ks = [k for tag, k, n in calls if tag == "probe" and n != "update"]
    assert probe_ks.count(4) == 4 and probe_ks.count(1) == 4  # a warm-up and 3 passes each
    assert calls[-7:] == [("fresh", 1, 16)] + [("fresh", 1, "update"), ("fresh", 1, 16)] * 3
    assert plan is ladder[2][0]
    doc = json.loads((tmp_path / "trials.json").read_text())
    rows = doc["trials"]
    assert [(r["placement"]["groups"], r["walked"], r["probe_workers"]) for r in rows] == [
        (1, False, True),
        (2, False, True),
        (1, False, False),
        (4, True, True),
    ]
    assert doc["chosen"] == 3


@pytest.mark.parametrize("colocated_first", [True, False])
def test_candidates_running_the_same_cycle_on_the_probe_are_timed_once(
    monkeypatch, tmp_path, colocated_first
):
    calls = []
    FakeCycle = _fake_cycle(calls, lambda k, n: {1: 0.006, 2: 0.008}[k] * n)
    pair = [_trial_cand(1, colocated=True), _trial_cand(1)]  # 2 workers, k = 1 both
    pair = pair if colocated_first else pair[::-1]
    cands = [*pair, _trial_cand(2)]
    plan, rollout_s = _trial_on_fakes(monkeypatch, tmp_path, FakeCycle, cands, 16, has_cuda=True)
    # a warm-up and three passes of one k = 1 cycle
    assert calls == [(1, 16), (2, 16)] + _after_update(1, 2) * 3
    doc = json.loads((tmp_path / "trials.json").read_text())
    rows = doc["trials"]
    assert rows[0]["timed_s"] == rows[1]["timed_s"] and len(rows[0]["timed_s"]["16"]) == 3
    assert [r["same_cycle_as"] for r in rows] == [None, 0, None]
    assert rows[1]["handoff"] == rows[0]["handoff"]
    # the tie goes to the first of the pair, whichever kind it is
    assert doc["chosen"] == 0 and plan is pair[0][0] and rollout_s == pytest.approx(0.006 * 16)


def test_on_cpu_slots_a_co_located_plan_is_timed_apart_from_the_split_one(monkeypatch, tmp_path):
    calls = []
    FakeCycle = _fake_cycle(calls, lambda k, n: {1: 0.006, 2: 0.008}[k] * n)
    cands = [_trial_cand(1, colocated=True), _trial_cand(1), _trial_cand(2)]
    _trial_on_fakes(monkeypatch, tmp_path, FakeCycle, cands, 16)  # a CPU-only cluster
    assert calls == [(1, 16), (1, 16), (2, 16)] + _after_update(1, 1, 2) * 3
    rows = json.loads((tmp_path / "trials.json").read_text())["trials"]
    assert [r["same_cycle_as"] for r in rows] == [None, None, None]


def test_trial_candidates_on_the_probes_workers_take_turns(monkeypatch, tmp_path):
    calls = []
    # Seconds per step: k = 2 is the faster plan, and the host turns 3x slower after four
    # rollouts. One candidate after the other, k = 1 would be timed before the slow spell and
    # k = 2 in it, and k = 1 would win; taking turns, both meet it alike.
    per_step = {1: 0.010, 2: 0.008}
    slow = iter([1, 1, 1, 1, 3, 3, 3, 3])
    FakeCycle = _fake_cycle(calls, lambda k, n: per_step[k] * n * next(slow))

    cands = [_trial_cand(k) for k in (1, 2)]
    plan, rollout_s = _trial_on_fakes(monkeypatch, tmp_path, FakeCycle, cands, 16)
    # A warm-up each, then three passes of one 16-step rollout per candidate.
    assert calls == [(1, 16), (2, 16)] + _after_update(1, 2) * 3
    assert plan is cands[1][0] and rollout_s == pytest.approx(0.008 * 16 * 3)
    rows = json.loads((tmp_path / "trials.json").read_text())["trials"]
    assert [len(r["timed_s"]["16"]) for r in rows] == [3, 3]


@pytest.mark.parametrize(
    ("k1", "k2", "extra"),
    [
        # Close after three passes (11% apart, noise 20%), 14% apart with noise 10% after one more.
        ([0.16, 0.192, 0.128] + [0.16] * 9, [0.176, 0.12, 0.144] + [0.136] * 9, 1),
        # The same plan twice: never ranked, so the extra passes stop at 2 x 3.
        ([0.128, 0.192, 0.16] * 4, [0.128, 0.192, 0.16] * 4, 6),
    ],
)
def test_trial_candidates_closer_than_their_noise_take_more_turns(
    monkeypatch, tmp_path, k1, k2, extra
):
    calls = []
    # The first is the warm-up; k = 4 is far slower and never close, so never timed again.
    times = {1: iter([1.0, *k1]), 2: iter([1.0, *k2]), 4: iter([1.0] + [0.3] * 3)}
    FakeCycle = _fake_cycle(calls, lambda k, n: next(times[k]))

    cands = [_trial_cand(k) for k in (1, 2, 4)]
    plan, rollout_s = _trial_on_fakes(monkeypatch, tmp_path, FakeCycle, cands, 16)
    # A warm-up each, three passes, then the extra passes: the close two, in turns.
    first = [(1, 16), (2, 16), (4, 16)]
    assert calls == first + _after_update(1, 2, 4) * 3 + _after_update(1, 2) * extra
    rows = json.loads((tmp_path / "trials.json").read_text())["trials"]
    assert [len(r["timed_s"]["16"]) for r in rows] == [3 + extra, 3 + extra, 3]
    if extra == 1:
        assert plan is cands[1][0] and rollout_s == pytest.approx(0.140)


def test_close_candidates_timed_at_two_lengths_take_more_passes_of_both(monkeypatch, tmp_path):
    from itertools import cycle

    calls = []
    # the same plan twice: 8 steps 0.1 s, 16 steps 0.12-0.2 s, never ranked
    long = {k: cycle([0.16, 0.2, 0.12]) for k in (1, 2)}
    FakeCycle = _fake_cycle(calls, lambda k, n: 0.1 if n == 8 else next(long[k]))

    cands = [_trial_cand(k) for k in (1, 2)]
    _trial_on_fakes(monkeypatch, tmp_path, FakeCycle, cands, 32)
    # S = 32 > 2L: two passes of 8- and 16-step rollouts, then 2 x 2 more for the close pair.
    assert calls == [(1, 8), (2, 8)] + [(1, 8), (1, 16), (2, 8), (2, 16)] * (2 + 4)
    rows = json.loads((tmp_path / "trials.json").read_text())["trials"]
    assert [len(r["timed_s"][n]) for r in rows for n in ("8", "16")] == [6, 6, 6, 6]


def test_a_trial_candidate_on_fresh_workers_is_timed_after_the_probes_and_thrown_away(
    monkeypatch, tmp_path
):
    from types import SimpleNamespace

    from loomrl import cycle_trial

    calls, killed = [], []

    class FakeCycle:  # 0.01 s per step and 0.05 s per rollout for any plan
        def __init__(self, envs, policy, n, groups, *_, handoff="driver", tag="probe", **__):
            self.tag, self.handoff = (tag, groups), handoff

        def collect(self, n):
            calls.append((*self.tag, n))
            return SimpleNamespace(wall_s=0.05 + 0.01 * n)

    def fresh_cycle(cluster, cfg, place, **_):
        def worker(name):
            return SimpleNamespace(kill=lambda: killed.append(name))

        return (
            worker("env"),
            worker("policy"),
            FakeCycle(None, None, 0, place.groups, True, tag="fresh"),
        )

    monkeypatch.setattr(cycle_trial, "start_cycle", fresh_cycle)
    # the fresh-worker one first: it still runs last
    cands = [_trial_cand(1, workers=4), _trial_cand(2)]
    _, rollout_s = _trial_on_fakes(
        monkeypatch, tmp_path, FakeCycle, cands, 32, fits=lambda p: p.workers == 2
    )
    # S = 32 > 2 L: rollouts of 8 and 16 steps, twice each after a warm-up of 8.
    each = [8, 8, 16, 8, 16]
    assert calls == [("probe", 2, n) for n in each] + [("fresh", 1, n) for n in each]
    assert killed == ["env", "policy"]
    assert rollout_s == pytest.approx(0.05 + 0.01 * 32)  # fixed cost + 32 steps, from 8 and 16
    rows = json.loads((tmp_path / "trials.json").read_text())["trials"]
    assert [r["probe_workers"] for r in rows] == [True, False]


def test_trials_time_the_split_cycle_at_the_k_next_to_the_models_best():
    from loomrl.cycle_trial import _near_best_k
    from loomrl.recipes.embodied_ppo import Config

    prof = cycle_profile(
        _costs(), num_envs=16, steps=16, devices=2, env_cores=1, cpu_cores_per_node=2
    )
    cfg = Config()
    cfg.env.num_envs = 16
    every_k = sorted(placement_from_plan(p, 16).groups for p in split_plans(prof))
    assert every_k == [1, 2, 4, 8, 16]
    best_k = placement_from_plan(best_split_plan(prof), 16).groups
    near = [placement_from_plan(p, 16).groups for p in _near_best_k(split_plans(prof), cfg, None)]
    i = every_k.index(best_k)
    assert near == every_k[max(i - 1, 0) : i + 2] and best_k in near and 2 <= len(near) <= 3


def test_auto_times_the_best_co_located_and_split_plans_beyond_the_margin():
    from types import SimpleNamespace

    from loomrl.cycle_trial import _candidates
    from loomrl.plan import search_all
    from loomrl.recipes.embodied_ppo import Config

    prof = cycle_profile(
        _costs(env_s=4e-3), num_envs=16, steps=16, devices=2, env_cores=1, cpu_cores_per_node=2
    )
    plans = search_all(prof)
    best, temporal, split = plans["best"], plans["temporal"], best_split_plan(prof)
    assert temporal.predicted_s != split.predicted_s  # one of them lies beyond a zero margin
    cfg = Config()
    cfg.env.num_envs, cfg.auto_trial_margin = 16, 0.0
    node = SimpleNamespace(num_cpus=2)
    cluster = SimpleNamespace(devices=[SimpleNamespace(node=0, kind="cpu")] * 2, nodes=[node])

    def colocated(cands):
        return sorted(place.colocated for _, place in cands)

    assert colocated(_candidates(best, [temporal, split], cfg, cluster, None)) in ([False], [True])
    cands = _candidates(best, [], cfg, cluster, None, always=[temporal, split])
    assert colocated(cands) == [False, True] and cands[0][0] is best
    # A plan the cores cannot hold is left out even when always timed.
    node.num_cpus = 0.5
    assert _candidates(best, [], cfg, cluster, None, always=[temporal, split]) == [
        (best, placement_from_plan(best, 16))
    ]


def test_pinned_hybrid_times_its_split_cycle_at_each_close_k(cluster, tmp_path):
    """placement=hybrid keeps env and policy apart, and times every close k on real rollouts."""
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config, main

    out = tmp_path / "hybrid"
    cfg = load_config(
        Config,
        EXAMPLE,
        [
            *TINY,
            "run.steps=1",
            "run.placement=hybrid",
            "auto_trial_steps=4",
            "auto_trial_margin=1000",
            f"run.output_dir={out}",
        ],
    )
    s = main(cfg)
    rows = json.loads((out / "trials.json").read_text())["trials"]
    ks = [r["placement"]["groups"] for r in rows]
    assert len(ks) >= 2 and len(set(ks)) == len(ks)
    assert not any(r["placement"]["colocated"] for r in rows)
    assert s["placement"] == min(rows, key=lambda r: r["rollout_s"])["placement"]


def test_trial_calibration_keeps_the_update_and_matches_the_measured_cycle():
    from loomrl.cycle_trial import calibrated_by_trial
    from loomrl.plan import search_all

    prof = cycle_profile(
        _costs(), num_envs=4, steps=16, devices=2, env_cores=1, cpu_cores_per_node=2
    )
    for plan in search_all(prof).values():
        if plan is None:
            continue
        cal = calibrated_by_trial(prof, plan, rollout_s=0.16)
        assert cal.tree == plan.tree and cal.micro_batch == plan.micro_batch
        assert cal.predicted_s == pytest.approx(0.5 + 0.01 * 16)  # update 0.5 s + 16 steps


def test_trials_are_skipped_when_disabled_and_time_a_pinned_plan_alone(
    cluster, tmp_path, flaky_run
):
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config, main

    # placement=auto on measured costs with auto_trial_steps=0: planned without trials.
    assert (flaky_run[0] / "cycle_costs.json").exists()
    assert not (flaky_run[0] / "trials.json").exists()
    base = [*TINY, "run.steps=1", "auto_trial_margin=1000"]
    # A pinned mode times its own plan (S = 16 <= 2 x 8: three rollouts of S steps; on the
    # probe's workers when the plan has as many env workers: one), then 5 more back to back
    # (auto_trial_confirm), and predicts from those. An env worker of the node's 2 cores: one
    # env worker, the probe's (2 worker processes in all, where 4 of 0.5 cores started 7).
    out = tmp_path / "pinned"
    pinned = ["run.placement=temporal", "env.cpu_cores=2", "auto_trial_steps=8"]
    s = main(load_config(Config, EXAMPLE, [*base, *pinned, f"run.output_dir={out}"]))
    trials = json.loads((out / "trials.json").read_text())
    (row,) = trials["trials"]
    assert row["placement"] == s["placement"] and row["placement"]["colocated"]
    assert row["probe_workers"] == (row["placement"]["env_workers"] == 1)
    assert list(row["timed_s"]) == ["16"] and len(row["timed_s"]["16"]) == 3
    profile = load_profile_json(out / "profile.json")
    update = profile.components["actor_train"].time(1, 1)
    assert len(row["confirmed_s"]["16"]) == 5
    assert trials["policy_graph_captures"] is None  # on CPU nothing is recorded as graphs
    assert trials["rollout_s"] == statistics.median(row["confirmed_s"]["16"])
    assert s["predicted_iteration_s"] == pytest.approx(update + trials["rollout_s"])
    with pytest.raises(
        ConfigError, match=r"(?s)auto_trial_steps: must be >= 0.*auto_trial_confirm"
    ):
        load_config(Config, EXAMPLE, ["auto_trial_steps=-1", "auto_trial_confirm=-1"])


def load_profile_json(path: Path):
    from loomrl.plan import load_profile

    return load_profile(json.loads(path.read_text()))


def test_check_cores_message_names_the_fix(cluster):
    place = CyclePlacement((0, 1), (2,), 2, False, "hybrid")
    check_cores(place, 1.0, cluster)  # 2 cores on a 2-CPU node: fine
    with pytest.raises(PlacementError) as e:
        check_cores(place, 1.5, cluster)
    msg = str(e.value)
    assert "env.cpu_cores=1.5" in msg and "3 cores" in msg and "has 2" in msg
    assert "at most 1 env worker" in msg


def test_a_policy_on_a_cpu_slot_of_its_own_counts_a_core_while_env_workers_step():
    """Where devices are CPU slots, a policy apart from the env workers holds a core of the node
    while they step (k >= 2); taking turns with them (k = 1) or sharing their slots, it does not.
    The planner counts the same, so auto never plans what ``check_cores`` refuses."""
    from types import SimpleNamespace

    from loomrl.cluster import Device
    from loomrl.plan import search_all

    cpu = SimpleNamespace(
        devices=[Device(0, 0, 0, "cpu"), Device(1, 0, 1, "cpu")],
        nodes=[SimpleNamespace(num_cpus=2)],
    )
    check_cores(CyclePlacement((0,), (1,), 2, False, "hybrid"), 1.0, cpu)  # 1 + 1 of 2
    check_cores(CyclePlacement((0,), (1,), 1, False, "hybrid"), 2.0, cpu)  # turns: 2 of 2
    check_cores(CyclePlacement((0,), (0,), 2, True, "temporal"), 2.0, cpu)  # shared slot
    with pytest.raises(PlacementError) as e:
        check_cores(CyclePlacement((0,), (1,), 2, False, "hybrid"), 2.0, cpu)
    msg = str(e.value)
    assert "env.cpu_cores=2" in msg and "policy's core on device 1" in msg and "3 cores" in msg
    assert "at most 0 env worker" in msg
    # The planner: with env workers of 2 cores on a 2-core node, no plan overlaps the sides.
    prof = cycle_profile(_costs(), 16, 16, devices=2, env_cores=2, cpu_cores_per_node=2)
    for p in search_all(prof).values():
        if p is not None:
            place = placement_from_plan(p, 16)
            assert place.colocated or place.groups == 1
            check_cores(place, 2.0, cpu)
    free = search_all(cycle_profile(_costs(), 16, 16, devices=2, env_cores=1, cpu_cores_per_node=2))
    assert placement_from_plan(free["hybrid"], 16).groups >= 2


def test_planner_keeps_env_workers_within_the_node_cores():
    # Env is the slow side, so more env devices would help, but only 2 cores exist. (Chained
    # costs: env's 5 ms is then a cost of each call, where fixed_hops would make it a hop.)
    prof = cycle_profile(
        _costs(env_s=5e-3), 8, 16, devices=4, env_cores=1, cpu_cores_per_node=2, hops="chained"
    )
    from loomrl.plan import search_all

    plans = search_all(prof)
    for p in plans.values():
        if p is not None:
            assert len(placement_from_plan(p, 8).env_devices) <= 2
    unlimited = search_all(cycle_profile(_costs(env_s=5e-3), 8, 16, 4, 1, None, hops="chained"))
    unlimited = unlimited["best"]
    assert len(placement_from_plan(unlimited, 8).env_devices) == 4


def test_host_core_env_pipelines_beside_one_accelerator(cluster):
    # Beside accelerators env computes on host cores: with one device, hybrid is env on 4 host
    # workers | policy on device 0, and temporal keeps the same 4 workers, alternating.
    from loomrl.plan import exhaustive, search_all

    prof = cycle_profile(_costs(), 16, 32, 1, 0.5, 2, host_env_workers=4)
    assert prof.components["env"].valid_devices == (0, 1)
    plans = search_all(prof)
    best, temporal = plans["best"], plans["temporal"]
    assert best.mode == "hybrid" and best.assignment()["env"] == []
    assert best.predicted_s == pytest.approx(exhaustive(prof).predicted_s)
    assert best.predicted_s < temporal.predicted_s
    place = placement_from_plan(best, 16, host_env_workers=4)
    assert (place.workers, place.launch_devices, place.policy_devices) == (4, (0,), (0,))
    assert place.groups >= 2 and not place.colocated
    assert placement_from_plan(temporal, 16, host_env_workers=4).workers == 4
    check_cores(place, 0.5, cluster)  # 4 x 0.5 cores on a 2-core node
    with pytest.raises(PlacementError, match=r"4 env worker\(s\).*at most 2 env worker"):
        check_cores(place, 1.0, cluster)
    with pytest.raises(PlacementError, match="host CPU cores"):
        placement_from_plan(best, 16)  # a profile without host-core workers cannot place it


def test_cycle_models_place_hand_offs_in_the_cycle_or_in_the_calls():
    # Chains take 1 ms + 0.1 ms per env per call, 1 ms more than the workers are busy.
    # busy_hops: components cost the busy time, the cycle carries the 2 ms of round trip;
    # fixed_hops (the default): components cost the per-env part, the cycle the two 1 ms
    # intercepts; chained: components cost the whole chained call, hop 0. Ring groups hide a
    # hop; alternation pays it.
    from loomrl.plan import search_all

    chains = _costs()
    busy = {
        "env_busy": [(x, t - 1e-3) for x, t in chains["samples"]["env"]],
        "policy_busy": [(x, t - 1e-3) for x, t in chains["samples"]["policy"]],
    }
    probed = {**chains, "samples": {**chains["samples"], **busy}}

    def profile(costs, hops=None):
        kw = {} if hops is None else {"hops": hops}
        return cycle_profile(costs, 16, 32, 1, 0.5, 2, host_env_workers=4, **kw)

    old = profile(chains, "chained")
    split, fixed = profile(probed, "busy_hops"), profile(probed)
    # The chained model does not use the busy times; the default is fixed_hops.
    assert profile(probed, "chained").to_dict() == old.to_dict()
    assert fixed.to_dict() == profile(probed, "fixed_hops").to_dict()
    assert old.cycles[0].hop_s == 0
    assert split.cycles[0].hop_s == pytest.approx(2e-3)
    assert fixed.cycles[0].hop_s == pytest.approx(2e-3)  # the two intercepts
    env_old = old.components["env"].time(1, 4)
    assert split.components["env"].time(1, 4) == pytest.approx(env_old - 1e-3)
    assert fixed.components["env"].time(1, 4) == pytest.approx(env_old - 1e-3)
    assert fixed.components["env"].time(1, 8) == pytest.approx(
        2 * fixed.components["env"].time(1, 4)
    )
    old_plans = search_all(old)
    for prof in (split, fixed):
        plans = search_all(prof)
        # Alternating, a step costs the same either way (two calls plus two hand-offs).
        assert plans["temporal"].predicted_s == pytest.approx(
            old_plans["temporal"].predicted_s - 1e-3,
            abs=1e-9,  # the first step has no hop before it
        )
        # Split into groups, the hand-offs overlap with other groups' calls.
        assert plans["best"].predicted_s < old_plans["best"].predicted_s
    with pytest.raises(ValueError, match="hops='fixed'"):
        profile(chains, "fixed")
    # A side whose cost does not grow with envs keeps its chained cost under fixed_hops: its
    # fixed cost cannot be told from its work.
    flat = {**chains, "samples": {**chains["samples"], "policy": [(x, 3e-3) for x in (1, 2, 4)]}}
    prof = profile(flat)
    assert prof.cycles[0].hop_s == pytest.approx(1e-3)  # env's intercept only
    assert prof.components["policy"].time(1, 4) == pytest.approx(3e-3)
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config

    with pytest.raises(ConfigError, match=r"cycle_model: 'fixed' is not one of auto, fixed_hops"):
        load_config(Config, EXAMPLE, ["cycle_model=fixed"])
    with pytest.raises(
        ConfigError, match=r"cycle_handoff: 'ray' is not one of auto, driver, direct, pipe"
    ):
        load_config(Config, EXAMPLE, ["cycle_handoff=ray"])
    with pytest.raises(ConfigError, match=r"cycle_batch: 'all' is not one of ready, group"):
        load_config(Config, EXAMPLE, ["cycle_batch=all"])
    with pytest.raises(ConfigError, match=r"cycle_handoff: 'pipe' runs the ring pipeline") as e:
        load_config(Config, EXAMPLE, ["cycle_handoff=pipe", "pipelined=false", "cycle_timeout_s=0"])
    assert "cycle_timeout_s: 0.0 must be a positive number of seconds" in str(e.value)
    with pytest.raises(
        ConfigError, match=r"cycle_timeout_s: 10000000000000.0 must be .* at most 1e\+06"
    ):
        load_config(Config, EXAMPLE, ["cycle_timeout_s=1e13"])
    with pytest.raises(ConfigError, match=r"policy='mlp': the MLP takes state vectors"):
        load_config(Config, EXAMPLE, ["policy=mlp", "env.pixels=true"])


@pytest.mark.parametrize(
    ("asked", "nodes", "cuda", "pipelined", "expected"),
    [
        ("auto", 1, False, True, "pipe"),  # one node: sockets, on CPU slots and beside GPUs
        ("auto", 1, True, True, "pipe"),
        ("auto", 1, False, False, "auto"),  # no ring pipeline: no pipe
        ("auto", 2, False, True, "auto"),  # CPU-only: direct wherever a group is on one worker
        ("auto", 2, True, True, "driver"),  # beside accelerators direct was not faster
        ("direct", 1, True, True, "auto"),
        ("driver", 1, False, True, "driver"),
        ("pipe", 2, False, True, "pipe"),  # asked for: an env worker off the node says why
    ],
)
def test_cycle_handoff_auto_is_pipe_on_one_node(asked, nodes, cuda, pipelined, expected):
    from types import SimpleNamespace

    from loomrl.cycle_trial import handoff
    from loomrl.recipes.embodied_ppo import Config

    cfg = Config()
    cfg.cycle_handoff, cfg.pipelined = asked, pipelined
    assert handoff(cfg, SimpleNamespace(has_cuda=cuda, nodes=[0] * nodes)) == expected


def test_cycle_model_auto_is_chained_beside_accelerators_on_cpu_slots_and_on_a_pipe():
    from types import SimpleNamespace

    from loomrl.cycle_trial import profile_of_costs
    from loomrl.recipes.embodied_ppo import Config

    cfg = Config()
    cfg.env.num_envs = 16
    node = SimpleNamespace(num_cpus=8, devices=[0, 1])

    def hop(has_cuda, model=None):
        cluster = SimpleNamespace(nodes=[node], num_devices=2, has_cuda=has_cuda)
        if model:
            cfg.cycle_model = model
        return profile_of_costs(cluster, cfg, 32, None, _costs()).cycles[0].hop_s

    assert cfg.cycle_model == "auto"
    assert hop(True) == 0 and hop(False) == 0  # the calls keep their intercepts
    cluster = SimpleNamespace(nodes=[node], num_devices=2, has_cuda=True)
    cfg.cycle_model = "auto"
    auto = profile_of_costs(cluster, cfg, 32, None, _costs()).to_dict()
    assert auto == profile_of_costs(cluster, cfg, 32, None, _costs(), "chained").to_dict()
    # fixed_hops, asked for, makes the two 1 ms intercepts the cycle's hop
    assert hop(False, "fixed_hops") == pytest.approx(2e-3) and hop(True, "chained") == 0
    assert hop(True, "fixed_hops") == pytest.approx(2e-3)
    # Costs of a pipe probe: busy times in its rollouts, each side with half its round trip.
    piped = _costs()
    piped["handoff"] = "pipe"
    piped["samples"].update(
        {
            "pipe": [(x, 5e-3 + 2e-4 * x) for x in (1, 2, 4)],
            "pipe_env_busy": [(x, 1e-3 + 1e-4 * x) for x in (1, 2, 4)],
            "pipe_policy_busy": [(x, 1e-3 + 1e-4 * x) for x in (1, 2, 4)],
        }
    )
    cfg.cycle_model = "auto"
    auto = profile_of_costs(cluster, cfg, 32, None, piped).to_dict()
    assert auto == profile_of_costs(cluster, cfg, 32, None, piped, "chained").to_dict()
    # 5 ms + 0.2 ms per env a step, of which 2 ms + 0.2 ms per env busy: a 3 ms round trip
    assert "hop_s" not in auto["cycles"][0]
    assert auto["components"]["env"]["time"]["alpha"] == pytest.approx(1e-3 + 1.5e-3)
    busy = profile_of_costs(cluster, cfg, 32, None, piped, "busy_hops").to_dict()
    assert busy["cycles"][0]["hop_s"] == pytest.approx(3e-3)


def test_host_only_device_count_is_for_cycle_members():
    from loomrl.plan import load_profile

    raw = {
        "devices": 1,
        "device_memory_gb": 10,
        "batch": 4,
        "components": {
            "a": {"valid_devices": [0, 1], "time": {"per_item": {0: 1.0, 1: 1.0}}},
            "b": {"valid_devices": [1], "time": {"per_item": {1: 1.0}}},
        },
        "edges": [["a", "b"]],
    }
    with pytest.raises(ConfigError, match=r"components\.a\.valid_devices has 0"):
        load_profile(raw)
    raw["edges"].append(["b", "a"])
    raw["cycles"] = [{"members": ["a", "b"], "steps": 2}]
    assert load_profile(raw).components["a"].valid_devices == (0, 1)
    raw["components"]["b"]["valid_devices"] = [-1]
    with pytest.raises(ConfigError, match=r"device counts from 1 to 1,000,000 \(0: host"):
        load_profile(raw)


def test_plan_maps_to_devices_and_groups():
    from loomrl.plan import load_profile, search_all

    prof = load_profile(ROOT / "examples/profiles/embodied_cycle_gpu_sim.yaml", devices=2)
    best = search_all(prof)["best"]
    place = placement_from_plan(best, 128)
    assert place.env_devices == (0,) and place.policy_devices == (1,)
    assert place.groups == 2 and not place.colocated and place.mode == "hybrid"
    temporal = search_all(prof)["temporal"]
    place = placement_from_plan(temporal, 128)
    assert place.colocated and place.groups == 1
    assert set(place.policy_devices) <= set(place.env_devices)


def test_unknown_env_id_is_a_config_error_before_workers_start(tmp_path):
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config, main

    with pytest.raises(ConfigError, match=r"env\.env_id='InvertedPendulm-v5'.*InvertedPendulum-v5"):
        load_config(Config, EXAMPLE, ["env.env_id=InvertedPendulm-v5"])
    cfg = load_config(Config, EXAMPLE, [f"run.output_dir={tmp_path / 'never'}"])
    cfg.env.env_id = "NoSuchEnv-v0"
    with pytest.raises(ConfigError, match="NoSuchEnv-v0"):
        main(cfg)
    assert not (tmp_path / "never").exists()
    # the run section too: a placement typo is named as run.placement, with the modes
    cfg = load_config(Config, EXAMPLE, [f"run.output_dir={tmp_path / 'never'}"])
    cfg.run.placement = "spatal"
    with pytest.raises(ConfigError, match=r"run\.placement: 'spatal' is not auto \| temporal"):
        main(cfg)
    assert not (tmp_path / "never").exists()


def test_an_unknown_policy_stops_main_before_any_worker_starts(tmp_path):
    """main() also takes configs built in Python and checks them as the loader does: an unknown
    policy, found by the policy worker once Ray and the probe had started, is found first."""
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config, main

    cfg = load_config(Config, EXAMPLE, [f"run.output_dir={tmp_path / 'never'}"])
    cfg.policy = "transformer"
    with pytest.raises(ConfigError, match=r"policy='transformer': not a built-in policy"):
        main(cfg)
    assert not (tmp_path / "never").exists()


def test_rollout_steps_must_divide_by_num_envs():
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config

    with pytest.raises(
        ConfigError, match=r"ppo.rollout_steps=100 is not a multiple of env.num_envs=8"
    ):
        load_config(Config, EXAMPLE, ["ppo.rollout_steps=100"])


def test_policy_kwargs_typos_and_bad_values_are_named_before_workers_start():
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config

    pixels = ROOT / "examples/ppo_fetch_pixels.yaml"

    def problems(path, *overrides):
        with pytest.raises(ConfigError) as err:
            load_config(Config, path, list(overrides))
        return str(err.value)

    msg = problems(pixels, "policy_kwargs.chanels=[64,128,128]", "policy_kwargs.x=1")
    assert "2 problem(s)" in msg and "did you mean 'channels'?" in msg
    assert "policy_kwargs.x: not an argument of CNNActorCritic" in msg
    # policy: auto picks the class from the observations: the CNN for pixels, else the MLP.
    assert "did you mean 'channels'" in problems(pixels, "policy=auto", "policy_kwargs.chanels=[8]")
    assert "not an argument of MLPActorCritic" in problems(EXAMPLE, "policy_kwargs.channels=[8]")
    msg = problems(EXAMPLE, "policy_kwargs.seed=3", "policy_kwargs.batch_invariant=false")
    assert "policy_kwargs.seed: not settable here; it is ppo.seed" in msg
    assert "policy_kwargs.batch_invariant: not settable here" in msg
    # Values: wrong types and widths, and what only building the network finds.
    assert "list of positive layer widths, got 64" in problems(pixels, "policy_kwargs.channels=64")
    assert "got [0, 16, 16]" in problems(pixels, "policy_kwargs.channels=[0,16,16]")
    assert "positive width, got 0" in problems(pixels, "policy_kwargs.feature_dim=0")
    assert "list of positive layer widths" in problems(EXAMPLE, "policy_kwargs.hidden=7")
    msg = problems(pixels, "policy_kwargs.channels=[8,16]")
    assert "CNNActorCritic cannot be built with policy_kwargs={'channels': [8, 16]}" in msg
    assert "at least 16x16" in problems(pixels, "env.image_size=12")
    assert "row_block must be a positive number of rows up to 1024, got 0" in problems(
        EXAMPLE, "policy_kwargs.row_block=0"
    )
    assert load_config(Config, pixels, ["policy_kwargs.row_block=16"]).policy_kwargs
    # policy: cnn on state vectors is refused where the env's observations are known.
    import gymnasium as gym
    import numpy as np

    from loomrl.workers.policy import build_policy

    vec = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    with pytest.raises(ConfigError, match=r"policy='cnn': no built-in policy for observations"):
        build_policy("cnn", vec, gym.spaces.Box(-1.0, 1.0, (1,), np.float32), 0, (8,), None)
    cfg = load_config(Config, pixels, ["policy_kwargs.channels=[8,16,16]"])
    assert cfg.policy_kwargs == {"channels": [8, 16, 16]}
    assert load_config(Config, EXAMPLE, ["policy_kwargs.hidden=[32]"]).policy_kwargs


def test_policy_kwargs_reach_the_policy_worker_and_a_factory_mismatch_is_a_config_error(
    cluster, tmp_path
):
    from loomrl.config import load_config
    from loomrl.cycle_trial import start_cycle
    from loomrl.recipes.embodied_ppo import Config, main
    from loomrl.worker import wait

    cfg = load_config(Config, EXAMPLE, [*TINY, "policy_kwargs.hidden=[7]"])
    place = CyclePlacement((0,), (1,), 1, False, "hybrid")
    envs, policy, _ = start_cycle(cluster, cfg, place)
    try:
        params = wait(policy.get_weights())[0]["params"]
    finally:
        envs.kill()
        policy.kill()
    assert params["actor.0.weight"].shape[0] == 7 and params["critic.0.weight"].shape[0] == 7
    # A factory's signature is only known in the worker; a mismatch comes back as a
    # ConfigError at launch (not a dead worker, which run.max_restarts would retry).
    cfg = load_config(
        Config,
        EXAMPLE,
        [
            *TINY,
            "policy=loomrl.policies:MLPActorCritic",
            "policy_kwargs.nope=1",
            "auto_trial_steps=0",
            "run.placement=temporal",
            f"run.output_dir={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(ConfigError, match=r"policy_kwargs=\{'nope': 1\} do not fit its arguments"):
        main(cfg)


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_inverted_pendulum_reaches_950_within_10_minutes(cluster, tmp_path):
    import time

    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config, main

    t = time.time()
    cfg = load_config(
        Config, EXAMPLE, [f"run.output_dir={tmp_path}", "env.cpu_cores=0.5", "run.progress=false"]
    )
    s = main(cfg)
    took = time.time() - t
    assert s["metrics"]["episode_return"] >= 950, s["metrics"]
    assert took < 600, took


def test_rendering_env_gets_a_gpu_of_its_own_when_there_are_two():
    # Pixel env workers render on the GPU they are launched on: beside the policy (env on 0
    # devices) they would render on the policy's GPU. With two devices the split is env on one
    # GPU, the policy on the other; with one device the host-core split stays the only one.
    from loomrl.plan import search_all

    two = cycle_profile(_costs(), 16, 32, 2, 0.5, 2, host_env_workers=4, env_renders=True)
    assert two.components["env"].valid_devices == (1, 2)
    place = placement_from_plan(search_all(two)["best"], 16, host_env_workers=4)
    assert not place.colocated and place.groups >= 2
    assert place.launch_devices == (0,) and place.policy_devices == (1,)
    blind = cycle_profile(_costs(), 16, 32, 2, 0.5, 2, host_env_workers=4)
    assert blind.components["env"].valid_devices == (0, 1, 2)
    one = cycle_profile(_costs(), 16, 32, 1, 0.5, 2, host_env_workers=4, env_renders=True)
    assert one.components["env"].valid_devices == (0, 1)
    assert placement_from_plan(search_all(one)["best"], 16, host_env_workers=4).env_devices == ()


def test_probe_workers_run_the_plan_that_places_them_and_give_the_same_weights(cluster, tmp_path):
    """With one env worker's cores (2 of the node's 2), the split plan puts env on device 0 and
    the policy on device 1, where the cost probe put its workers: they are rebuilt to their
    launch state and run it. The same plan from its file, on freshly launched workers, ends with
    the same weights."""
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config, main

    base = [*TINY, "env.cpu_cores=2", "auto_trial_steps=8"]
    probed = main(
        load_config(
            Config, EXAMPLE, [*base, "run.placement=hybrid", f"run.output_dir={tmp_path / 'a'}"]
        )
    )
    assert probed["probe_workers_reused"]
    assert probed["placement"]["env_devices"] == [0]
    assert probed["placement"]["policy_devices"] == [1]
    fresh = main(
        load_config(
            Config,
            EXAMPLE,
            [
                *base,
                f"run.placement={tmp_path / 'a' / 'plan.json'}",
                f"run.output_dir={tmp_path / 'b'}",
            ],
        )
    )
    assert not fresh["probe_workers_reused"]
    assert fresh["placement"] == probed["placement"]
    assert fresh["param_sha256"] == probed["param_sha256"]
    assert fresh["metrics"]["episode_return"] == probed["metrics"]["episode_return"]


@pytest.fixture(scope="module")
def flaky_run(cluster, tmp_path_factory):
    """A run on measured costs with trials off whose envs each raise on their 4th and 20th
    step (the probe's while measuring, the run's in iterations 1 and 2), read by the tests of
    env failures and of trials turned off: its directory and summary."""
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config, main

    out = tmp_path_factory.mktemp("flaky") / "run"
    s = main(
        load_config(
            Config,
            EXAMPLE,
            [
                *TINY,
                "env.env_id=loomrl.envs.testing:loomrl-test/Counting-v0",
                "env.env_kwargs={length: 50, fail_on: [4, 20]}",
                "run.placement=auto",
                "auto_trial_steps=0",
                f"run.output_dir={out}",
            ],
        )
    )
    return out, s


def test_env_failures_are_recorded_one_by_one_and_training_goes_on(flaky_run):
    """An env that raises mid-episode (gymnasium's ``module:EnvId`` form registers the test env
    in every process) is reset and the run goes on; each failure is a line of
    env_events.jsonl with its step, env and message, and the summary counts them all."""
    out, s = flaky_run
    events = [json.loads(x) for x in (out / "env_events.jsonl").read_text().splitlines()]
    assert events and s["env_events_total"] == len(events)
    assert {e["kind"] for e in events} == {"env_error"}
    assert all("simulator exploded" in e["message"] for e in events)
    # step 0: those the cost probe's steps met while planning
    assert {e["step"] for e in events} <= {0, 1, 2} and {e["env_index"] for e in events} <= set(
        range(4)
    )
    assert {e["step"] for e in events} & {1, 2}  # and the run's own, trained on through
    assert s["steps"] == 2  # trained on through the failures


def test_an_envs_own_image_observations_train_the_cnn_under_a_split_plan(cluster, tmp_path):
    """env.pixels=false with an env whose observations are images (uint8 [H, W, 3]): the run
    keeps them as images [3, H, W] for the CNN (policy: cnn refuses anything else), under a
    pipelined hybrid plan."""
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config, main

    out = tmp_path / "images"
    cfg = load_config(
        Config,
        EXAMPLE,
        [
            *TINY,
            "env.env_id=loomrl.envs.testing:loomrl-test/ImageObs-v0",
            "policy=cnn",
            "run.placement=hybrid",
            f"run.profile={ROOT / 'examples/profiles/embodied_pixels_cpu2.yaml'}",
            f"run.output_dir={out}",
        ],
    )
    s = main(cfg)
    assert s["status"] == "finished" and s["plan"]["mode"] == "hybrid"
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(m.get("episodes", 0) > 0 for m in metrics)  # 6-step episodes ended


def test_buffers_too_big_for_the_envs_own_images_are_refused_before_the_policy_starts(
    cluster, tmp_path
):
    """The config alone cannot size an observation (16M rows of scalars fit in 0.4 GB); once
    the env workers say theirs (3 MB images), 50 TB of buffers are a ConfigError naming
    ppo.rollout_steps, not a policy that fills the node's memory mid-rollout."""
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config, main

    cfg = load_config(
        Config,
        EXAMPLE,
        [
            *TINY,
            "env.num_envs=2",
            "ppo.rollout_steps=16777216",
            "env.env_id=loomrl.envs.testing:loomrl-test/ImageObs-v0",
            "env.env_kwargs={height: 1000, width: 1000}",
            "policy=cnn",
            "run.placement=temporal",
            f"run.profile={ROOT / 'examples/profiles/embodied_pixels_cpu2.yaml'}",
            f"run.output_dir={tmp_path / 'big'}",
        ],
    )
    with pytest.raises(ConfigError) as e:
        main(cfg)
    msg = str(e.value)
    assert "ppo.rollout_steps=16777216" in msg and "[3, 1000, 1000] uint8 images" in msg
    assert "lower ppo.rollout_steps" in msg


def test_repeated_env_failures_stop_the_run_and_keep_their_events(cluster, tmp_path):
    """An env failing on every step from its 42nd: too many failures end the run with the env
    named; the failures recorded before are in env_events.jsonl and counted in the summary."""
    from loomrl.config import load_config
    from loomrl.envs.vec import EnvFailureError
    from loomrl.errors import RemoteError
    from loomrl.recipes.embodied_ppo import Config, main

    out = tmp_path / "broken"
    cfg = load_config(
        Config,
        EXAMPLE,
        [
            *TINY,
            "run.steps=4",
            "env.env_id=loomrl.envs.testing:loomrl-test/Counting-v0",
            "env.env_kwargs={length: 50, fail_from: 42}",
            "run.placement=temporal",
            f"run.profile={ROOT / 'examples/profiles/embodied_pixels_cpu2.yaml'}",
            f"run.output_dir={out}",
        ],
    )
    with pytest.raises((RemoteError, EnvFailureError), match="simulator failures within"):
        main(cfg)
    events = [json.loads(x) for x in (out / "env_events.jsonl").read_text().splitlines()]
    assert len(events) > 3 and all("simulator exploded" in e["message"] for e in events)
    s = json.loads((out / "run_summary.json").read_text())
    assert s["status"] == "failed" and s["env_events_total"] == len(events)
    assert "--- remote traceback ---" not in s["error"] and "traceback" in s


def test_env_failures_while_the_costs_are_measured_are_recorded_as_step_0(
    cluster, tmp_path, flaky_run
):
    """Failures the cost probe's steps meet are in env_events.jsonl (step 0) and counted: those
    recovered from when the run goes on, and those that stop it before its first iteration."""
    from loomrl.config import load_config
    from loomrl.envs.vec import EnvFailureError
    from loomrl.errors import RemoteError
    from loomrl.recipes.embodied_ppo import Config, main

    def cfg(out, kwargs):
        return load_config(
            Config,
            EXAMPLE,
            [
                *TINY,
                "run.steps=1",
                "env.env_id=loomrl.envs.testing:loomrl-test/Counting-v0",
                f"env.env_kwargs={kwargs}",
                "run.placement=temporal",
                "auto_trial_steps=0",
                f"run.output_dir={out}",
            ],
        )

    def events(out):
        return [json.loads(x) for x in (out / "env_events.jsonl").read_text().splitlines()]

    # Each env fails its 4th step: the probe's envs while measuring, the run's in step 1.
    out, s = flaky_run
    first = events(out)
    assert {e["step"] for e in first if e["message"].endswith("at step 4")} == {0, 1}
    assert s["env_events_total"] == len(first)
    with pytest.raises((RemoteError, EnvFailureError), match="simulator failures within"):
        main(cfg(tmp_path / "stop", "{length: 50, fail_from: 3}"))
    stopped = events(tmp_path / "stop")
    assert stopped and {e["step"] for e in stopped} == {0}
    assert all("simulator exploded" in e["message"] for e in stopped)
    summary = json.loads((tmp_path / "stop" / "run_summary.json").read_text())
    assert summary["status"] == "failed" and summary["env_events_total"] == len(stopped)


def test_env_kwargs_that_break_the_first_step_stop_the_run_as_a_config_error(cluster, tmp_path):
    """A keyword whose value breaks every step (HalfCheetah-v5's forward_reward_weight='abc'
    ended in max_failures counted simulator failures blaming the env): the first step's failure
    comes back from the env worker as a config error naming env.env_kwargs and their values."""
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config, main

    cfg = load_config(
        Config,
        EXAMPLE,
        [
            *TINY,
            "run.steps=1",
            "env.env_id=loomrl.envs.testing:loomrl-test/Counting-v0",
            "env.env_kwargs={length: 50, fail_from: 1}",
            "run.placement=temporal",
            "auto_trial_steps=0",
            f"run.output_dir={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(ConfigError, match=r"env\.env_kwargs: .* failed on its first step") as e:
        main(cfg)
    assert "'fail_from': 1 (int)" in str(e.value) and "simulator exploded at step 1" in str(e.value)


def test_a_simulator_that_hangs_mid_run_stops_it_within_its_timeout_not_minutes(cluster, tmp_path):
    """An env that sleeps for an hour in its 40th step (iteration 3) ends the run with the
    cycle's timeout error; the failure path waits for the stuck worker no longer than that
    timeout (twice SETTLE_S before), then the run's workers are killed."""
    import time

    from loomrl.config import load_config
    from loomrl.cycle import SETTLE_S
    from loomrl.errors import LoomError
    from loomrl.recipes.embodied_ppo import Config, main

    cfg = load_config(
        Config,
        EXAMPLE,
        [
            *TINY,
            "run.steps=6",
            "env.env_id=loomrl.envs.testing:loomrl-test/Counting-v0",
            "env.env_kwargs={length: 50, stall_on: [40]}",
            "run.placement=temporal",
            f"run.profile={ROOT / 'examples/profiles/embodied_pixels_cpu2.yaml'}",  # no probing
            "cycle_timeout_s=1.5",
            f"run.output_dir={tmp_path / 'stall'}",
        ],
    )
    t0 = time.monotonic()
    with pytest.raises(LoomError, match=r"no reply from env worker \d .* within 1\.5 s"):
        main(cfg)
    assert time.monotonic() - t0 < SETTLE_S  # not waiting out the settle bound for a hung call
    # The failed run's summary says how it ended, and what it had done by then.
    s = json.loads((tmp_path / "stall" / "run_summary.json").read_text())
    assert s["status"] == "failed" and "no reply from env worker" in s["error"]
    assert s["steps_done"] == len(s["iteration_s"]) == 2, s  # iterations 0 and 1 completed
    assert s["plan"]["mode"] == "temporal" and "episode_return" in s["metrics"]


def test_an_env_worker_wider_than_the_node_is_refused_naming_env_cpu_cores(cluster, tmp_path):
    from loomrl.config import load_config
    from loomrl.recipes.embodied_ppo import Config, main

    cfg = load_config(
        Config, EXAMPLE, [*TINY, "env.cpu_cores=3", f"run.output_dir={tmp_path / 'wide'}"]
    )
    with pytest.raises(PlacementError, match=r"env.cpu_cores=3: 1 env worker\(s\) would reserve 3"):
        main(cfg)


class _StuckUpdate(Worker):
    """A policy worker whose PPO update never returns."""

    def update(self, lr_frac):
        import time

        time.sleep(600)


def test_a_policy_update_that_hangs_stops_at_the_iteration_time_limit(cluster):
    import time
    from types import SimpleNamespace

    from loomrl.errors import IterationTimeout
    from loomrl.recipes.embodied_ppo import update
    from loomrl.run import RunConfig

    group = cluster.launch(_StuckUpdate, 1, name="stuck-update")
    run = SimpleNamespace(rc=RunConfig(iteration_timeout_s=1.5), iter_times=[0.2])
    try:
        t0 = time.monotonic()
        with pytest.raises(IterationTimeout, match=r"PPO update ran past .*=1\.5: 1\.5 s"):
            update(group, 1.0, run, predicted_s=0.1)
        assert time.monotonic() - t0 < 20
    finally:
        group.kill()


@pytest.mark.parametrize("handoff", ["driver", "pipe"])
def test_an_env_worker_that_dies_is_named_once_without_rays_unhandled_errors(
    cluster, tmp_path, capfd, handoff
):
    """The env's process ends mid-rollout: the policy's calls that needed its results fail with
    it. The error names the env worker (not the policy call that found it), and Ray's
    "Unhandled error" block per failed call is not printed."""
    from loomrl.config import load_config
    from loomrl.errors import WorkerDiedError
    from loomrl.recipes.embodied_ppo import Config, main

    cfg = load_config(
        Config,
        EXAMPLE,
        [
            *TINY,
            "run.steps=4",
            "env.env_id=loomrl.envs.testing:loomrl-test/Counting-v0",
            "env.env_kwargs={length: 50, die_on: [42]}",
            "run.placement=temporal",
            f"run.profile={ROOT / 'examples/profiles/embodied_pixels_cpu2.yaml'}",
            f"cycle_handoff={handoff}",
            f"run.output_dir={tmp_path / 'die'}",
        ],
    )
    with pytest.raises(WorkerDiedError, match=r"^env rank \d on \S+ died"):
        main(cfg)
    assert "Unhandled error" not in capfd.readouterr().err
    s = json.loads((tmp_path / "die" / "run_summary.json").read_text())
    assert s["status"] == "failed" and s["error"].startswith("WorkerDiedError: env rank")
