"""Config loading: types, typos, overrides and validate() problems, all reported together."""

from __future__ import annotations

import dataclasses
import enum
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
import yaml

from loomrl.config import (
    apply_overrides,
    config_keys,
    dump_yaml,
    load_config,
    parse_overrides,
    to_dict,
)
from loomrl.errors import ConfigError
from loomrl.run import RunConfig


class Precision(enum.Enum):
    FP32 = "fp32"
    BF16 = "bf16"


@dataclass
class ActorConfig:
    lr: float = 1e-6
    micro_batch: int = 4
    clip: tuple[float, float] = (0.2, 0.2)
    precision: Precision = Precision.BF16

    def validate(self) -> list[str]:
        problems = []
        if self.lr <= 0:
            problems.append(f"lr: must be > 0, got {self.lr}")
        return problems


@dataclass
class RolloutConfig:
    engine: Literal["hf", "vllm"] = "hf"
    max_new_tokens: int = 256
    temperature: float = 1.0
    stop: list[str] = field(default_factory=list)


@dataclass
class TrainConfig:
    steps: int = 10
    placement: Literal["temporal", "spatial", "hybrid"] = "temporal"
    seed: int = 0
    batch_size: int = 8
    group_size: int = 4
    use_kl: bool = True
    out_dir: Path = Path("runs/default")
    model: str = "tiny"
    eval_every: Optional[int] = None  # noqa: UP045 (Optional must work as well as `| None`)
    tags: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    critic: ActorConfig | None = None
    world: int = field(default=1, init=False)

    def validate(self) -> list[str]:
        problems = []
        if self.batch_size % self.group_size:
            problems.append(
                f"batch_size ({self.batch_size}) must be a multiple of group_size ({self.group_size})"
            )
        return problems


@dataclass
class Required:
    name: str
    size: int = 1


def problems_of(excinfo) -> list[str]:
    return excinfo.value.problems


# ------------------------------------------------------------------ happy paths


def test_defaults_when_no_source():
    cfg = load_config(TrainConfig)
    assert cfg == TrainConfig()


def test_yaml_file_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "steps: 3\nplacement: spatial\nactor:\n  lr: 1e-5\n  clip: [0.1, 0.3]\n"
        "rollout:\n  stop: ['</s>']\nout_dir: /tmp/x\n"
    )
    cfg = load_config(TrainConfig, path, ["actor.lr=2e-5", "steps=5", "rollout.engine=vllm"])
    assert cfg.steps == 5
    assert cfg.placement == "spatial"
    # YAML 1.1 reads 1e-5 (no dot) as a string; float fields accept it.
    assert cfg.actor.lr == pytest.approx(2e-5) and isinstance(cfg.actor.lr, float)
    assert cfg.actor.clip == (0.1, 0.3)
    assert cfg.rollout.engine == "vllm"
    assert cfg.rollout.stop == ["</s>"]
    assert cfg.out_dir == Path("/tmp/x")


def test_int_accepted_for_float_and_enum_by_value():
    cfg = load_config(TrainConfig, {"actor": {"lr": 1, "precision": "fp32"}})
    assert cfg.actor.lr == 1.0 and isinstance(cfg.actor.lr, float)
    assert cfg.actor.precision is Precision.FP32


def test_optional_fields_and_optional_sections():
    cfg = load_config(TrainConfig, {"eval_every": 5, "critic": {"lr": 0.1}})
    assert cfg.eval_every == 5
    assert cfg.critic == ActorConfig(lr=0.1)
    cfg = load_config(TrainConfig, {"eval_every": None}, ["critic=null"])
    assert cfg.eval_every is None and cfg.critic is None


def test_dict_fields_take_any_keys():
    cfg = load_config(TrainConfig, {"extra": {"a": [1, 2]}}, ["tags.team=rl"])
    assert cfg.extra == {"a": [1, 2]}
    assert cfg.tags == {"team": "rl"}


def test_to_dict_and_dump_yaml_round_trip(tmp_path):
    cfg = load_config(TrainConfig, {"steps": 7, "critic": {"lr": 0.5}, "tags": {"a": "b"}})
    d = to_dict(cfg)
    assert d["out_dir"] == "runs/default"
    assert d["actor"]["clip"] == [0.2, 0.2]
    assert d["actor"]["precision"] == "bf16"
    assert "world" not in d  # computed fields are not settable, so not dumped
    path = dump_yaml(cfg, tmp_path / "sub" / "config.yaml")
    text = path.read_text()
    assert text.startswith("steps: 7\n")  # declaration order, not sorted
    assert yaml.safe_load(text) == d
    assert load_config(TrainConfig, path) == cfg


