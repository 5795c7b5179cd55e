"""Rule-based reward for math answers: extract the final answer, compare it to the reference.

``extract_answer`` finds the final answer in a model's output; ``score`` turns it
into a reward. Equality is decided by a fast exact/numeric check first and by the
``math-verify`` package (symbolic equivalence) otherwise. Scoring never raises on
model output: a response without an answer, with an absurdly long answer, or one
that makes the checker fail or time out scores 0 and is flagged ``malformed``.

This module imports neither torch nor sympy at import time; math-verify (and its
sympy) is loaded on the first comparison that needs it.
"""

from __future__ import annotations

import contextlib
import queue
import re
import threading
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

# Longest extracted answer that is compared at all. Real final answers are short;
# parsing a 100 KB "answer" with sympy would take the full timeout for nothing.
MAX_ANSWER_CHARS = 1000
# Longest response scanned. Beyond this the response is runaway generation.
MAX_RESPONSE_CHARS = 200_000
# How many trailing \boxed occurrences are tried before giving up (bounds the work
# on adversarial text full of unbalanced "\boxed{").
_MAX_BOX_CANDIDATES = 32

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# One character class before the colon, not "\s*\**\s*": two quantifiers that can both take a
# space split a run of n blanks n ways, and a response of "answer" and 200 KB of newlines took
# minutes to fail. Bold markers ("**Answer:** 5", "Answer: **5**") are left to ``_clean``.
_ANSWER_LINE_RE = re.compile(r"(?i)\banswer[\s*]*[:\uff1a]\s*([^\n]*)")
_INT_RE = re.compile(r"[+-]?\d+")
_DECIMAL_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_FRAC_RE = re.compile(r"([+-]?)\\[dt]?frac\{([+-]?\d+)\}\{([+-]?\d+)\}")
_SLASH_RE = re.compile(r"([+-]?\d+)/([+-]?\d+)")

REASONS = ("correct", "wrong", "no_answer", "too_long", "unparseable", "timeout", "error")


@dataclass(frozen=True)
class RewardResult:
    """Outcome of scoring one response.

    ``reward``: the scalar reward. ``parsed``: the extracted final answer (None if
    none was found). ``malformed``: no usable answer (missing, too long, unparseable,
    or the checker failed). ``correct``: the answer matches the reference.
    ``reason``: a short code for statistics and debugging; ``score`` uses ``REASONS``,
    task scorers may add their own (countdown's ``number_not_available``).
    """

    reward: float
    parsed: str | None
    malformed: bool
    correct: bool = False
    reason: str = ""


@dataclass
class RewardStats:
    """Running counters over scored responses; ``merge`` combines those of several workers."""

    total: int = 0
    correct: int = 0
    malformed: int = 0
    timeouts: int = 0
    errors: int = 0
    reward_sum: float = 0.0
    by_reason: dict[str, int] = field(default_factory=dict)

    def add(self, result: RewardResult) -> None:
        self.total += 1
        self.correct += int(result.correct)
        self.malformed += int(result.malformed)
        self.timeouts += int(result.reason == "timeout")
        self.errors += int(result.reason == "error")
        self.reward_sum += result.reward
        if result.reason:
            self.by_reason[result.reason] = self.by_reason.get(result.reason, 0) + 1

    def merge(self, other: RewardStats) -> RewardStats:
        reasons = dict(self.by_reason)
        for k, v in other.by_reason.items():
            reasons[k] = reasons.get(k, 0) + v
        return RewardStats(
            total=self.total + other.total,
            correct=self.correct + other.correct,
            malformed=self.malformed + other.malformed,
            timeouts=self.timeouts + other.timeouts,
            errors=self.errors + other.errors,
            reward_sum=self.reward_sum + other.reward_sum,
            by_reason=reasons,
        )

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    @property
    def malformed_rate(self) -> float:
        return self.malformed / self.total if self.total else 0.0

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.total if self.total else 0.0

    def as_dict(self, prefix: str = "reward/") -> dict[str, float]:
        return {
            f"{prefix}count": float(self.total),
            f"{prefix}accuracy": self.accuracy,
            f"{prefix}mean": self.mean_reward,
            f"{prefix}malformed_rate": self.malformed_rate,
            f"{prefix}timeouts": float(self.timeouts),
            f"{prefix}errors": float(self.errors),
        }


# ---------------------------------------------------------------- extraction


