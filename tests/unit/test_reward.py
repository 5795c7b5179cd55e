"""Answer extraction and scoring on well-formed and malformed model outputs."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from loomrl import reward as reward_mod
from loomrl.reward import RewardResult, RewardStats, answers_match, extract_answer, score

# ---------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\boxed{5}", "5"),
        ("so the answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("nested \\boxed{\\frac{\\sqrt{3}}{2}} done", "\\frac{\\sqrt{3}}{2}"),
        ("first \\boxed{1} then corrected \\boxed{2}", "2"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not close the box
        ("\\fbox{7}", "7"),
        ("\\boxed {8}", "8"),
        ("Answer: 5.0", "5.0"),
        ("work...\nFinal answer: 42.", "42"),
        ("so **Answer:** $12$.", "12"),
        ("**Answer**: 3", "3"),
        ("#### 1,000", "1,000"),
        ("<answer> 7 </answer>", "7"),
        ("<answer>x</answer> then \\boxed{9}", "9"),  # a box beats every other marker
        ("#### 4\nAnswer: 5", "4"),  # '####' beats 'Answer:'
        ("Answer: 1\nAnswer: 2", "2"),  # the last one counts
        ("Answer: \\(\\frac{1}{2}\\).", "\\frac{1}{2}"),
        ("Answer: **5**.", "5"),  # bold answer after a plain label
        ("**Answer: 5**", "5"),  # the whole line in bold
        ("**Answer:** 5", "5"),
        ("Answer:\n**7**", "7"),
        ("Answer: 2**3", "2**3"),  # a power, not a bold marker
        ("Answer: 4\nAnswer: **", "4"),  # a label with nothing after it is skipped
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no marker here, the answer is 5",
        "\\boxed{5",  # unbalanced
        "\\boxed{}",
        "\\boxed{  }",
        "<answer></answer>",
        "Answer:   ",
        "<answer>5",
        None,
        12,
        "\\boxed{" + "1+" * 600 + "1}",  # longer than MAX_ANSWER_CHARS
    ],
)
def test_extract_answer_none(text):
    assert extract_answer(text) is None


def test_extract_answer_is_fast_on_adversarial_text():
    t0 = time.perf_counter()
    assert extract_answer("\\boxed{" * 30_000) is None
    assert extract_answer("<answer>" * 20_000) is None
    assert extract_answer("answer " * 20_000) is None
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.timeout(60)
def test_a_label_followed_by_a_run_of_blanks_is_scored_in_linear_time():
    # Degenerate generations repeat whitespace; a pattern that backtracks over every split of
    # the run takes minutes on a response of MAX_RESPONSE_CHARS.
    for blank in ("\n", " ", "\t"):
        text = "Final answer" + blank * (reward_mod.MAX_RESPONSE_CHARS - 20)
        assert score(text, "1").reason == "no_answer"


def test_a_number_with_a_runaway_exponent_is_wrong_without_being_built():
    # Fraction("1e999999999") would build a billion-digit integer: such a number is not read.
    assert reward_mod._as_number("1e999999999") is reward_mod._HUGE
    assert reward_mod._as_number("-2.5E-1001") is reward_mod._HUGE
    assert reward_mod._as_number("1e1000") == 10**1000  # up to MAX_EXPONENT, exact as before
    r = score("so \\boxed{1e999999999}", "3")
    assert (r.correct, r.malformed, r.parsed) == (False, False, "1e999999999")
    assert score("\\boxed{1e999999999}", "1e999999999").correct  # written alike
    assert score("\\boxed{3e0}", "3").correct


# ---------------------------------------------------------------- scoring


@pytest.mark.parametrize(
    "text, answer",
    [
        ("\\boxed{5}", "5"),
        ("Answer: 5.0", "5"),
        ("the answer is \\boxed{\\frac{1}{2}}", "0.5"),
        ("#### 1,000", 1000),
        ("\\boxed{-3}", -3),
        ("\\boxed{3/4}", "\\frac{3}{4}"),
        ("\\boxed{x^2+2x+1}", "(x+1)^2"),
        ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}"),
        ("\\boxed{5}", "\\boxed{5}"),  # a boxed reference is unwrapped
    ],
)
def test_score_correct(text, answer):
    r = score(text, answer)
    assert r == RewardResult(1.0, r.parsed, False, True, "correct")


@pytest.mark.parametrize(
    "text, answer, parsed",
    [
        ("\\boxed{6}", "5", "6"),
        ("Answer: 0.4", "\\frac{1}{2}", "0.4"),
        ("\\boxed{x+1}", "x+2", "x+1"),
    ],
)
def test_score_wrong_is_well_formed(text, answer, parsed):
    r = score(text, answer)
    assert (r.reward, r.parsed, r.malformed, r.correct, r.reason) == (
        0.0,
        parsed,
        False,
        False,
        "wrong",
    )


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "no_answer"),
        ("   \n", "no_answer"),
        ("I think it is five", "no_answer"),
        ("\\boxed{\\frac{1}{2}", "no_answer"),  # unbalanced braces
        ("x" * 100_000, "no_answer"),  # 100 KB of junk
        ("y" * 300_000 + "\\boxed{5}", "too_long"),
    ],
)
def test_score_malformed(text, reason):
    t0 = time.perf_counter()
    r = score(text, "5")
    assert time.perf_counter() - t0 < 1.0
    assert (r.reward, r.malformed, r.correct, r.reason) == (0.0, True, False, reason)


def test_score_non_string_response_is_malformed():
    assert score(None, "5").malformed  # type: ignore[arg-type]


def test_format_reward_only_for_well_formed_wrong_answers():
    assert score("\\boxed{6}", "5", format_reward=0.1).reward == pytest.approx(0.1)
    assert score("\\boxed{5}", "5", format_reward=0.1).reward == 1.0
    assert score("no answer", "5", format_reward=0.1).reward == 0.0
    with pytest.raises(ValueError, match=r"format_reward=1.5 must be in \[0, 1\)"):
        score("\\boxed{5}", "5", format_reward=1.5)
    with pytest.raises(ValueError, match="timeout_s=0"):
        score("\\boxed{5}", "5", timeout_s=0)


def test_fast_path_decides_integers_without_math_verify(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("math-verify must not be called for plain numbers")

    monkeypatch.setattr(reward_mod, "_math_verify", boom)
    assert answers_match("1,000", "1000") == (True, "correct")
    assert answers_match("12", "13") == (False, "wrong")
    assert answers_match("5.0", "5") == (True, "correct")
    assert answers_match("\\frac{3}{4}", "0.75") == (True, "correct")
    assert answers_match("-\\frac{1}{2}", "-0.5") == (True, "correct")


def test_math_verify_timeout_is_malformed(monkeypatch):
    import math_verify
    from math_verify.errors import TimeoutException

    def slow_parse(*a, **k):
        raise TimeoutException("Operation timed out!")

    reward_mod._parse_boxed.cache_clear()
    monkeypatch.setattr(math_verify, "parse", slow_parse)
    r = score("\\boxed{\\sin(x)^2}", "1-\\cos(x)^2")
    reward_mod._parse_boxed.cache_clear()
    assert (r.reward, r.malformed, r.reason) == (0.0, True, "timeout")


def test_math_verify_exception_is_malformed(monkeypatch):
    import math_verify

    def broken_verify(*a, **k):
        raise RecursionError("deep")

    monkeypatch.setattr(math_verify, "verify", broken_verify)
    r = score("\\boxed{\\sin(x)^2}", "1-\\cos(x)^2")
    assert (r.reward, r.malformed, r.reason) == (0.0, True, "error")


def test_score_works_off_the_main_thread():
    # math-verify's SIGALRM timeout cannot be installed outside the main thread.
    out = {}

    def run():
        out["r"] = score("the answer is \\boxed{\\frac{1}{2}}", "0.5")
        out["s"] = score("\\boxed{x^2+2x+1}", "(x+1)^2")

    th = threading.Thread(target=run)
    th.start()
    th.join(timeout=30)
    assert out["r"].correct and out["s"].correct


def _off_main_thread(fn):
    out = {}

    def run():
        out["value"] = fn()

    th = threading.Thread(target=run, daemon=True)  # a hung check must not hold pytest's exit
    th.start()
    th.join()
    return out["value"]


@pytest.mark.timeout(120)
def test_math_verify_off_the_main_thread_is_bounded_by_the_timeout():
    # SIGALRM cannot be installed off the main thread, and without a limit math-verify never
    # finishes these short answers: there the child process bounds them.
    for text in ("\\boxed{10^{10^{10}}}", "\\boxed{100!!!!}"):
        r = _off_main_thread(lambda t=text: score(t, "3", timeout_s=1))
        assert (r.reward, r.malformed, r.reason) == (0.0, True, "timeout")
    assert _off_main_thread(lambda: score("\\boxed{x^2+2x+1}", "(x+1)^2")).correct


@pytest.mark.timeout(120)
def test_a_lost_math_verify_child_is_replaced():
    assert _off_main_thread(lambda: answers_match("\\sqrt{4}", "2.0")) == (True, "correct")
    reward_mod._checker._proc.kill()
    reward_mod._checker._proc.wait()
    assert _off_main_thread(lambda: answers_match("x+x", "2x")) == (True, "correct")


_STUCK_PARENT = """
import threading, time
from loomrl import reward
threading.Thread(target=reward.answers_match, args=("x+x", "2x")).start()  # starts the child
while reward._checker._conn is None:
    time.sleep(0.05)