def test_config_keys_lists_sections_and_leaves():
    keys = config_keys(TrainConfig)
    assert "actor" in keys and "actor.lr" in keys and "critic.lr" in keys
    assert "world" not in keys


# ------------------------------------------------------------------ errors


def test_typo_in_override_suggests_the_key():
    with pytest.raises(ConfigError, match=r"unknown key 'acter\.lr' — did you mean 'actor\.lr'\?"):
        load_config(TrainConfig, {}, ["acter.lr=1e-5"])


def test_typo_in_file_names_source_and_suggests(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("stepz: 3\nrollout:\n  max_new_token: 12\n")
    with pytest.raises(ConfigError, match=re.escape(f"in {path}")) as e:
        load_config(TrainConfig, path)
    assert problems_of(e) == [
        "unknown key 'stepz' — did you mean 'steps'?",
        "unknown key 'rollout.max_new_token' — did you mean 'rollout.max_new_tokens'?",
    ]


def test_a_typo_of_a_short_key_is_told_to_mean_it():
    short = {"temp": "rollout.temperature"}  # a caller's short form (`loomrl run`'s steps=5)
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, {}, ["tmep=0.5", "rollout.zzz=1"], short_keys=short)
    assert problems_of(e) == [
        "unknown key 'tmep' — did you mean 'temp' (short for 'rollout.temperature')?",
        # short forms are suggested at the top level only
        "unknown key 'rollout.zzz' — valid keys under 'rollout': engine, max_new_tokens, "
        "temperature, stop",
    ]


def test_unknown_key_without_close_match_lists_valid_keys():
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'rollout\.zzz' — valid keys under 'rollout': engine, max_new_tokens, temperature, stop",
    ):
        load_config(TrainConfig, {"rollout": {"zzz": 1}})


def test_wrong_type_names_key_value_and_type():
    with pytest.raises(ConfigError, match=r"actor\.lr: expected float, got 'fast' \(str\)"):
        load_config(TrainConfig, {}, ["actor.lr=fast"])


def test_bool_is_not_int_and_float_is_not_int():
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, {"steps": True, "seed": 3.0})
    assert problems_of(e) == [
        "steps: expected int, got True (bool)",
        "seed: expected int, got 3.0 (float) — write 3",
    ]


def test_number_for_str_suggests_quoting():
    with pytest.raises(
        ConfigError,
        match=r'model: expected str, got 7 \(int\) — quote it if you meant the text: model: "7"',
    ):
        load_config(TrainConfig, {"model": 7})


def test_literal_lists_choices_and_suggests():
    with pytest.raises(
        ConfigError,
        match=r"placement: expected one of 'temporal', 'spatial', 'hybrid', got 'spacial' \(str\) — did you mean 'spatial'\?",
    ):
        load_config(TrainConfig, {}, ["placement=spacial"])


def test_enum_lists_values():
    with pytest.raises(
        ConfigError, match=r"actor\.precision: expected one of 'fp32', 'bf16', got 'fp16' \(str\)"
    ):
        load_config(TrainConfig, {"actor": {"precision": "fp16"}})


def test_nested_list_tuple_and_dict_items_are_indexed():
    with pytest.raises(ConfigError) as e:
        load_config(
            TrainConfig,
            {
                "rollout": {"stop": ["a", 3]},
                "actor": {"clip": [0.1]},
                "tags": {"x": 1},
                "critic": {"lr": "slow"},
            },
        )
    assert problems_of(e) == [
        'tags.x: expected str, got 1 (int) — quote it if you meant the text: x: "1"',
        "actor.clip: expected 2 items (tuple[float, float]), got 1: [0.1] (list)",
        'rollout.stop[1]: expected str, got 3 (int) — quote it if you meant the text: stop[1]: "3"',
        "critic.lr: expected float, got 'slow' (str)",
    ]


def test_section_given_a_scalar():
    with pytest.raises(
        ConfigError,
        match=r"actor: expected a section \(ActorConfig, a mapping of keys\), got 5 \(int\)",
    ):
        load_config(TrainConfig, {"actor": 5})


def test_missing_required_key():
    with pytest.raises(ConfigError, match=r"name: missing required key \(expected str\)"):
        load_config(Required, {"size": 2})
    assert load_config(Required, {"name": "x"}) == Required("x")


def test_computed_field_cannot_be_set():
    with pytest.raises(
        ConfigError, match=r"world: is computed from other keys and cannot be set — remove it"
    ):
        load_config(TrainConfig, {"world": 4})


