"""Safe evaluation of small arithmetic expressions written by a model.

Only integer literals, parentheses and the binary operators + - * / are accepted;
the expression is parsed with ``ast`` and evaluated exactly with ``Fraction``.
Nothing is ever passed to ``eval``: names, calls, attributes, powers and floats
are rejected before any arithmetic happens.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction

# Longest expression accepted. Countdown solutions are a few dozen characters; the
# bound keeps ast.parse away from pathological nesting.
MAX_EXPR_CHARS = 300

_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}

# Spellings models use for the four operators, mapped to Python's.
_REPLACEMENTS = (
    ("\\times", "*"),
    ("\\cdot", "*"),
    ("\\div", "/"),
    ("\\left", ""),
    ("\\right", ""),
    ("\u00d7", "*"),  # multiplication sign
    ("\u00f7", "/"),  # division sign
    ("\u2212", "-"),  # minus sign
    ("\u2013", "-"),  # en dash
    ("{", "("),
    ("}", ")"),
)


_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")


class ExprError(ValueError):
    """The text is not an arithmetic expression of the accepted form."""


def normalize_expression(text: str) -> str:
    """Map LaTeX/unicode operators to Python's and drop a trailing ``= value``."""
    s = text.strip()
    # \frac{a}{b} -> ((a)/(b)), innermost first so nested fractions unfold.
    for _ in range(8):
        s, n = _FRAC_RE.subn(r"((\1)/(\2))", s)
        if n == 0:
            break
    for old, new in _REPLACEMENTS:
        s = s.replace(old, new)
    # "3 * 5 + 7 = 22": the left-hand side is the expression.
    s = s.split("=", 1)[0].strip()
    return s


def parse_expression(text: str) -> ast.expr:
    """Parse and validate ``text``; raises ``ExprError`` naming the offending part."""
    s = normalize_expression(text)
    if not s:
        raise ExprError("empty expression")
    if len(s) > MAX_EXPR_CHARS:
        raise ExprError(f"expression longer than {MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(s, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ExprError(f"not an arithmetic expression: {s[:60]!r}") from e
    _validate(tree.body)
    return tree.body


def _validate(node: ast.AST) -> None:
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _OPS:
            raise ExprError(f"operator {type(node.op).__name__} is not allowed (only + - * /)")
        _validate(node.left)
        _validate(node.right)
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            raise ExprError(f"only whole numbers are allowed, got {node.value!r}")
    else:
        raise ExprError(f"{type(node).__name__} is not allowed in an arithmetic expression")


def literals(node: ast.expr) -> list[int]:
    """The integer literals of a validated expression, left to right."""
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)]


def evaluate(node: ast.expr) -> Fraction:
    """Exact value of a validated expression; ``ZeroDivisionError`` on division by zero."""
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if not isinstance(node, ast.BinOp):
        raise ExprError(
            f"{type(node).__name__} is not allowed; validate with parse_expression first"
        )
    left, right = evaluate(node.left), evaluate(node.right)
    op = type(node.op)
    if op is ast.Add:
        return left + right
    if op is ast.Sub:
        return left - right
    if op is ast.Mult:
        return left * right
    return left / right


def safe_eval(text: str) -> Fraction:
    """Parse, validate and evaluate ``text`` exactly. Raises ExprError or ZeroDivisionError."""
    return evaluate(parse_expression(text))
