"""Generated tasks, the JSONL loader, prompts and the task registry."""

from __future__ import annotations

import json

import pytest

from loomrl.errors import ConfigError
from loomrl.reward import RewardResult
from loomrl.tasks import (
    ArithmeticTask,
    CountdownTask,
    DatasetError,
    Example,
    JsonlTask,
    Task,
    build_messages,
    check_solution,
    in_eval_split,
    load_jsonl,
    make_task,
    plain_prompt,
    register_task,
    render_prompt,
    task_names,
)
from loomrl.tasks.arithmetic import generate_expression
from loomrl.tasks.expr import ExprError, safe_eval

# ---------------------------------------------------------------- safe expressions


@pytest.mark.parametrize(
    "text, value",
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 / 2", 3.5),
        ("3 \\times 4 - 2 = 10", 10),
        ("\\frac{3 \\times 4}{2}", 6),
        ("6 \u00f7 3 \u00d7 5 \u2212 1", 9),
    ],
)
def test_safe_eval(text, value):
    assert safe_eval(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('echo hi')",
        "2 ** 100000",
        "abs(-3)",
        "1.5 + 2",
        "x + 1",
        "True + 1",
        "-3 + 5",  # unary minus would let a model use a number it was not given
        "(" * 200 + "1" + ")" * 200,
        "",
        "1 +",
    ],
)
def test_safe_eval_rejects(text):
    with pytest.raises(ExprError):
        safe_eval(text)


# ---------------------------------------------------------------- arithmetic


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_arithmetic_deterministic_and_correct(level):
    a, b = ArithmeticTask(level=level, seed=3), ArithmeticTask(level=level, seed=3)
    for i in range(50):
        ex = a.train_item(i)
        assert ex == b.train_item(i)
        expr = ex.meta["expression"]
        assert ex.question == f"What is {expr}?"
        assert int(ex.answer) == safe_eval(expr)
    other = ArithmeticTask(level=level, seed=4)
    assert [a.train_item(i) for i in range(20)] != [other.train_item(i) for i in range(20)]


def test_arithmetic_levels_shape():
    import random

    rng = random.Random(0)
    for _ in range(200):
        a, op, b = generate_expression(rng, 1).split()
        assert op == "+" and 0 <= int(a) <= 9 and 0 <= int(b) <= 9
        a, op, b = generate_expression(rng, 2).split()
        assert op in "+-" and 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert safe_eval(f"{a} {op} {b}") >= 0
        assert generate_expression(rng, 3).split()[1] in "+-*"
        parts = generate_expression(rng, 4).split()
        assert len(parts) == 5 and parts[1] in "+-*" and parts[3] in "+-*"


@pytest.mark.parametrize("level", [1, 2, 4])
def test_arithmetic_eval_set_fixed_and_disjoint(level):
    task = ArithmeticTask(level=level, seed=0, eval_size=50)
    ev = task.eval_set()
    assert ev == ArithmeticTask(level=level, seed=99, eval_size=50).eval_set()  # seed-independent
    eval_exprs = {e.meta["expression"] for e in ev}
    assert len(eval_exprs) == len(ev) > 0
    train_exprs = {task.train_item(i).meta["expression"] for i in range(2000)}
    assert not eval_exprs & train_exprs
    assert all(in_eval_split(e, task.eval_fraction) for e in eval_exprs)
    if level > 1:
        assert len(ev) == 50
    else:
        assert len(ev) < 50  # only 100 distinct single-digit sums exist


def test_arithmetic_scoring():
    task = ArithmeticTask(level=1)
    ex = Example("What is 2 + 3?", "5", {"expression": "2 + 3"})
    assert task.score("2 + 3 = \\boxed{5}", ex).reward == 1.0
    assert task.score("Answer: 5.0", ex).correct
    assert task.score("\\boxed{6}", ex).reward == 0.0
    assert task.score("", ex).malformed
    assert ArithmeticTask(format_reward=0.1).score("\\boxed{6}", ex).reward == pytest.approx(0.1)