def test_every_problem_reported_at_once_including_validate(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("steps: many\nbatch_size: 6\nactor:\n  lr: -1\n")
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, path, ["acter.lr=1", "placement=both", "rollout.temperature=hot"])
    probs = problems_of(e)
    assert probs == [
        "unknown key 'acter.lr' — did you mean 'actor.lr'?",
        "steps: expected int, got 'many' (str)",
        "placement: expected one of 'temporal', 'spatial', 'hybrid', got 'both' (str)",
        # validate() of a section whose types are all right runs, and its problem is prefixed.
        "actor.lr: must be > 0, got -1.0",
        "rollout.temperature: expected float, got 'hot' (str)",
        # The root's validate() runs although steps and placement are wrong: it reads neither.
        "batch_size (6) must be a multiple of group_size (4)",
    ]
    assert "6 problem(s)" in str(e.value)


@dataclass
class Outer:
    inner: ActorConfig = field(default_factory=ActorConfig)
    n: int = 1

    def validate(self) -> list[str]:
        problems = []
        if self.n < 1:
            problems.append(f"n: must be >= 1, got {self.n}")
        if self.n % self.inner.micro_batch:
            problems.append(
                f"n={self.n} is not a multiple of inner.micro_batch={self.inner.micro_batch}"
            )
        return problems


def test_a_failed_nested_section_leaves_the_parents_own_checks_running():
    with pytest.raises(ConfigError) as e:
        load_config(Outer, {"inner": {"lr": "fast", "micro_batch": 3}, "n": -2})
    # n's own problem is reported with the section's type error, and so is the check across
    # sections: it reads inner.micro_batch, which is valid, not inner.lr.
    assert problems_of(e) == [
        "inner.lr: expected float, got 'fast' (str)",
        "n: must be >= 1, got -2",
        "n=-2 is not a multiple of inner.micro_batch=3",
    ]
    # A check that reads a wrong value is left out: it ran on the default (4), not the "x" given.
    with pytest.raises(ConfigError) as e:
        load_config(Outer, {"inner": {"micro_batch": "x"}, "n": 3})
    assert problems_of(e) == ["inner.micro_batch: expected int, got 'x' (str)"]
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, {"batch_size": 6, "rollout": {"temperature": "hot"}})
    assert problems_of(e) == [
        "rollout.temperature: expected float, got 'hot' (str)",
        "batch_size (6) must be a multiple of group_size (4)",
    ]


@dataclass
class Window:
    """Checks its own keys in __post_init__, as PPOConfig and EnvConfig do."""

    size: int = 8
    parts: int = 2

    def __post_init__(self):
        p = []
        if self.size < 1:
            p.append(f"size={self.size}: must be >= 1")
        if not 1 <= self.parts <= max(self.size, 1):
            p.append(f"parts={self.parts}: must be in [1, size={self.size}]")
        if p:
            raise ConfigError(p)


@dataclass
class Shard:
    """Refuses a value in validate(), which its parent divides by."""

    count: int = 2

    def validate(self) -> list[str]:
        return [] if self.count >= 1 else [f"count: must be >= 1, got {self.count}"]


@dataclass
class Pair:
    window: Window = field(default_factory=Window)
    shard: Shard = field(default_factory=Shard)
    width: int = 4

    def validate(self) -> list[str]:
        p = []
        if self.window.size % self.width:
            p.append(f"window.size={self.window.size} is not a multiple of width={self.width}")
        if self.width % self.shard.count:  # no guard: shard.count is never 0 here
            p.append(f"width={self.width} is not a multiple of shard.count={self.shard.count}")
        return p


def test_checks_across_sections_run_beside_a_sections_own_problem():
    # The window refuses parts, not size: the check of size against width still runs.
    with pytest.raises(ConfigError) as e:
        load_config(Pair, {"window": {"size": 6, "parts": 99}})
    assert problems_of(e) == [
        "window.parts=99: must be in [1, size=6]",
        "window.size=6 is not a multiple of width=4",
    ]
    # A wrong type at the top does not stop the checks that do not read it.
    with pytest.raises(ConfigError) as e:
        load_config(Pair, {"window": {"parts": 99}, "shard": {"count": 3}, "width": "x"})
    assert problems_of(e) == [
        "window.parts=99: must be in [1, size=8]",
        "width: expected int, got 'x' (str)",
    ]


def test_a_check_across_sections_skips_values_their_own_section_refused():
    # window.size=0 is refused: the check of size against width would be about a stand-in.
    with pytest.raises(ConfigError) as e:
        load_config(Pair, {"window": {"size": 0, "parts": 1}, "shard": {"count": 3}, "width": 3})
    assert problems_of(e) == ["window.size=0: must be >= 1"]
    # shard.count=0 is refused by validate(): the parent's check, which divides by it, does
    # not see it (a ZeroDivisionError traceback before), and the other check still runs.
    with pytest.raises(ConfigError) as e:
        load_config(Pair, {"window": {"size": 6}, "shard": {"count": 0}})
    assert problems_of(e) == [
        "shard.count: must be >= 1, got 0",
        "window.size=6 is not a multiple of width=4",
    ]


