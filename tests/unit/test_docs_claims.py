"""What the README says of the command line and of its measured results, checked against the
commands' own --help and the result files it names (no Ray)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from loomrl.cli import _TOP_LEVEL_RUN_KEYS, main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
RESULTS = (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8")
COMMANDS = ("run", "plan", "report", "resume", "profile", "export")


def _commands_table() -> dict[str, tuple[str, str]]:
    """subcommand -> (its usage after the name, what the row says it does), from the README's
    commands table."""
    section = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `loomrl (\w+)(.*?)` \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = (m.group(2).replace("\\|", "|"), m.group(3))
    return rows


def _help(capsys, *argv: str) -> str:
    """``loomrl ARGV --help`` on one line (argparse wraps it at the terminal's width)."""
    try:
        code = main([*argv, "--help"])
    except SystemExit as e:
        code = e.code
    assert code in (0, None)
    return " ".join(capsys.readouterr().out.split())


def test_the_commands_table_has_every_subcommand_and_the_top_help_lists_them(capsys):
    assert sorted(_commands_table()) == sorted(COMMANDS)
    top = _help(capsys)
    for name in COMMANDS:
        assert name in top


@pytest.mark.parametrize("cmd", COMMANDS)
def test_each_subcommand_takes_the_flags_and_arguments_its_row_shows(capsys, cmd):
    usage, _ = _commands_table()[cmd]
    shown = _help(capsys, cmd)
    for flag in re.findall(r"--[a-z][a-z-]*", usage):
        assert flag in shown, f"loomrl {cmd} --help lacks {flag}, which the README shows"
    # the arguments outside brackets (CONFIG, RUN_DIR, ...), in its usage line
    line = shown.split(" options:")[0].lower()
    for word in re.findall(r"(?<![\[\w-])([A-Z][A-Z_]+)\b(?![^\[]*\])", usage):
        assert word.lower() in line, f"loomrl {cmd} --help: no {word} in its usage"
    if "[key=value ...]" in usage:
        assert "[key=value ...]" in shown


@pytest.mark.parametrize("cmd", COMMANDS)
def test_each_subcommands_row_shows_every_flag_its_help_takes(capsys, cmd):
    """The other way round: a flag the command takes is not left out of its row."""
    usage, _ = _commands_table()[cmd]
    taken = set(re.findall(r"\[(--[a-z][a-z-]*)", _help(capsys, cmd))) - {"--help"}
    shown = set(re.findall(r"--[a-z][a-z-]*", usage))
    assert not taken - shown, f"the README's row of loomrl {cmd} lacks {sorted(taken - shown)}"


@pytest.mark.parametrize("cmd", ["run", "report", "resume", "profile", "export"])
def test_each_subcommands_help_names_the_files_and_settings_its_row_names(capsys, cmd):
    """(`plan` is described by its own parser, loomrl.plan.cli.)"""
    _, what = _commands_table()[cmd]
    shown = _help(capsys, cmd)
    named = re.findall(r"`([\w./]+\.(?:png|json|yaml)|run\.[a-z_]+=?|model\.path)`", what)
    for name in named:
        assert name in shown, f"loomrl {cmd} --help does not name {name}, as the README does"
    if cmd == "run":  # the short overrides of run.* keys
        short = re.findall(r"\b([a-z_]+)=(?=[ `])", what.split("short overrides", 1)[1])
        assert short == list(_TOP_LEVEL_RUN_KEYS)
        for key in short:
            assert f"{key}=" in shown


def _expand(path: str) -> list[str]:
    """``a/{b,c}_*.json`` -> ``["a/b_*.json", "a/c_*.json"]``."""
    m = re.search(r"\{([^{}]*)\}", path)
    if m is None:
        return [path]
    return [
        x
        for part in m.group(1).split(",")
        for x in _expand(path[: m.start()] + part + path[m.end() :])
    ]


def test_every_file_the_docs_name_exists():
    """Paths, globs (``*``, ``{a,b}``) and name prefixes (``embodied_modes_cpu2_run``) alike."""
    named = re.findall(
        r"(?:docs/results|examples|scripts|benchmarks)/[\w./*{},-]+", README + RESULTS
    )
    missing = []
    for path in sorted(set(named)):
        path = path.rstrip(".,")
        if not any(list(ROOT.glob(p)) or list(ROOT.glob(p + "*")) for p in _expand(path)):
            missing.append(path)
    assert not missing


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "examples").glob("*.yaml")) + sorted((ROOT / "examples").glob("*/*.yaml")),
)
def test_the_first_line_of_each_example_is_the_command_that_runs_it(path):
    first = path.read_text(encoding="utf-8").splitlines()[0]
    verb = "plan" if path.parent.name == "profiles" else "run"
    assert f"loomrl {verb} {path.relative_to(ROOT)}" in first


def test_the_main_jobs_row_says_what_its_run_summary_holds():
    s = json.loads((ROOT / "docs/results/grpo_smollm2_run_summary.json").read_text())
    row = next(line for line in README.splitlines() if line.startswith("| GRPO on SmolLM2"))
    minutes = s["wall_s"] / 60
    assert f"({s['steps']} steps, {minutes:.1f} min)" in row
    assert (
        f"{s['measured_iteration_s']:.1f} s per step measured against "
        f"{s['predicted_iteration_s']:.1f} s predicted"
    ) in row
    assert f"{s['steps']} steps,\n  {minutes:.1f} min wall" in RESULTS


def test_the_records_a_resume_cuts_back_are_those_the_readme_names():
    from loomrl.runlog import _STEP_RECORDS

    said = " ".join(README.split("`loomrl resume` cuts", 1)[1].split(" back to", 1)[0].split())
    assert set(re.findall(r"`([\w.]+)`", said)) == set(_STEP_RECORDS)


def test_the_readmes_imports_work_and_the_errors_it_names_are_public():
    """A reader copies the sketch's imports, and catches the errors the README says are raised
    with ``from loomrl import ...``, as the other public names."""
    import loomrl
    from loomrl import errors

    for line in re.findall(
        r"^(?:from loomrl[\w.]* import [\w, ]+|import loomrl[\w.]*)$", README, re.M
    ):
        exec(line, {})
    named = set(re.findall(r"`(\w+)`", README))
    public = {n for n in named if isinstance(getattr(errors, n, None), type)}
    assert public and public <= set(loomrl.__all__), sorted(public - set(loomrl.__all__))