def test_arithmetic_config_errors_listed_together():
    with pytest.raises(ConfigError) as err:
        ArithmeticTask(level=5, eval_fraction=0.0, eval_size=0)
    assert len(err.value.problems) == 3
    assert "level=5" in str(err.value) and "eval_fraction=0.0" in str(err.value)
    with pytest.raises(ValueError, match="index must be an int >= 0; got -1"):
        ArithmeticTask().train_item(-1)


# ---------------------------------------------------------------- countdown


def test_countdown_problems_are_solvable_and_deterministic():
    task = CountdownTask(num_numbers=4, seed=1)
    for i in range(100):
        ex = task.train_item(i)
        assert ex == CountdownTask(num_numbers=4, seed=1).train_item(i)
        nums, target = ex.meta["numbers"], ex.meta["target"]
        assert len(nums) == 4 and all(1 <= n <= 50 for n in nums)
        assert 1 <= target <= 100 and ex.answer == str(target)
        assert check_solution(ex.meta["solution"], nums, target) == (True, "correct")
        assert str(target) in ex.question


@pytest.mark.parametrize(
    "expr, reason",
    [
        ("(25 - 5) * 3", "correct"),
        ("3 * (25 - 5) = 60", "correct"),
        ("25 * 3 - 5 * 3", "number_not_available"),  # 3 used twice, given once
        ("25 * 3 - 15", "number_not_available"),  # 15 not given
        ("25 + 5 + 3", "wrong"),
        ("25 / (5 - 5)", "number_not_available"),
        ("3 / (25 - 25)", "number_not_available"),
        ("import os", "unparseable"),
        ("25 ** 3", "unparseable"),
    ],
)
def test_countdown_check_solution(expr, reason):
    assert check_solution(expr, [25, 5, 3], 60)[1] == reason


def test_countdown_division_and_repeated_numbers():
    # numbers may repeat in the problem; each copy can be used once
    assert check_solution("5 * 5 - 1", [5, 5, 1], 24) == (True, "correct")
    assert check_solution("(6 - 6) / 1", [6, 6, 1], 0) == (True, "correct")
    assert check_solution("1 / (6 - 6)", [6, 6, 1], 0) == (False, "division_by_zero")
    assert check_solution("7 / 2 * 2", [7, 2, 2], 7) == (True, "correct")  # exact fractions


def test_countdown_score():
    task = CountdownTask()
    ex = Example("...", "60", {"numbers": [25, 5, 3], "target": 60})
    assert task.score("so \\boxed{(25 - 5) \\times 3}", ex) == RewardResult(
        1.0, "(25 - 5) \\times 3", False, True, "correct"
    )
    r = task.score("<answer>25 * 3 - 15</answer>", ex)
    assert (r.reward, r.malformed, r.reason) == (0.0, False, "number_not_available")
    r = task.score("\\boxed{sixty}", ex)
    assert (r.reward, r.malformed, r.reason) == (0.0, True, "unparseable")
    assert task.score("no idea", ex).malformed
    assert task.score("x" * 100_000, ex).malformed


def test_countdown_eval_disjoint():
    task = CountdownTask(num_numbers=3, eval_size=30)
    ev = task.eval_set()
    assert len(ev) == 30 and ev == CountdownTask(num_numbers=3, seed=5, eval_size=30).eval_set()
    key = CountdownTask._key
    held = {key(e) for e in ev}
    assert not held & {key(task.train_item(i)) for i in range(1000)}


def test_countdown_config_errors():
    with pytest.raises(ConfigError, match=r"num_numbers=9: must be an int in \[2, 6\]"):
        CountdownTask(num_numbers=9)


# ---------------------------------------------------------------- jsonl


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_jsonl(tmp_path):
    p = _write(
        tmp_path / "d.jsonl",
        [
            json.dumps({"prompt": "1+1?", "answer": "2", "level": "easy"}),
            "",
            json.dumps({"prompt": "2*3?", "answer": 6}),
        ],
    )
    rows = load_jsonl(p)
    assert [r.question for r in rows] == ["1+1?", "2*3?"]
    assert [r.answer for r in rows] == ["2", "6"]
    assert rows[0].meta == {"level": "easy", "source": f"{p}:1"}
    assert rows[1].meta["source"] == f"{p}:3"  # blank lines still count