@dataclass
class Named:
    name: str
    size: int = 1

    def validate(self) -> list[str]:
        return [] if self.name.strip() else [f"name: must not be blank, got {self.name!r}"]


@dataclass
class HoldsNamed:
    named: Named = field(default_factory=lambda: Named("a"))
    tag: str = "t"

    def validate(self) -> list[str]:
        if self.tag.lower() == self.named.name.lower():
            return [f"tag: must differ from named.name={self.named.name!r}"]
        return []


def test_a_refused_required_key_stands_in_by_its_sections_default():
    # named.name has no default of its own: the parent's check runs on the section's default
    # (name "a"), never on a placeholder (which has no .lower()), and what it says of it is
    # left out.
    with pytest.raises(ConfigError) as e:
        load_config(HoldsNamed, {"named": {"name": " ", "size": 3}, "tag": "a"})
    assert problems_of(e) == ["named.name: must not be blank, got ' '"]


def test_validate_problems_reported_with_unknown_keys():
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, {"batch_size": 6, "seeed": 1})
    assert problems_of(e) == [
        "unknown key 'seeed' — did you mean 'seed'?",
        "batch_size (6) must be a multiple of group_size (4)",
    ]


@dataclass
class PostInit:
    low: int = 0
    high: int = 1

    def __post_init__(self):
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")


@dataclass
class HasPostInit:
    span: PostInit = field(default_factory=PostInit)
    other: int = 0


def test_post_init_value_error_is_collected():
    with pytest.raises(ConfigError) as e:
        load_config(HasPostInit, {"span": {"low": 5}, "other": "x"})
    assert problems_of(e) == [
        "span.low (5) must be <= high (1)",
        "other: expected int, got 'x' (str)",
    ]


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match=r"config file not found: .*nope\.yaml"):
        load_config(TrainConfig, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match=r"not valid YAML"):
        load_config(TrainConfig, bad)
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n- 2\n")
    with pytest.raises(
        ConfigError,
        match=r"the top level must be a mapping of keys to values, got \[1, 2\] \(list\)",
    ):
        load_config(TrainConfig, top)


def test_a_key_given_twice_in_a_file_is_refused_with_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("steps: 3\nactor:\n  lr: 0.1\n  micro_batch: 2\n  lr: 0.2\n")
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, path)
    assert e.value.source == str(path) and str(path) in str(e.value)
    assert problems_of(e) == [
        "duplicate key 'actor.lr' on lines 3 and 5 — a key may be given once per mapping "
        "(YAML and JSON readers would silently keep the last); remove one of them"
    ]
    # A whole section given twice, and a flow mapping on one line.
    path.write_text("actor:\n  lr: 0.1\nsteps: 3\nactor:\n  micro_batch: 2\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'actor' on lines 1 and 4 — "):
        load_config(TrainConfig, path)
    path.write_text("tags: {a: x, b: y, a: z}\n")
    with pytest.raises(
        ConfigError, match=r"duplicate key 'tags.a' on line 1 \(columns 8 and 20\) — "
    ):
        load_config(TrainConfig, path)


def test_keys_merged_in_with_yaml_merge_keys_may_be_overridden(tmp_path):
    # '<<: *base' then a key of base: the override YAML's merge key exists for, not a slip.
    path = tmp_path / "merge.yaml"
    path.write_text(
        "extra:\n  base: &base {lr: 0.1, micro_batch: 2}\nactor:\n  <<: *base\n  lr: 0.2\n"
    )
    cfg = load_config(TrainConfig, path)
    assert (cfg.actor.lr, cfg.actor.micro_batch) == (0.2, 2)
    # A key twice in the mapping merged from is still found, at the place it is written.
    path.write_text("extra:\n  base: &base {lr: 0.1, lr: 0.3}\nactor:\n  <<: *base\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'extra.base.lr' on line 2 "):
        load_config(TrainConfig, path)


def test_a_key_given_twice_in_an_override_value_is_refused():
    with pytest.raises(ConfigError) as e:
        parse_overrides(["tags={a: x, a: y}", "steps=3"])
    assert problems_of(e) == [
        "'tags={a: x, a: y}': the value gives the key 'a' twice — give it once"
    ]