def _last_boxed(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}`` (or ``\\fbox{...}``), braces nested."""
    starts = [m.end() for m in _BOX_RE.finditer(text)]
    for start in reversed(starts[-_MAX_BOX_CANDIDATES:]):
        depth, i, end = 1, start, min(len(text), start + MAX_ANSWER_CHARS + 1)
        while i < end:
            c = text[i]
            if c == "\\":
                i += 2  # \{ and \} are literal braces, not grouping
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    content = text[start:i].strip()
                    if content:
                        return content
                    break
            i += 1
    return None


def _last_tagged(text: str) -> str | None:
    end = text.rfind("</answer>")
    if end < 0:
        return None
    start = text.rfind("<answer>", 0, end)
    if start < 0:
        return None
    return text[start + len("<answer>") : end].strip() or None


def _last_hashes(text: str) -> str | None:
    pos = text.rfind("####")
    if pos < 0:
        return None
    line = text[pos + 4 :].split("\n", 1)[0]
    return line.strip() or None


def _last_answer_line(text: str) -> str | None:
    found = None
    for m in _ANSWER_LINE_RE.finditer(text):
        if _clean(m.group(1)):  # "Answer: **" alone is no answer; an earlier line may be
            found = m.group(1)
    return found


def _clean(ans: str) -> str:
    # Strip wrappers a model puts around an otherwise plain answer ("**$12$**.");
    # repeat because they nest in any order.
    prev = None
    while ans != prev:
        prev = ans
        ans = ans.strip()
        if ans.endswith(".") and not ans.endswith(".."):
            ans = ans[:-1]
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**")):
            if len(ans) > len(left) + len(right) and ans.startswith(left) and ans.endswith(right):
                ans = ans[len(left) : len(ans) - len(right)]
        # A bold marker at one end only closes or opens around the "Answer:" label
        # ("**Answer: 5**", "**Answer:** 5"), or stands alone: it is no part of the answer.
        if ans == "**" or ans.startswith("**") != ans.endswith("**"):
            ans = ans[2:] if ans.startswith("**") else ans[:-2]
    return ans


def extract_answer(text: str) -> str | None:
    """The final answer in a model's output, or None.

    Preference order: the last balanced ``\\boxed{...}`` (nested braces allowed),
    then the last ``<answer>...</answer>``, then the last ``#### ...`` line, then the
    last ``Answer: ...`` line. Surrounding ``$``, ``**`` and a trailing period are
    removed. Unbalanced braces, an empty box, a box longer than ``MAX_ANSWER_CHARS``
    or no marker at all give None. A box is not required to be the final text
    (models often add a sentence after it), but the last one wins.
    """
    if not isinstance(text, str) or not text:
        return None
    if len(text) > MAX_RESPONSE_CHARS:
        # A final answer lives at the end; bound the work on runaway generations.
        text = text[-MAX_RESPONSE_CHARS:]
    for finder in (_last_boxed, _last_tagged, _last_hashes, _last_answer_line):
        found = finder(text)
        if found is not None:
            cleaned = _clean(found)
            if cleaned:
                return cleaned
    return None


# ---------------------------------------------------------------- comparison


def _normalize(s: str) -> str:
    s = s.strip()
    for junk in ("$", "\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", " "):
        s = s.replace(junk, "")
    return s.rstrip(".")


# Beyond this decimal exponent a number is not read exactly: Fraction("1e999999999") builds a
# billion-digit integer (seconds to hours, hundreds of MB), and a model can write that in 14 chars.
MAX_EXPONENT = 1000
_HUGE = object()  # stands for "a number too large to read": equal to nothing but itself


def _as_number(s: str) -> Fraction | object | None:
    """Exact value of a plain number: 12, -3.50, 1,000, 3/4, \\frac{3}{4}. Else None;
    ``_HUGE`` for a decimal whose exponent is beyond ``MAX_EXPONENT``."""
    s = _normalize(s)
    if _THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "")
    try:
        if _DECIMAL_RE.fullmatch(s):
            exp = re.search(r"[eE]([+-]?\d+)$", s)
            if exp and abs(int(exp.group(1))) > MAX_EXPONENT:
                return _HUGE
            return Fraction(s)
        m = _FRAC_RE.fullmatch(s) or _SLASH_RE.fullmatch(s)
        if m:
            groups = m.groups()
            sign = -1 if len(groups) == 3 and groups[0] == "-" else 1
            num, den = int(groups[-2]), int(groups[-1])
            return None if den == 0 else sign * Fraction(num, den)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


def _fast_compare(pred: str, gold: str) -> bool | None:
    """True/False when decidable without sympy, None when it needs math-verify."""
    if _normalize(pred) == _normalize(gold):
        return True
    p, g = _as_number(pred), _as_number(gold)
    if p is _HUGE or g is _HUGE:
        # Not read, and not handed to math-verify (whose parse would build it too): unequal
        # unless the two are written alike (checked above).
        return False
    if p is not None and g is not None:
        if p == g:
            return True
        # Two integers that differ are different answers. Decimals are left to
        # math-verify, which knows how to round (0.333333 vs 1/3).
        if _INT_RE.fullmatch(_normalize(pred).replace(",", "")) and _INT_RE.fullmatch(
            _normalize(gold).replace(",", "")
        ):
            return False
    return None


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class _Checker:
    """math-verify in a child process, for callers off the main thread.

    math-verify bounds its work with SIGALRM, which only a main thread may install; without it
    a 13-character answer such as ``10^{10^{10}}`` runs for ever. The child runs each comparison
    on its own main thread, under math-verify's timeout; should the child still not answer
    (stuck in C code no signal interrupts), it is killed and the next call starts another.
    Started on first use and shared by the threads of the process, one call at a time.
    """

    # Seconds the child may take to start and import math-verify (sympy) before its first answer.
    START_S = 120.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc = None
        self._conn = None
        self._stopped = threading.Event()  # set: the thread that started the child may end

    def _start(self) -> None:
        import os
        import subprocess
        import sys
        from multiprocessing.connection import Connection
        from pathlib import Path

        # A fresh interpreter (not multiprocessing's spawn, which re-runs the caller's __main__
        # script, nor fork, which copies locks other threads hold) that can import loomrl.
        root = str(Path(__file__).resolve().parents[1])
        paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        made: queue.SimpleQueue = queue.SimpleQueue()
        stopped = threading.Event()

        def spawn() -> None:
            # The child asks the kernel to kill it when its parent ends (a parent killed while
            # the child is stuck in C code would otherwise leave it running), and "parent"
            # there is the thread that started it: this one, which lives until _stop.
            try:
                made.put(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-c",
                            f"from loomrl.reward import _checker_main; _checker_main({os.getpid()})",
                        ],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
                    )
                )
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
                made.put(e)
                return
            stopped.wait()

        threading.Thread(target=spawn, name="loomrl-math-verify", daemon=True).start()
        proc = made.get()
        if isinstance(proc, BaseException):
            raise proc
        self._stopped = stopped
        # The Connection owns (and closes) its own copy of the descriptor.
        conn = _Pipe(Connection(os.dup(proc.stdout.fileno()), writable=False), proc.stdin)
        proc.stdout.close()
        failed: Exception | None = None
        if not conn.poll(self.START_S):
            failed = RuntimeError(
                f"the math-verify helper process did not start within {self.START_S:.0f} s"
            )
        elif (ready := conn.recv()) != "ready":  # the import failed in the child: as here
            failed = ImportError(ready)
        self._proc, self._conn = proc, conn
        if failed is not None:
            self._stop()
            raise failed

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            # Closing flushes what a send left in the buffer, into a pipe with no reader now.
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
            self._conn.reader.close()
            self._stopped.set()
        self._proc = self._conn = None

    def compare(self, pred: str, gold: str, timeout_s: int) -> tuple[bool, str]:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._stop()
                self._start()
            try:
                self._conn.send((pred, gold, timeout_s))
                # Parsing and verifying each have timeout_s in the child; one more for the pipe.
                if self._conn.poll(2 * timeout_s + 1):
                    return self._conn.recv()
            except (EOFError, OSError):  # the child died (out of memory, killed)
                self._stop()
                return False, "error"
            self._stop()
            return False, "timeout"


class _Pipe:
    """Pickled messages over a child's stdout (read) and stdin (written)."""

    def __init__(self, reader, writer) -> None:
        self.reader, self.writer = reader, writer

    def poll(self, timeout: float) -> bool:
        return self.reader.poll(timeout)

    def recv(self):
        return self.reader.recv()

    def send(self, obj) -> None:
        import pickle
        import struct

        data = pickle.dumps(obj)
        # multiprocessing's framing (a 4-byte big-endian length), so Connection can read it.
        self.writer.write(struct.pack("!i", len(data)) + data)
        self.writer.flush()