print(reward._checker._proc.pid, flush=True)
threading.Thread(target=reward.answers_match, args=("\\\\boxed{10^{10^{10}}}", "3", 60)).start()
time.sleep(60)
"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_math_verify_child_goes_with_its_parent_even_mid_comparison():
    import os
    import signal
    import subprocess
    import time

    # The thread that started the child has ended; the child serves the next caller.
    _off_main_thread(lambda: answers_match("x+x", "2x"))
    pid = reward_mod._checker._proc.pid
    assert _off_main_thread(lambda: answers_match("x+x+x", "3x")) == (True, "correct")
    assert reward_mod._checker._proc.pid == pid

    parent = subprocess.Popen([sys.executable, "-c", _STUCK_PARENT], stdout=subprocess.PIPE)
    child = int(parent.stdout.readline())
    time.sleep(1)  # the child is in a comparison that math-verify gives 60 s
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()

    def running() -> bool:  # a zombie has ended (whoever adopted it may not reap it)
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 10
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running()


@pytest.mark.timeout(120)
def test_a_math_verify_child_that_dies_as_a_call_starts_is_a_wrong_answer_not_an_error(
    monkeypatch,
):
    assert _off_main_thread(lambda: answers_match("\\sqrt{4}", "2.0")) == (True, "correct")
    proc = reward_mod._checker._proc
    proc.kill()
    proc.wait()
    monkeypatch.setattr(proc, "poll", lambda: None)  # dead after compare() looked
    assert _off_main_thread(lambda: reward_mod._checker.compare("1", "1", 5)) == (False, "error")
    assert _off_main_thread(lambda: answers_match("x+x", "2x")) == (True, "correct")


# ---------------------------------------------------------------- stats


def test_reward_stats():
    a, b = RewardStats(), RewardStats()
    for text in ("\\boxed{5}", "\\boxed{6}", "nothing"):
        a.add(score(text, "5"))
    b.add(RewardResult(0.0, "x", True, False, "timeout"))
    merged = a.merge(b)
    assert (merged.total, merged.correct, merged.malformed, merged.timeouts) == (4, 1, 2, 1)
    assert merged.accuracy == 0.25 and merged.malformed_rate == 0.5
    assert merged.mean_reward == 0.25
    assert merged.by_reason == {"correct": 1, "wrong": 1, "no_answer": 1, "timeout": 1}
    d = merged.as_dict()
    assert d["reward/accuracy"] == 0.25 and d["reward/count"] == 4.0
    assert RewardStats().as_dict(prefix="eval/")["eval/accuracy"] == 0.0