def test_the_cli_refuses_a_config_file_with_a_key_given_twice(tmp_path, capsys):
    from loomrl.cli import main

    path = tmp_path / "twice.yaml"
    # run.steps=0 keeps the run from starting should the duplicate go unnoticed.
    path.write_text("recipe: demo\nbatch: 4\nbatch: 8\nrun: {steps: 0}\n")
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"invalid configuration in {path}" in err
    assert "duplicate key 'batch' on lines 2 and 3" in err


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "steps: 3\nactor:\n\tlr: 1\n",
            r"not valid YAML at line 3, column 1 \('\\tlr: 1'\): found character '\\t' that "
            r"cannot start any token .* — indent with spaces; YAML does not allow tabs",
        ),
        (
            "actor:\n  lr: 1\n   micro_batch: 2\n",
            r"not valid YAML at line 3, column 15 \('   micro_batch: 2'\): mapping values are "
            r"not allowed here — fix the YAML there or just above it \(an indent",
        ),
        (
            "steps: 3\n---\nseed: 1\n",
            r"not valid YAML at line 2, column 1 \('---'\): .* — a config is one document",
        ),
        (
            "actor: !!python/object:os.system {}\n",
            r"not valid YAML at line 1, column 8 .*: could not determine a constructor .* — a "
            r"config holds plain values .*: remove the tag",
        ),
    ],
)
def test_a_yaml_syntax_error_is_one_line_with_its_place_and_fix(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, path)
    (problem,) = problems_of(e)
    assert re.fullmatch(message + ".*", problem), problem
    assert "<unicode string>" not in problem and "\n" not in problem
    assert e.value.source == str(path)


def test_text_that_reads_as_a_date_but_is_none_is_a_config_error_with_its_place(tmp_path):
    # PyYAML's own error for it is a bare ValueError with no place (month must be in 1..12)
    path = tmp_path / "c.yaml"
    path.write_text("steps: 3\nrun:\n  tag: 2024-13-45\n")
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, path)
    (problem,) = problems_of(e)
    assert re.fullmatch(
        r"not valid YAML at line 3, column 8 \('  tag: 2024-13-45'\): '2024-13-45' reads as a "
        r"date but is not one \(month must be in 1\.\.12\) — quote the value where it is text.*",
        problem,
    ), problem
    with pytest.raises(ConfigError, match=r"'run.tag=2024-13-45': value '2024-13-45' is not valid"):
        parse_overrides(["run.tag=2024-13-45"])


def test_a_file_that_is_not_utf8_names_the_byte_and_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("steps: 3\nmodel: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, path)
    assert problems_of(e) == [f"not UTF-8 text (byte 0xe9 at {path}:2) — save the file as UTF-8"]


def test_an_empty_section_or_one_written_as_a_list_says_how_to_write_it(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("actor:\n  # lr: 1e-5\nrollout:\n  - engine: hf\n  - max_new_tokens: 8\n")
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, path)
    assert problems_of(e) == [
        "actor: is empty (null) where a section (ActorConfig) goes — give its keys indented "
        "below it, or leave it out to keep every default",
        "rollout: expected a section (RolloutConfig, a mapping of keys), got [{'engine': 'hf'}, "
        "{'max_new_tokens': 8}] (list) — write its keys without the leading '- ' (a '- ' starts "
        "a list item)",
    ]
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, {"actor": 5})
    assert problems_of(e) == [
        "actor: expected a section (ActorConfig, a mapping of keys), got 5 (int) — set the keys "
        "inside it instead (actor.lr, actor.micro_batch, actor.clip, ...)"
    ]


def test_a_scalar_for_a_list_a_list_for_a_mapping_and_1e3_for_an_int_say_the_fix():
    with pytest.raises(ConfigError) as e:
        load_config(
            TrainConfig,
            {},
            ["rollout.stop=eos", "actor.clip=0.2", "tags=[a]", "steps=1e3", "seed=2.5"],
        )
    assert problems_of(e) == [
        "steps: expected int, got '1e3' (str) — write 1000",
        "seed: expected int, got 2.5 (float)",
        "tags: expected dict[str, str], got ['a'] (list) — write a mapping, e.g. tags: "
        "{name: value}, or tags: {} for none",
        "actor.clip: expected tuple[float, float], got 0.2 (float) — write a list of 2 items, "
        "e.g. clip: [0.2, 0.2]",
        "rollout.stop: expected list[str], got 'eos' (str) — write a list, e.g. stop: [eos]",
    ]


def test_empty_file_means_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(TrainConfig, path) == TrainConfig()


# ------------------------------------------------------------------ overrides