def test_load_jsonl_missing_answer_names_file_and_line(tmp_path):
    p = _write(
        tmp_path / "bad.jsonl",
        [json.dumps({"prompt": "a", "answer": "1"}), json.dumps({"prompt": "b"})],
    )
    with pytest.raises(
        DatasetError, match=r"bad\.jsonl:2: missing or empty 'answer'.*keys present: \['prompt'\]"
    ):
        load_jsonl(p)


def test_load_jsonl_invalid_json_names_file_and_line(tmp_path):
    p = _write(
        tmp_path / "broken.jsonl",
        [json.dumps({"prompt": "a", "answer": "1"}), '{"prompt": "b",, }'],
    )
    with pytest.raises(DatasetError, match=r"broken\.jsonl:2: invalid JSON"):
        load_jsonl(p)


@pytest.mark.parametrize(
    "line, match",
    [
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"question": "a", "answer": "1"}), "missing or empty 'prompt'"),
        (json.dumps({"prompt": "a", "answer": ""}), "missing or empty 'answer'"),
        (json.dumps({"prompt": "a", "answer": None}), "missing or empty 'answer'"),
    ],
)
def test_load_jsonl_bad_lines(tmp_path, line, match):
    p = _write(tmp_path / "x.jsonl", [line])
    with pytest.raises(DatasetError, match=rf"x\.jsonl:1: {match}"):
        load_jsonl(p)


def test_load_jsonl_keeps_lines_whole_at_unicode_separators(tmp_path):
    # json.dumps(ensure_ascii=False) writes U+2028, U+2029 and U+0085 raw inside strings: they
    # are no line ends of JSON Lines, and the line numbers after them stay right.
    p = tmp_path / "u.jsonl"
    rows = [
        {"prompt": "first\u2028part", "answer": "1"},
        {"prompt": "second\u2029\x85part", "answer": "2"},
        {"prompt": "third", "answer": "3"},
    ]
    p.write_text(
        "\ufeff" + "\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\r\n",
        encoding="utf-8",
    )
    got = load_jsonl(p)
    assert [e.question for e in got] == [r["prompt"] for r in rows]
    assert got[2].meta["source"] == f"{p}:3"
    with open(p, "a", encoding="utf-8") as f:
        f.write('{"prompt": "q", "answer": }\n')
    with pytest.raises(DatasetError, match=r"u\.jsonl:4: invalid JSON"):
        load_jsonl(p)


@pytest.mark.parametrize(
    "line, match",
    [
        ('{"prompt": "q", "answer": NaN}', "invalid JSON.*NaN"),
        ('{"prompt": "q", "answer": -Infinity}', "invalid JSON.*Infinity"),
        ('{"prompt": "q", "answer": 1e999}', "'answer' is a number too large"),
    ],
)
def test_load_jsonl_rejects_non_finite_answers(tmp_path, line, match):
    p = _write(tmp_path / "n.jsonl", [json.dumps({"prompt": "a", "answer": "1"}), line])
    with pytest.raises(DatasetError, match=rf"n\.jsonl:2: {match}"):
        load_jsonl(p)