def _checker_main(parent: int) -> None:
    """The child of ``_Checker``: reads (pred, gold, timeout_s) on stdin, answers on stdout."""
    import os
    from multiprocessing.connection import Connection

    _die_with_parent(parent)

    # Messages go out on a copy of stdout; whatever a library prints goes to stderr.
    out = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    inp = Connection(0, writable=False)
    try:
        import math_verify  # noqa: F401  (the import is what the parent waits for)
    except ImportError as e:
        out.send(_MISSING_MATH_VERIFY + f" ({e})")
        return
    out.send("ready")
    while True:
        try:
            pred, gold, timeout_s = inp.recv()
        except EOFError:  # the parent is gone
            return
        out.send(_math_verify(pred, gold, timeout_s))


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the thread that started it ends (Linux; elsewhere the child
    ends at its next read, once its comparison is done)."""
    import ctypes
    import os
    import signal

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it ended before the request
        os._exit(0)


_checker = _Checker()
_MISSING_MATH_VERIFY = (
    "loomrl.reward.score needs the 'math-verify' package for symbolic answers; "
    "install it with `pip install math-verify`"
)


@lru_cache(maxsize=4096)
def _parse_boxed(expr: str, timeout: int) -> tuple:
    # Cached: in group sampling the same reference answer is compared G times.
    from math_verify import parse

    return tuple(parse("\\boxed{" + expr + "}", parsing_timeout=timeout, raise_on_error=True))


def _math_verify(pred: str, gold: str, timeout_s: int) -> tuple[bool, str]:
    """math-verify's verdict, bounded by ``timeout_s``: here on the main thread, else in the
    child process of ``_Checker``."""
    try:
        from math_verify import verify
        from math_verify.errors import TimeoutException
    except ImportError as e:  # configuration problem, not a model problem: be loud
        raise ImportError(_MISSING_MATH_VERIFY) from e
    if not _on_main_thread():
        return _checker.compare(pred, gold, timeout_s)
    try:
        gold_parsed = _parse_boxed(gold, timeout_s)
        pred_parsed = _parse_boxed(pred, timeout_s)
        if not pred_parsed:
            return False, "unparseable"
        if not gold_parsed:
            return False, "wrong"
        ok = verify(
            list(gold_parsed), list(pred_parsed), timeout_seconds=timeout_s, raise_on_error=True
        )
        return bool(ok), "correct" if ok else "wrong"
    except TimeoutException:  # a BaseException subclass in math-verify
        return False, "timeout"
    except Exception:
        # sympy can raise almost anything on adversarial input; the response is at fault.
        return False, "error"


def answers_match(pred: str, gold: str, timeout_s: int = 5) -> tuple[bool, str]:
    """Whether ``pred`` equals ``gold``: (match, reason) with reason in ``REASONS``."""
    fast = _fast_compare(pred, gold)
    if fast is not None:
        return fast, "correct" if fast else "wrong"
    return _math_verify(pred, gold, timeout_s)


def score(
    text: str,
    answer: str | int | float,
    *,
    format_reward: float = 0.0,
    timeout_s: int = 5,
) -> RewardResult:
    """Score a response against the reference ``answer``.

    Reward is 1.0 when the extracted answer is equivalent to ``answer``, otherwise
    ``format_reward`` when a well-formed answer was given (default 0: no credit for
    format alone) and 0.0 when the response is malformed. Never raises on model output.
    """
    if not 0.0 <= format_reward < 1.0:
        raise ValueError(
            f"format_reward={format_reward} must be in [0, 1): it is the partial credit for a "
            "well-formed but wrong answer, below the 1.0 of a correct one"
        )
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s < 1:
        raise ValueError(f"timeout_s={timeout_s!r} must be a whole number of seconds >= 1")
    gold = str(answer).strip()
    if "\\boxed" in gold:  # references copied from solutions sometimes keep the box
        gold = extract_answer(gold) or gold

    if not isinstance(text, str) or not text.strip():
        return RewardResult(0.0, None, True, False, "no_answer")
    if len(text) > MAX_RESPONSE_CHARS:
        return RewardResult(0.0, None, True, False, "too_long")
    parsed = extract_answer(text)
    if parsed is None:
        return RewardResult(0.0, None, True, False, "no_answer")
    if len(parsed) > MAX_ANSWER_CHARS:
        return RewardResult(0.0, parsed[:80] + "...", True, False, "too_long")

    ok, reason = answers_match(parsed, gold, timeout_s)
    if ok:
        return RewardResult(1.0, parsed, False, True, "correct")
    malformed = reason in ("unparseable", "timeout", "error")
    return RewardResult(0.0 if malformed else format_reward, parsed, malformed, False, reason)