def test_parse_overrides_yaml_semantics():
    assert parse_overrides(
        ["steps=5", "actor.lr=1e-5", "use_kl=false", "rollout.stop=[a, b]", "x=", "n=1.5"]
    ) == {
        "steps": 5,
        "actor.lr": "1e-5",
        "use_kl": False,
        "rollout.stop": ["a", "b"],
        "x": None,
        "n": 1.5,
    }
    # '=' inside the value belongs to the value; the last override of a key wins.
    assert parse_overrides(["a=b=c", "a=d"]) == {"a": "d"}


def test_malformed_overrides_all_reported():
    with pytest.raises(ConfigError) as e:
        parse_overrides(["steps5", "=3", "a..b=1", "x=[1, 2", "actor.lr:1e-5"])
    probs = problems_of(e)
    assert probs[0] == "'steps5' is not key=value — write it as 'steps=5'"
    assert probs[1] == "'=3' has an empty key — write it as 'key=value'"
    assert probs[2].startswith("'a..b=1': key 'a..b' is not a dotted name (bad part '')")
    assert probs[3].startswith("'x=[1, 2': value '[1, 2' is not valid YAML")
    assert probs[4] == "'actor.lr:1e-5' is not key=value — write it as 'actor.lr=1e-5'"
    with pytest.raises(ConfigError, match=r"'steps5' is not key=value"):
        load_config(TrainConfig, {}, ["steps5"])


def test_an_override_split_at_the_spaces_around_its_equals_sign_is_named_whole():
    # `loomrl run c.yaml ppo.lr = 1e-3` reaches the loader as three words; `lr= 1e-3` as two,
    # the first of which alone would set lr to null.
    with pytest.raises(ConfigError) as e:
        parse_overrides(["actor.lr", "=", "1e-3", "steps=3", "seed=", "7"])
    assert problems_of(e) == [
        "'actor.lr = 1e-3': the shell split it at the spaces around '=' — write it without "
        "spaces: actor.lr=1e-3",
        "'seed= 7': the shell split it at the spaces around '=' — write it without spaces: seed=7",
    ]
    assert parse_overrides(["seed=", "steps=3"]) == {"seed": None, "steps": 3}


def test_an_override_written_as_an_option_is_told_to_drop_the_dashes():
    with pytest.raises(ConfigError) as e:
        parse_overrides(["--actor.lr=1e-3", "-steps=3"])
    assert problems_of(e) == [
        "'--actor.lr=1e-3': overrides take no leading '-' — write it as actor.lr=1e-3",
        "'-steps=3': overrides take no leading '-' — write it as steps=3",
    ]


def test_an_override_mapping_with_no_space_after_a_colon_is_named_with_the_fix():
    """env.env_kwargs={frame_skip:0} is YAML's {'frame_skip:0': None}: the env was then told of
    a keyword 'frame_skip:0' that nobody wrote."""
    with pytest.raises(ConfigError) as e:
        parse_overrides(["env.env_kwargs={frame_skip:0}", "p={a: {b:x, c: 1}}", "q=[{u:1}]"])
    assert problems_of(e) == [
        "'env.env_kwargs={frame_skip:0}': YAML reads 'frame_skip:0' as a key with no value (a "
        "':' in a mapping needs a space after it) — write env.env_kwargs='{frame_skip: 0}'",
        "'p={a: {b:x, c: 1}}': YAML reads 'b:x' as a key with no value (a ':' in a mapping "
        "needs a space after it) — write p='{a: {b: x, c: 1}}'",
        "'q=[{u:1}]': YAML reads 'u:1' as a key with no value (a ':' in a mapping needs a space "
        "after it) — write q='[{u: 1}]'",
    ]
    # A ':' inside a value, or a key with a value, is what it says.
    assert parse_overrides(["a={url: http://x:80}", "b={'c:d': 1}", "e=f:g"]) == {
        "a": {"url": "http://x:80"},
        "b": {"c:d": 1},
        "e": "f:g",
    }


def test_parse_overrides_rejects_bare_string():
    with pytest.raises(TypeError, match="list of 'key=value' strings"):
        parse_overrides("steps=5")


def test_apply_overrides_nests_and_does_not_mutate():
    base = {"actor": {"lr": 1}}
    out = apply_overrides(base, ["actor.micro_batch=2", "rollout.engine=vllm"])
    assert out == {"actor": {"lr": 1, "micro_batch": 2}, "rollout": {"engine": "vllm"}}
    assert base == {"actor": {"lr": 1}}
    with pytest.raises(
        ConfigError, match=r"cannot set 'actor\.lr': 'actor' is 5 \(int\), not a section"
    ):
        apply_overrides({"actor": 5}, ["actor.lr=1"])