def test_load_jsonl_missing_file_and_custom_keys(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_jsonl(tmp_path / "nope.jsonl")
    p = _write(tmp_path / "q.jsonl", [json.dumps({"question": "a?", "solution": 3})])
    assert load_jsonl(p, prompt_key="question", answer_key="solution")[0].answer == "3"
    assert isinstance(DatasetError("x"), ValueError)


def test_jsonl_task_hash_split(tmp_path):
    p = _write(
        tmp_path / "d.jsonl",
        [json.dumps({"prompt": f"q{i}", "answer": str(i)}) for i in range(200)],
    )
    task = JsonlTask(path=str(p), eval_fraction=0.2, seed=1)
    ev = {e.question for e in task.eval_set()}
    train = {task.train_item(i).question for i in range(len(task))}
    assert ev and not ev & train and len(ev) + len(train) == 200
    assert len(task) == len(train)  # one epoch visits every training example once
    assert all(in_eval_split(q, 0.2) for q in ev)
    # deterministic, reshuffled per epoch
    again = JsonlTask(path=str(p), eval_fraction=0.2, seed=1)
    n = len(task)
    assert [task.train_item(i) for i in range(2 * n)] == [again.train_item(i) for i in range(2 * n)]
    assert [task.train_item(i) for i in range(n)] != [task.train_item(n + i) for i in range(n)]
    assert task.score("\\boxed{7}", Example("q7", "7")).correct


def test_jsonl_task_eval_file_drops_overlap(tmp_path):
    p = _write(
        tmp_path / "train.jsonl", [json.dumps({"prompt": f"q{i}", "answer": "1"}) for i in range(5)]
    )
    e = _write(
        tmp_path / "eval.jsonl",
        [json.dumps({"prompt": "q1", "answer": "1"}), json.dumps({"prompt": "z", "answer": "2"})],
    )
    task = JsonlTask(path=str(p), eval_path=str(e), eval_size=1)
    assert task.overlap_dropped == 1 and len(task) == 4
    assert [x.question for x in task.eval_set()] == ["q1"]
    assert "q1" not in {task.train_item(i).question for i in range(8)}


def test_jsonl_task_errors(tmp_path):
    with pytest.raises(ConfigError, match="path: required"):
        JsonlTask()
    p = _write(tmp_path / "one.jsonl", [json.dumps({"prompt": "q", "answer": "1"})])
    e = _write(tmp_path / "ev.jsonl", [json.dumps({"prompt": "q", "answer": "1"})])
    with pytest.raises(DatasetError, match="no training examples left"):
        JsonlTask(path=str(p), eval_path=str(e))


# ---------------------------------------------------------------- prompts


def test_build_messages_and_plain_prompt():
    msgs = build_messages("What is 2 + 2?")
    assert msgs == [
        {"role": "user", "content": "What is 2 + 2?\n" + msgs[0]["content"].split("\n", 1)[1]}
    ]
    assert "\\boxed{}" in msgs[0]["content"]
    assert build_messages("q", system="be brief")[0] == {"role": "system", "content": "be brief"}
    assert plain_prompt("q").startswith("Question: q\n") and "\\boxed{}" in plain_prompt("q")
    with pytest.raises(ValueError, match="non-empty string"):
        build_messages("  ")


class _FakeTokenizer:
    name_or_path = "fake/model"

    def __init__(self, template):
        self.chat_template = template
        self.calls = []

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False):
        self.calls.append((messages, tokenize, add_generation_prompt))
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_render_prompt_uses_chat_template_with_generation_prompt():
    tok = _FakeTokenizer("{{ something }}")
    text = render_prompt(tok, "What is 1 + 1?")
    assert text.startswith("<user>What is 1 + 1?") and text.endswith("<assistant>")
    assert tok.calls[0][1:] == (False, True)


def test_render_prompt_without_template_says_how_to_fix():
    with pytest.raises(
        ValueError,
        match=r"'fake/model' has no chat template.*`chat_template`.*`prompt_format: plain`",
    ):
        render_prompt(_FakeTokenizer(None), "q")
    assert render_prompt(_FakeTokenizer(None), "q", prompt_format="plain") == plain_prompt("q")
    with pytest.raises(ValueError, match="prompt_format='jinja' is not known"):
        render_prompt(_FakeTokenizer(None), "q", prompt_format="jinja")


def test_render_prompt_with_a_real_tokenizer():
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    model = tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer(model))
    with pytest.raises(ValueError, match="has no chat template"):
        render_prompt(tok, "q")
    tok.chat_template = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    text = render_prompt(tok, "What is 2 + 2?")
    assert text.startswith("<|user|>What is 2 + 2?\n") and text.endswith("<|assistant|>")


# ---------------------------------------------------------------- registry


def test_make_task_and_protocol(tmp_path):
    assert task_names() == ["arithmetic", "countdown", "digits", "jsonl", "search_qa"]
    t = make_task("arithmetic", level=3, seed=2)
    assert isinstance(t, ArithmeticTask) and t.level == 3 and isinstance(t, Task)
    assert isinstance(make_task("countdown", num_numbers=3), Task)
    p = _write(
        tmp_path / "d.jsonl", [json.dumps({"prompt": f"q{i}", "answer": "1"}) for i in range(30)]
    )
    assert isinstance(make_task("jsonl", path=str(p)), Task)
    assert isinstance(make_task("search_qa", people=50), Task)


def test_make_task_unknown_name_suggests():
    with pytest.raises(
        ConfigError, match=r"'arithmatic' is not known \(did you mean 'arithmetic'\?\)"
    ):
        make_task("arithmatic")
    with pytest.raises(
        ConfigError, match="Known tasks: arithmetic, countdown, digits, jsonl, search_qa"
    ):
        make_task("chess")


def test_make_task_unknown_option_suggests():
    with pytest.raises(
        ConfigError, match=r"'levle' is not known for task 'arithmetic' \(did you mean 'level'\?\)"
    ) as err:
        make_task("arithmetic", levle=2, sead=1)
    assert len(err.value.problems) == 2


def test_register_task():
    class Mine(ArithmeticTask):
        pass

    register_task("mine-test", Mine)
    try:
        assert isinstance(make_task("mine-test", level=2), Mine)
        with pytest.raises(ValueError, match="already registered"):
            register_task("mine-test", CountdownTask)
    finally:
        from loomrl import tasks

        tasks._REGISTRY.pop("mine-test")


def test_digits_task_reward_is_dense():
    t = make_task("digits", seed=0, level=1, eval_size=4)
    ex = t.train_item(0)
    assert t.score("1234", ex).reward == 1.0
    assert t.score("ab12", ex).reward == 0.5
    assert t.score("", ex).reward == 0.0


def test_last_number_answer_format():
    t = make_task("arithmetic", level=1, seed=0, answer_format="last_number")
    ex = Example("What is 2 + 3?", "5", {})
    assert t.score("2 + 3 = 5", ex).reward == 1.0
    assert t.score("2 + 3 = 6", ex).reward == 0.0
    assert t.score("\\boxed{5}", ex).reward == 1.0
    strict = make_task("arithmetic", level=1, seed=0)
    assert strict.score("2 + 3 = 5", ex).malformed


def test_load_jsonl_names_the_line_that_is_not_utf8(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_bytes(b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(DatasetError, match=r"d.jsonl:2: not UTF-8 text \(byte 0xe9\)"):
        load_jsonl(p)


def test_a_scorer_that_breaks_its_contract_is_named_with_the_example_and_response():
    import math

    import numpy as np

    from loomrl.errors import TrainingError
    from loomrl.reward import RewardResult
    from loomrl.tasks import Example
    from loomrl.tasks.base import score_checked

    class Broken:
        name = "mine"

        def __init__(self, result):
            self.result = result

        def score(self, text, example):
            if self.result is KeyError:
                return example.meta["numbers"]
            return self.result

    ex = Example("2+2?", "4")
    with pytest.raises(TrainingError) as e:
        score_checked(Broken(KeyError), "x" * 500, ex)
    msg = str(e.value)
    assert msg.startswith(
        "task 'mine' score() on the example '2+2?' (answer '4') and the response 'xxx"
    )
    assert "...' raised KeyError: 'numbers' — a scorer returns a RewardResult" in msg
    assert isinstance(e.value.__cause__, KeyError)
    with pytest.raises(TrainingError, match=r"returned float 1\.0, not a RewardResult"):
        score_checked(Broken(1.0), "4", ex)
    with pytest.raises(TrainingError, match="returned reward=nan — a reward must be a finite"):
        score_checked(Broken(RewardResult(math.nan, "4", False)), "4", ex)
    good = RewardResult(1.0, "4", False, True)
    assert score_checked(Broken(good), "4", ex) is good
    for number in (np.float32(0.5), np.int64(1)):  # numpy's numbers are numbers
        res = RewardResult(number, "4", False)
        assert score_checked(Broken(res), "4", ex) is res
    with pytest.raises(TrainingError, match=r"returned reward=True — a reward must be a finite"):
        score_checked(Broken(RewardResult(True, "4", False)), "4", ex)