def test_config_module_does_not_import_torch():
    import subprocess

    code = "import loomrl.config, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_load_config_requires_a_dataclass():
    with pytest.raises(TypeError, match="needs a dataclass type"):
        load_config(dict, {})
    assert dataclasses.is_dataclass(load_config(Required, {"name": "n"}))


def test_profile_budget_must_be_positive():
    from loomrl.run import RunConfig

    problems = RunConfig(profile_budget=0).validate()
    assert any(p.startswith("profile_budget: must be > 0") and "got 0" in p for p in problems)
    assert RunConfig(profile_budget=0.25).validate() == []
    # inf reached the profiler, whose int(budget / per-item cost) raised OverflowError
    (p,) = RunConfig(profile_budget=float("inf")).validate()
    assert p == (
        "profile_budget: must be > 0 and finite (a share of one iteration, e.g. 0.1), got inf"
    )


def test_negative_logical_gpus_are_refused():
    from loomrl.run import RunConfig

    assert any(p.startswith("num_gpus: must be >= 0") for p in RunConfig(num_gpus=-1).validate())


def test_demo_config_refuses_nonsense_sizes_all_at_once():
    from loomrl.config import load_config
    from loomrl.recipes.demo import Config

    with pytest.raises(ConfigError) as e:
        load_config(
            Config, {"demo": {"size": 0, "transform_sigma": -1, "encode_reps": -3}, "batch": 0}
        )
    text = str(e.value)
    for key in ("demo.size", "demo.transform_sigma", "demo.encode_reps", "batch"):
        assert f"{key}: must be >=" in text, key


def test_demo_transform_devices_must_be_positive_counts():
    from loomrl.recipes.demo import Config

    for bad in ([0, 2], [-1], []):
        with pytest.raises(ConfigError) as e:
            load_config(Config, {"demo": {"transform_devices": bad}})
        assert problems_of(e) == [
            f"demo.transform_devices: device counts must be >= 1 (null: any count), got {bad}"
        ]
    assert load_config(Config, {"demo": {"transform_devices": [1, 2]}}).demo.transform_devices


def test_nan_is_refused_for_every_float_key():
    from loomrl.config import load_config

    @dataclass
    class C:
        lr: float = 1.0
        clip: float | None = 0.2

    for text in ("nan", ".nan", "NaN"):
        with pytest.raises(ConfigError, match="lr: NaN is not a value"):
            load_config(C, {}, [f"lr={text}"])
    with pytest.raises(ConfigError, match="clip: NaN is not a value"):
        load_config(C, {"clip": float("nan")})
    assert load_config(C, {}, ["lr=inf"]).lr == float("inf")  # a range check decides about inf


@dataclass
class WithRun:
    run: RunConfig = field(default_factory=RunConfig)
    flag: bool = True
    other: bool = False


def test_off_and_on_are_words_for_text_settings_and_booleans_for_bool_ones(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec  # wandb=offline is checked to be installed: say it is
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: object() if n == "wandb" else real(n, *a)
    )
    C = WithRun
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  wandb: off\n  iteration_timeout_s: off\nflag: off\nother: yes\n")
    cfg = load_config(C, path)
    assert cfg.run.wandb == "off" and cfg.run.iteration_timeout_s == "off"
    assert cfg.flag is False and cfg.other is True
    cfg = load_config(C, path, ["run.wandb=offline", "run.iteration_timeout_s=30", "flag=on"])
    assert cfg.run.wandb == "offline" and cfg.run.iteration_timeout_s == 30.0 and cfg.flag
    with pytest.raises(ConfigError, match=r"flag: expected bool \(true or false\), got 'maybe'"):
        load_config(C, path, ["flag=maybe"])


def test_launch_timeout_takes_seconds_or_null(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  launch_timeout_s: 60\n")
    assert load_config(WithRun, path).run.launch_timeout_s == 60.0
    assert load_config(WithRun, path, ["run.launch_timeout_s=null"]).run.launch_timeout_s is None
    assert load_config(WithRun, None).run.launch_timeout_s == 1800.0
    for bad in ("0", "-5", ".inf"):
        with pytest.raises(
            ConfigError, match=r"launch_timeout_s: .* is not a number of seconds > 0"
        ):
            load_config(WithRun, path, [f"run.launch_timeout_s={bad}"])


def test_load_json_names_a_nested_duplicate_by_its_dotted_path_and_lines():
    from loomrl.config import DuplicateKeyError, load_json

    text = (
        '{\n  "x": 1,\n  "y": [{"k": 1,\n         "k": 2}],\n  "z": {"a\\/b": {"c": 1, "c": 2}}\n}'
    )
    with pytest.raises(DuplicateKeyError) as e:
        load_json(text)
    assert (e.value.key, e.value.lines) == ("y[0].k", (3, 4))
    with pytest.raises(DuplicateKeyError) as e:
        load_json(text.replace('"k": 2', '"j": 2'))
    assert e.value.key == "z.a/b.c"
    assert load_json(text.replace('"k": 2', '"j": 2').replace('"c": 2', '"d": 2'))["z"] == {
        "a/b": {"c": 1, "d": 2}
    }


def test_yaml_11_octal_and_base_60_numbers_are_text_refused_by_number_keys(tmp_path):
    # YAML 1.1 reads 017 as 15 and 1:30 as 90; either reached a setting without a word.
    path = tmp_path / "c.yaml"
    path.write_text("seed: 0042\nmodel: 007\nactor:\n  lr: 01.5\n")
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, path, ["steps=1:30", "rollout.temperature=1:30.5"])
    assert problems_of(e) == [
        "steps: expected int, got '1:30' (str) — write one number in one unit (1:30 is not "
        "read as 90 here)",
        "seed: expected int, got '0042' (str) — write 42",
        "rollout.temperature: expected float, got '1:30.5' (str) — write one number in one "
        "unit (1:30 is not read as 90 here)",
    ]
    cfg = load_config(TrainConfig, {}, ["model=007", "extra={t: 1:30, lr: 01.5, n: 0x10}"])
    assert (cfg.model, cfg.extra) == ("007", {"t": "1:30", "lr": 1.5, "n": 16})


def test_a_path_the_shell_would_have_expanded_is_refused_with_its_expansion(monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.setenv("SCRATCH", "/scratch/u")
    with pytest.raises(ConfigError) as e:
        load_config(
            TrainConfig, {}, ["out_dir=~/runs", "model=${SCRATCH}/m", "rollout.stop=[$HOME]"]
        )
    assert problems_of(e) == [
        "out_dir: '~/runs' starts with '~', which a shell expands and a config does not (it "
        "would be a folder named '~') — write the full path: /home/u/runs",
        "model: '${SCRATCH}/m' starts with '${SCRATCH}', which a shell expands and a config "
        "does not (it would be a folder named '${SCRATCH}') — write the full path: /scratch/u/m",
        "rollout.stop[0]: '$HOME' starts with '$HOME', which a shell expands and a config does "
        "not (it would be a folder named '$HOME') — write the full path: /home/u",
    ]
    # Text is left alone: it has spaces, or a '~' or '$' not leading a path.
    text = ["$a/b$ is a fraction", "runs/~x", "~", "cost$5", "a$HOME/x"]
    cfg = load_config(TrainConfig, {"rollout": {"stop": text}})
    assert cfg.rollout.stop == text


@dataclass
class MaybeText:
    name: str | None = None
    value: int | float = 1


def test_a_union_field_runs_its_members_checks():
    with pytest.raises(ConfigError) as e:
        load_config(MaybeText, {}, ["name=~/x", "value=.nan"])
    assert [p.split(" —")[0] for p in problems_of(e)] == [
        "name: '~/x' starts with '~', which a shell expands and a config does not (it would "
        "be a folder named '~')",
        "value: NaN is not a value; give a number",
    ]


def test_a_config_that_is_no_regular_file_or_far_too_large_is_refused(tmp_path, monkeypatch):
    import os

    import loomrl.config as config

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is not a regular file .* save the config to a file"):
        load_config(TrainConfig, fifo)
    monkeypatch.setattr(config, "MAX_CONFIG_BYTES", 100)
    big = tmp_path / "big.yaml"
    big.write_text("steps: 3\n" + "# padding\n" * 20)
    with pytest.raises(ConfigError, match="more than 0 MiB, far more than a config holds"):
        load_config(TrainConfig, big)


def test_a_seed_the_workers_would_fail_on_mid_run_is_refused_by_the_run_config():
    from loomrl.run import RunConfig

    for bad in (-1, 2**32):
        assert (
            f"seed: must be a whole number in [0, 2**32), got {bad}"
            in RunConfig(seed=bad).validate()
        )
    assert not [p for p in RunConfig(seed=2**32 - 1).validate() if p.startswith("seed")]


def test_the_word_none_for_a_number_says_that_yaml_writes_null():
    from loomrl.recipes.embodied_ppo import Config

    root = Path(__file__).resolve().parents[2]
    with pytest.raises(ConfigError) as e:
        load_config(Config, root / "examples/ppo_inverted_pendulum.yaml", ["groups=None"])
    assert e.value.problems == [
        "groups: expected int, got 'None' (str) — YAML writes no value as null (or ~)"
    ]
