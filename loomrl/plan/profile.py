"""Workload profiles: what each component costs, read from YAML/JSON or fitted from measurements.

A profile says, for every component, how long one call on ``x`` items takes with
``n`` devices (``t(n, x) = alpha + x * per_item[n]``), how much memory it keeps
resident per device, what an offload+onload costs, and (optionally) how many CPU
cores it needs. This module knows nothing about plans; it never imports torch.

Beyond the baseline, ``time.item_cv`` (optional, default 0: the baseline exactly)
models long-tailed items of a data-parallel component: with one rank per device,
a call waits for the slowest rank, whose share of ``x / n`` items exceeds the mean
by about ``item_cv * sqrt(x / n) * e(n)`` item costs, ``e(k)`` being the expected
largest of ``k`` standard normal draws. Few items per rank straggle much, many
hardly at all.

``iteration_overhead_s`` (optional top-level, default 0) is what every iteration pays outside
its components' calls: the driver handing the first items out and collecting the last results.
It shifts every plan alike (plans rank the same) and is measured from a run's timeline, not
by the profiler's direct calls.

Required keys: ``devices``, ``device_memory_gb``, ``batch``, ``components``, and per component
``valid_devices`` and ``time.per_item`` for each valid count (or ``samples`` to fit them from).
Optional, with the default that keeps a term out of the model: ``time.alpha`` 0 (no fixed cost
per call), ``memory_gb`` 0 (memory never rules the component out), ``switch_s`` 0, ``cpu_cores``
none, ``granularities`` ``[batch]``, ``edges`` and ``cycles`` none. A component with
``samples`` takes missing ``per_item`` or ``memory_gb`` entries from their fit instead, and
the fit's ``alpha`` where no ``per_item`` is given (the two are fitted together).
A component's name may not contain ``<->``: plans name a declared cycle's node ``a<->b``.
Costs (seconds, GB) are at most ``MAX_MAGNITUDE`` (1e100; a call on the whole batch too) and a
cycle's steps at most ``MAX_STEPS`` (100,000): the search adds and multiplies them, and values
near float's limit overflow to inf. The batch is at most ``MAX_BATCH`` (10**12) items: micro-batch
sizes and ring groups are its divisors, found by trial division.
A component's name is visible text on one line (not empty, no line break or control character).
Every number must be finite (YAML's ``.nan`` and ``.inf`` are refused, and so are ``true`` and
``false``, which Python would take for 1 and 0); device counts, as list entries or as keys
of ``per_item``, ``memory_gb`` and ``cpu_cores``, are whole numbers of at most
``MAX_DEVICES`` (1,000,000): the search keeps arrays indexed by device count, and a count far
beyond any cluster only exhausts memory.
"""

from __future__ import annotations

import difflib
import functools
import math
import numbers
import reprlib
import unicodedata
import warnings
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from loomrl.config import (
    DuplicateKeyError,
    FileTooLarge,
    finite_number,
    load_json,
    load_yaml,
    read_utf8,
)
from loomrl.errors import ConfigError

__all__ = [
    "MAX_BATCH",
    "MAX_DEVICES",
    "ComponentProfile",
    "CycleSpec",
    "FitReport",
    "WorkloadProfile",
    "fit_component",
    "fit_line",
    "fit_profile",
    "load_profile",
]

# Extrapolating a fitted scaling law further than this factor beyond the largest
# measured device count is unreliable enough to say so.
EXTRAPOLATION_WARN_FACTOR = 8

# The most devices a profile (or ``loomrl plan --devices``) may name. The search keeps arrays of
# one entry per device count; 10**7 devices took 3.8 s and 1 GB, and far larger counts end in
# numpy's "array is too big" instead of a plan. No cluster comes near a million accelerators.
MAX_DEVICES = 1_000_000

# The largest cost (seconds, GB) a profile may state. The search adds a plan's costs and
# multiplies them by the batch, a cycle's steps and the number of micro-batches; values near
# float's limit (1.8e308) overflow to inf there, which reads as a plan that does not fit. No
# workload comes near 1e100 (the universe is 4e17 s old), and it leaves room for every product.
MAX_MAGNITUDE = 1e100

# The most steps a cycle may run per iteration. The predicted timeline walks through every one
# (10**6 steps took 6 s per plan), and an agent's turns or an environment's steps per iteration
# are far fewer.
MAX_STEPS = 100_000

# The most work items a batch may hold. Micro-batch sizes and a cycle's ring groups are divisors
# of it, found by trial division up to its square root: 10**6 trials here, and a batch of 10**18
# took minutes. No iteration of RL comes near a trillion items.
MAX_BATCH = 10**12

# The largest profile file read (a profile with thousands of samples is a few MB); a larger one is
# another file named by mistake (a checkpoint), which would be read whole into memory.
MAX_PROFILE_BYTES = 64 * 2**20

# A fit whose samples stray this far from it on average (relative) is said to be poor.
POOR_FIT = 0.25

# Joins a 2-cycle's members into the name of its plan node ('env<->policy'); no component's name
# may contain it.
CYCLE_JOIN = "<->"


@dataclass(frozen=True)
class ComponentProfile:
    """Cost model of one component.

    ``per_item``, ``memory_gb`` and ``cpu_cores`` are keyed by device count and
    cover every entry of ``valid_devices``. A device count of 0 means the component runs on
    host CPU cores alone (a simulator beside accelerators); only a cycle member may have it,
    and its ``memory_gb[0]`` is host memory, which no device's budget carries.
    """

    name: str
    valid_devices: tuple[int, ...]
    alpha: float
    per_item: dict[int, float]
    memory_gb: dict[int, float]
    switch_s: float = 0.0
    cpu_cores: dict[int, int] | None = None

    item_cv: float = 0.0  # coefficient of variation of one item's cost (long tails)

    def time(self, n: int, items: float) -> float:
        """Seconds for one call on ``items`` items with ``n`` devices."""
        t = self.alpha + items * self.per_item[n]
        if self.item_cv and n > 1 and items > 0:
            ranks = min(n, max(1, round(items)))
            t += self.item_cv * self.per_item[n] * math.sqrt(items * n) * expected_max_normal(ranks)
        return t

    def cores(self, n: int) -> int:
        return 0 if self.cpu_cores is None else int(self.cpu_cores[n])


@functools.lru_cache(maxsize=4096)
def expected_max_normal(k: int) -> float:
    """E[max of k independent standard normals] (Blom's approximation; 0 for k = 1)."""
    if k <= 1:
        return 0.0
    return NormalDist().inv_cdf((k - 0.375) / (k + 0.25))


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n`` >= 1, ascending; O(sqrt(n)), so a batch of 10**9 takes
    31,623 trials, not 10**9."""
    low, high = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            low.append(d)
            if d * d != n:
                high.append(n // d)
        d += 1
    return low + high[::-1]


def nearest(values: Sequence[int], target: int, count: int) -> list[int]:
    """The ``count`` entries of ``values`` closest to ``target`` (ties: the smaller), ascending:
    what a message suggests in place of a refused value when the whole list is too long."""
    return sorted(sorted(values, key=lambda v: (abs(v - target), v))[:count])


@dataclass(frozen=True)
class CycleSpec:
    """A 2-cycle ``members[0] <-> members[1]`` run for ``steps`` steps per iteration.

    ``overlap_slowdown`` (>= 1): how much longer each side's call takes while the other side
    runs beside it, as in a split cycle with k >= 2 ring groups (a shared renderer, host cores
    or memory bandwidth); 1 = the sides do not slow each other (the baseline model).

    ``hop_s`` (>= 0): seconds per step that a group's round trip A -> B -> A spends between the
    two sides' calls (handing results over: process hops, queues), during which neither side is
    busy. A component's ``time`` is then what keeps its worker busy; with k >= 2 ring groups
    the other groups' calls fill the hops, so a step takes max(k * busier side, a + b + hop).
    0 = hand-offs are free or already in the components' times (the baseline model).

    ``min_group`` (>= 1): the fewest items a ring group may hold (k >= 2 groups of M / k items
    need M / k >= min_group). Measured costs describe the group sizes they were measured at; a
    fit carried far below them mispriced small groups (per call costs that the fit did not see:
    k = 32 groups of 2 envs ran twice the rollout of k = 4, which the fit priced about the same).
    1 = any k (the baseline model).

    ``ends_with`` (a member): the side whose call ends a group's iteration. The default, the
    second member, gives each group ``steps`` calls of each side (a -> b, S times). The first
    member gives S calls of a and S - 1 of b (a -> b -> ... -> a): an agent's turns around its
    tool calls, where the last turn answers and calls no tool.
    """

    members: tuple[str, str]
    steps: int
    overlap_slowdown: float = 1.0
    hop_s: float = 0.0
    min_group: int = 1
    ends_with: str | None = None  # None: members[1] (the baseline model)

    @property
    def last_b(self) -> bool:
        """Whether the last step calls the second member (the baseline); False: it ends on a."""
        return self.ends_with in (None, self.members[1])

    def group_counts(self, items: int, limited: bool = True) -> list[int]:
        """The ring-group counts k a split cycle on ``items`` items may use: k divides items,
        and (``limited``) k = 1 or each group holds at least ``min_group`` items."""
        least = self.min_group if limited else 1
        return [k for k in divisors(items) if k == 1 or items // k >= least]

    def to_dict(self) -> dict[str, Any]:
        """The raw form ``load_profile`` reads; fields at their baseline value are left out."""
        return {
            "members": list(self.members),
            "steps": self.steps,
            **({"overlap_slowdown": self.overlap_slowdown} if self.overlap_slowdown != 1 else {}),
            **({"hop_s": self.hop_s} if self.hop_s else {}),
            **({"min_group": self.min_group} if self.min_group != 1 else {}),
            **({"ends_with": self.members[0]} if not self.last_b else {}),
        }

    @property
    def name(self) -> str:
        return f"{self.members[0]}{CYCLE_JOIN}{self.members[1]}"


@dataclass(frozen=True)
class WorkloadProfile:
    devices: int
    device_memory_gb: float
    batch: int
    granularities: tuple[int, ...]
    components: dict[str, ComponentProfile]
    edges: tuple[tuple[str, str], ...] = ()
    cycles: tuple[CycleSpec, ...] = ()
    cpu_cores_per_node: int | None = None
    devices_per_node: int | None = None
    iteration_overhead_s: float = 0.0  # per iteration, outside every component's calls
    fit_reports: tuple[FitReport, ...] = field(default=(), compare=False)

    @property
    def nodes(self) -> int:
        if not self.devices_per_node:
            return 1
        return max(1, math.ceil(self.devices / self.devices_per_node))

    @property
    def cpu_core_budget(self) -> float:
        """Cores available to concurrently running components (inf when unconstrained)."""
        if self.cpu_cores_per_node is None:
            return math.inf
        return float(self.cpu_cores_per_node * self.nodes)

    def with_devices(self, devices: int) -> WorkloadProfile:
        from dataclasses import replace

        problems: list[str] = []
        n = _device_count(devices, "devices", problems)
        if n is None:  # a search's own device count (search_all(profile, devices)) past the limit
            raise ConfigError(problems)
        return replace(self, devices=n)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "devices": self.devices,
            "device_memory_gb": self.device_memory_gb,
            "batch": self.batch,
            "granularities": list(self.granularities),
            "components": {},
            "edges": [list(e) for e in self.edges],
            "cycles": [c.to_dict() for c in self.cycles],
        }
        if self.cpu_cores_per_node is not None:
            out["cpu_cores_per_node"] = self.cpu_cores_per_node
        if self.devices_per_node is not None:
            out["devices_per_node"] = self.devices_per_node
        if self.iteration_overhead_s:
            out["iteration_overhead_s"] = self.iteration_overhead_s
        for name, c in self.components.items():
            d: dict[str, Any] = {
                "valid_devices": list(c.valid_devices),
                "time": {"alpha": c.alpha, "per_item": dict(c.per_item)},
                "memory_gb": dict(c.memory_gb),
                "switch_s": c.switch_s,
            }
            if c.item_cv:
                d["time"]["item_cv"] = c.item_cv
            if c.cpu_cores is not None:
                d["cpu_cores"] = dict(c.cpu_cores)
            out["components"][name] = d
        return out


@dataclass(frozen=True)
class FitReport:
    """How well ``t(n, x) = alpha + x * per_item[n]`` matches the measured samples."""

    component: str
    n_samples: int
    measured_devices: tuple[int, ...]
    extrapolated_devices: tuple[int, ...]
    exponent: float  # per_item(n) ~ c * n ** -exponent
    rel_err_mean: float
    rel_err_max: float
    memory_rel_err_max: float

    def __str__(self) -> str:
        text = (
            f"{self.component}: {self.n_samples} samples, mean rel. error "
            f"{100 * self.rel_err_mean:.2f}%, max {100 * self.rel_err_max:.2f}%, "
            f"per_item ~ n^{-self.exponent:.3f}, extrapolated to "
            f"{count_ranges(self.extrapolated_devices)}"
        )
        if self.rel_err_mean > POOR_FIT:
            text += (
                " (a poor fit: the samples vary more than alpha + x * per_item[n] explains, "
                "so predictions from it are rough; calls too short to time well, or a noisy "
                "host? measure longer calls, e.g. a larger batch or run.profile_budget)"
            )
        return text


def count_ranges(counts) -> str:
    """Device counts as short runs, e.g. [3, 5, 6, 7, 9] -> '3, 5-7, 9' (a profile may allow
    every count of 1..4,096)."""
    runs: list[list[int]] = []
    for n in sorted(counts):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"


def fit_line(pts: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (alpha, per_item) of t = alpha + x * per_item over the medians per x of
    (x, seconds) samples, both clamped >= 0 (one size alone: all of it per item)."""
    by_x: dict[float, list[float]] = {}
    for x, t in pts:
        by_x.setdefault(x, []).append(t)
    if not by_x:
        raise ValueError("fit_line: no samples")
    xs = np.array(sorted(by_x), float)
    ts = np.array([float(np.median(by_x[x])) for x in sorted(by_x)])
    if len(xs) == 1:
        return 0.0, float(ts[0] / xs[0])
    per, alpha = np.polyfit(xs, ts, 1)
    if alpha < 0:
        return 0.0, float((ts @ xs) / (xs @ xs))
    if per < 0:
        return float(ts.mean()), 0.0
    return float(alpha), float(per)


# --------------------------------------------------------------------------- loading

_TOP_KEYS = {
    "devices",
    "device_memory_gb",
    "batch",
    "granularities",
    "components",
    "edges",
    "cycles",
    "cpu_cores_per_node",
    "devices_per_node",
    "iteration_overhead_s",
}
_REQUIRED = {
    "devices": "how many devices to plan for",
    "device_memory_gb": "GB of memory per device",
    "batch": "work items per iteration",
    "components": "name -> {valid_devices, time, memory_gb}",
}
_LISTED = 8  # the most alternatives a message lists
_S, _GB = " of seconds", " of GB"  # units a refused number's problem names
_COMPONENT_KEYS = {"valid_devices", "time", "memory_gb", "switch_s", "cpu_cores", "samples"}
_TIME_KEYS = {"alpha", "per_item", "item_cv"}
_CYCLE_KEYS = {"members", "steps", "overlap_slowdown", "hop_s", "min_group", "ends_with"}


def _unknown(keys: Iterable[str], known: set[str], where: str, problems: list[str]) -> None:
    """A problem per unknown key with a close known one (a typo), and one for all the others
    together, listing the known keys once."""
    others = []
    for k in keys:
        if k not in known:
            close = difflib.get_close_matches(str(k)[:100], sorted(known), n=1)
            if close:
                problems.append(f"{where}: unknown key {_shown(k)}; did you mean {close[0]!r}?")
            else:
                others.append(k)
    if others:
        listed = ", ".join(map(_shown, others[:_LISTED])) + (
            f" and {len(others) - _LISTED} more" if len(others) > _LISTED else ""
        )
        s = "s" if len(others) > 1 else ""
        problems.append(f"{where}: unknown key{s} {listed}; known keys: {sorted(known)}")


def _short_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 2, 80, 80, 40
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = r.maxfrozenset = 8
    return r


_SHORT = _short_repr()


def _shown(v: Any) -> str:
    """``repr(v)`` cut short (``reprlib``): a value a message quotes from the profile may be
    vast (a YAML alias nested nine deep stands for 9**9 items; its full repr took seconds and
    hundreds of MB of message)."""
    return _SHORT.repr(v)


def _got(v: Any) -> str:
    """How a refused value reads in a message, with what it was taken for where that misleads."""
    if isinstance(v, (bool, np.bool_)):
        return f"{v!r} (a bool, not a number)"
    if isinstance(v, str):
        return f"{_shown(v)} (a string)"
    return _shown(v)


def _number(
    v: Any,
    key: str,
    problems: list[str],
    what: str,
    least: float = 0.0,
    above: bool = False,
    unit: str = "",
) -> float | None:
    """``v`` as a float if it is a finite number >= ``least`` (> with ``above``); else None, and a
    problem naming ``key``, the value and what is allowed (``what``: the number's meaning;
    ``unit``: " of seconds", " of GB")."""
    x = finite_number(v)
    if x is not None and (x > least if above else x >= least):
        return x
    bound = f"{'>' if above else '>='} {least:g}"
    problems.append(f"{key} must be a number{unit} {bound} and finite ({what}), got {_got(v)}")
    return None


def _huge(value: float | None, key: str, problems: list[str], unit: str = "") -> None:
    """A problem if ``value`` is past ``MAX_MAGNITUDE`` (None: already refused, nothing to say)."""
    if value is not None and not value <= MAX_MAGNITUDE:  # NaN (of a fit) too
        problems.append(f"{key} is {value:g}{unit}, {_PAST_LIMIT}")


_PAST_LIMIT = (
    f"past the planner's limit of {MAX_MAGNITUDE:g} (its sums and products of costs would "
    "overflow to inf); check the value and its unit"
)


def _too_large(comp: ComponentProfile, batch: int, problems: list[str]) -> None:
    """Problems for a component's costs past ``MAX_MAGNITUDE``: its fixed cost, its cost of the
    whole batch on each device count (what its longest call costs), its switch and memory."""
    where = f"components.{comp.name}"
    _huge(comp.alpha, f"{where}.time.alpha", problems, " s")
    # per_item * batch itself may overflow: compare per_item with the limit over the batch
    for ns, v in _by_value(comp.per_item, MAX_MAGNITUDE / batch):
        problems.append(
            f"{where}.time.per_item[{ns}] is {v:g} s an item; on the batch of {batch} items "
            f"that is {_PAST_LIMIT}"
        )
    _huge(comp.item_cv, f"{where}.time.item_cv", problems)
    _huge(comp.switch_s, f"{where}.switch_s", problems, " s")
    for ns, v in _by_value(comp.memory_gb, MAX_MAGNITUDE):
        problems.append(f"{where}.memory_gb[{ns}] is {v:g} GB, {_PAST_LIMIT}")


def _by_value(values: Mapping[int, float], limit: float) -> list[tuple[str, float]]:
    """The entries of a device count -> value mapping past ``limit``, one (counts, value) per
    distinct value: one number given for every count is said once."""
    by_value: dict[float, list[int]] = {}
    for n, v in sorted(values.items()):
        if not v <= limit:  # NaN (of a fit) too
            by_value.setdefault(v, []).append(n)
    return [(count_ranges(ns), v) for v, ns in by_value.items()]


def _whole(v: Any) -> int | None:
    """``v`` as an int if it is an integer (numpy's too) or a string of one (JSON object keys
    are strings); None for anything else, 1.5 and True included."""
    if isinstance(v, (bool, np.bool_)):
        return None
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return None
    return None


def _listed(raw: Mapping[str, Any], key: str, shape: str, problems: list[str]) -> list[Any]:
    """``raw[key]`` as a list (none: empty); anything else is a problem."""
    v = raw.get(key)
    if v is None:
        return []
    if not isinstance(v, Sequence) or isinstance(v, str):
        problems.append(f"{key} must be a list {shape}, got {_got(v)}")
        return []
    return list(v)


def _device_count(v: Any, key: str, problems: list[str], least: int = 1) -> int | None:
    """A device count: a whole number from ``least`` to ``MAX_DEVICES``."""
    n = _whole(v) if not isinstance(v, str) else None
    if n is None or not least <= n <= MAX_DEVICES:
        problems.append(
            f"{key} must be a whole number of devices from {least} to {MAX_DEVICES:,} (the "
            f"planner's limit), got {_got(v)}"
        )
        return None
    return n


def _count_map(
    raw: Any, where: str, problems: list[str], value, what: str, one: bool = False
) -> dict[int, Any] | None:
    """A mapping device count -> value; ``value(v, key)`` checks one value (and says what is
    wrong). A value that is refused is reported and kept with a stand-in, so the profile fails
    on that problem alone, not also on a device count said to be missing. ``one``: a single
    number for every count is allowed too (the message says so)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        either = f"one number of {what} or " if one else ""
        problems.append(
            f"{where} must be {either}a mapping from device count to {what} (e.g. "
            f"{{1: ..., 2: ...}}), got {_got(raw)}"
        )
        return None
    out: dict[int, Any] = {}
    for k, v in raw.items():
        n = _whole(k)
        if n is None or not 0 <= n <= MAX_DEVICES:
            problems.append(
                f"{where} has key {_shown(k)}, which is not a device count; keys are whole numbers "
                f"of devices from 0 to {MAX_DEVICES:,}, as in valid_devices"
            )
            continue
        got = value(v, f"{where}[{_shown(k)}]")
        out[n] = 0 if got is None else got
    return out


def _int_text(n: int) -> str:
    """A whole number as a message shows it: with thousands separators, or, past 15 digits,
    by its length (a 300-digit number says nothing more digit by digit)."""
    return f"{n:,}" if abs(n) < 10**15 else f"a number of {len(str(abs(n)))} digits"


def _positive_int(raw: Any, key: str, problems: list[str]) -> int | None:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        problems.append(f"{key} must be a positive integer, got {_got(raw)}")
        return None
    return raw


def parse_error_text(e: Exception) -> str:
    """A YAML or JSON syntax error as one line with its position: the YAML reader's own text
    spans several lines (the offending line, a caret under it, "<unicode string>")."""
    import yaml

    if isinstance(e, yaml.MarkedYAMLError):

        def at(mark) -> str:
            return f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""

        text = f"{e.problem or 'malformed YAML'}{at(e.problem_mark)}"
        if e.context:
            text += f" ({e.context}{at(e.context_mark)})"
        return text
    return " ".join(x.strip() for x in str(e).splitlines() if x.strip())


def _too_big(path: Path, size: int) -> str:
    return (
        f"profile file {str(path)!r} holds more than {MAX_PROFILE_BYTES // 2**20} MB"
        + (f" ({size / 2**20:,.0f} MB)" if size > MAX_PROFILE_BYTES + 1 else "")
        + "; a workload profile is a small YAML or JSON file (is it the right file? `loomrl "
        "profile CONFIG` writes one as profile.yaml)"
    )


def load_profile(
    source: str | Path | Mapping[str, Any], devices: int | None = None
) -> WorkloadProfile:
    """Read and validate a profile from a YAML/JSON file path or an already-parsed dict.

    Every problem found is reported at once in one :class:`ConfigError`.
    ``devices`` overrides the profile's device count (the CLI's ``--devices``).
    """
    where = "profile"
    if isinstance(source, Mapping):
        raw = dict(source)
    else:
        path = Path(source)
        where = str(path)
        if not path.exists():
            raise ConfigError([f"profile file {str(path)!r} does not exist"], source=where)
        if path.is_dir():
            raise ConfigError(
                [f"profile file {str(path)!r} is a directory; name a YAML or JSON file"],
                source=where,
            )
        if path.is_char_device() or path.is_block_device():  # /dev/zero: a read never ends
            raise ConfigError(
                [f"profile file {str(path)!r} is a device, not a file; name a YAML or JSON file"],
                source=where,
            )
        if path.is_file() and path.stat().st_size > MAX_PROFILE_BYTES:
            # a checkpoint or a model named by mistake: reading it whole took seconds and GBs
            raise ConfigError([_too_big(path, path.stat().st_size)], source=where)
        try:
            text = read_utf8(path, MAX_PROFILE_BYTES)
        except FileTooLarge as e:
            raise ConfigError([_too_big(path, e.args[0])], source=where) from None
        except ValueError as e:
            at, byte = e.args
            raise ConfigError([f"{at} is not UTF-8 text ({byte})"], source=where) from None
        except OSError as e:  # not readable by this user, say
            raise ConfigError(
                [f"profile file {str(path)!r} cannot be read ({e.strerror})"], source=where
            ) from None
        try:
            raw = load_json(text) if path.suffix.lower() == ".json" else load_yaml(text)
        except DuplicateKeyError as e:  # a cost given twice: the file's author meant one of them
            raise ConfigError([e.message()], source=where) from None
        except Exception as e:  # malformed syntax: say where, not a traceback
            raise ConfigError(
                [f"cannot parse {path.name}: {parse_error_text(e)}"], source=where
            ) from None
    if not isinstance(raw, Mapping):
        raise ConfigError(
            [f"the profile must be a mapping, got {type(raw).__name__}"], source=where
        )
    if "tree" in raw and "components" not in raw:
        raise ConfigError(
            [
                "this is a plan (it has a 'tree'), not a workload profile: run it with "
                "placement=<this file>, or plan from a profile (loomrl profile CONFIG writes one)"
            ],
            source=where,
        )
    if "recipe" in raw and "components" not in raw:
        # Else each of the config's sections is an unknown key, each listing the known ones.
        raise ConfigError(
            [
                f"this is a recipe config (recipe: {raw['recipe']}), not a workload profile: "
                "plan from the profile.json that `loomrl run CONFIG` writes to its "
                "run.output_dir (or the profile.yaml of `loomrl profile CONFIG`)"
            ],
            source=where,
        )
    if devices is not None:
        raw["devices"] = devices
    # What is odd but plannable is said for a file (a person wrote it), not for a mapping made
    # in code (tests' random instances, the profiler's fit)
    return _build(raw, where, warn=not isinstance(source, Mapping))


def _build(raw: Mapping[str, Any], where: str, warn: bool = False) -> WorkloadProfile:
    problems: list[str] = []
    _unknown(raw.keys(), _TOP_KEYS, "top level", problems)
    for key, what in _REQUIRED.items():
        if key not in raw:
            problems.append(f"missing required key {key!r} ({what})")
    # A missing key is said once, above; its stand-in is never checked as a value.
    n_dev = _device_count(raw["devices"], "devices", problems) if "devices" in raw else 1
    mem_cap = (
        _number(
            raw["device_memory_gb"],
            "device_memory_gb",
            problems,
            "per device",
            above=True,
            unit=_GB,
        )
        if "device_memory_gb" in raw
        else None
    )
    _huge(mem_cap, "device_memory_gb", problems, " GB")
    batch_ok = "batch" in raw and _positive_int(raw["batch"], "batch", problems) is not None
    if batch_ok and raw["batch"] > MAX_BATCH:
        problems.append(
            f"batch must be at most {MAX_BATCH:,} work items per iteration (micro-batch sizes "
            f"and ring groups are its divisors, which the planner lists), got "
            f"{_int_text(raw['batch'])}"
        )
        batch_ok = False
    batch = int(raw["batch"]) if batch_ok else 1
    grans = raw.get("granularities", [batch])
    if not isinstance(grans, Sequence) or isinstance(grans, str) or not grans:
        problems.append(f"granularities must be a non-empty list of integers, got {_got(grans)}")
        grans = [batch]
    good_grans = []
    for g in grans:
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            problems.append(f"granularities: {_got(g)} is not a positive integer")
        elif batch % g and batch_ok:  # without a batch, checking against a stand-in misleads
            ok = divisors(batch)
            some = (
                f"one of {ok}"
                if len(ok) <= _LISTED
                else f"a divisor of it, e.g. {nearest(ok, g, _LISTED)} ({len(ok)} in all)"
            )
            problems.append(f"granularities: {g} does not divide batch={batch}; use {some}")
        else:
            good_grans.append(g)
    cores_per_node = raw.get("cpu_cores_per_node")
    if cores_per_node is not None:
        cores_per_node = _positive_int(cores_per_node, "cpu_cores_per_node", problems)
    dpn = raw.get("devices_per_node")
    if dpn is not None:
        dpn = _positive_int(dpn, "devices_per_node", problems)
    overhead = raw.get("iteration_overhead_s", 0.0)
    if (x := finite_number(overhead)) is not None and x >= 0:
        overhead = x
        _huge(x, "iteration_overhead_s", problems, " s")
    else:
        problems.append(
            f"iteration_overhead_s: must be a number of seconds >= 0 and finite (what each "
            f"iteration pays outside its components' calls; 0 = none), got {_got(overhead)}"
        )
        overhead = 0.0

    comps_raw = raw.get("components")
    if "components" in raw and (not isinstance(comps_raw, Mapping) or not comps_raw):
        problems.append(
            f"components must be a non-empty mapping of name -> component, got {_got(comps_raw)}"
        )
    if not isinstance(comps_raw, Mapping) or not comps_raw:
        comps_raw = {}
    components: dict[str, ComponentProfile] = {}
    reports: list[FitReport] = []
    notes: list[str] = []  # what a warning says once the profile is valid
    for name, craw in comps_raw.items():
        if (
            name is None
            or isinstance(name, bool)
            or not str(name).strip()
            or any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in str(name))
        ):
            # plans, messages and the tree print the name on a line of its own: an empty one
            # reads as nothing, a line break or control character breaks the line
            problems.append(
                f"components: name {_shown(name)} is not a usable component name; name each "
                "component with visible text on one line (such as 'rollout')"
            )
            continue
        if CYCLE_JOIN in str(name):
            # a plan names a declared 2-cycle a <-> b as one node 'a<->b'; a component so named
            # would be taken for that node (or for one that does not exist)
            problems.append(
                f"components: name {_shown(str(name))} contains {CYCLE_JOIN!r}, which plans keep for "
                f"cycle nodes (cycle a <-> b is named 'a{CYCLE_JOIN}b'); rename the component"
            )
        comp, rep = _build_component(str(name), craw, problems, notes)
        if comp is not None:
            components[str(name)] = comp
            _too_large(comp, batch, problems)
        if rep is not None:
            reports.append(rep)

    # Without components (missing or not a mapping, said above) every name would be unknown:
    # edges and cycles are then checked for their shape only.
    names: set[Any] | None = set(comps_raw.keys()) or None

    def unknown(v: Any) -> bool:
        return names is not None and (not isinstance(v, Hashable) or v not in names)

    edges: list[tuple[str, str]] = []
    for e in _listed(raw, "edges", "[[source, destination], ...]", problems):
        if not isinstance(e, Sequence) or isinstance(e, str) or len(e) != 2:
            problems.append(f"edges: {_got(e)} is not a pair [source, destination]")
            continue
        bad = names is None
        for v in e:
            if unknown(v):
                close = difflib.get_close_matches(
                    v if isinstance(v, str) else _shown(v), sorted(map(str, names or ())), n=1
                )
                hint = f"; did you mean {close[0]!r}?" if close else ""
                problems.append(
                    f"edges: {_shown(list(e))} names unknown component {_shown(v)}{hint}"
                )
                bad = True
        if e[0] == e[1]:
            problems.append(f"edges: self-loop {list(e)} is not allowed")
            bad = True
        if not bad:
            edges.append((str(e[0]), str(e[1])))

    cycles: list[CycleSpec] = []
    declared: set[str] = set()  # every member named by a well-formed pair of members
    for i, c in enumerate(_listed(raw, "cycles", "[{members: [a, b], steps: S}, ...]", problems)):
        if not isinstance(c, Mapping):
            problems.append(
                f"cycles[{i}] must be a mapping {{members: [a, b], steps: S}}, got {_got(c)}"
            )
            continue
        _unknown(c.keys(), _CYCLE_KEYS, f"cycles[{i}]", problems)
        members = c.get("members")
        if not isinstance(members, Sequence) or isinstance(members, str) or len(members) != 2:
            problems.append(
                f"cycles[{i}].members must list exactly 2 components (a 2-cycle), got {_got(members)}"
            )
            continue
        if members[0] == members[1]:
            problems.append(
                f"cycles[{i}].members names {_shown(members[0])} twice; a cycle's two members must be "
                f"different components (a <-> b), got {_shown(list(members))}"
            )
            continue
        for v in members:
            if unknown(v):
                problems.append(f"cycles[{i}].members names unknown component {_shown(v)}")
        declared.update(str(v) for v in members)  # a cycle refused for its values is still one
        steps = _positive_int(c.get("steps"), f"cycles[{i}].steps", problems)
        if steps is not None and steps > MAX_STEPS:
            got = _int_text(steps)
            problems.append(
                f"cycles[{i}].steps must be at most {MAX_STEPS:,} (the planner steps through "
                f"each of a cycle's steps when it predicts a timeline), got {got}"
            )
            steps = None
        slow = _number(
            c.get("overlap_slowdown", 1.0),
            f"cycles[{i}].overlap_slowdown",
            problems,
            "how much longer a side's call takes while the other runs beside it; 1 = not at all",
            least=1.0,
        )
        hop = _number(
            c.get("hop_s", 0.0),
            f"cycles[{i}].hop_s",
            problems,
            "seconds per step between the sides' calls, in which neither is busy; 0 = none",
        )
        _huge(hop, f"cycles[{i}].hop_s", problems, " s")
        _huge(slow, f"cycles[{i}].overlap_slowdown", problems)
        min_group = c.get("min_group", 1)
        if isinstance(min_group, bool) or not isinstance(min_group, int) or min_group < 1:
            problems.append(
                f"cycles[{i}].min_group must be an integer >= 1 (the fewest items a ring group "
                f"may hold; 1 = any), got {_got(min_group)}"
            )
            min_group = 1
        ends_with = c.get("ends_with")
        if ends_with is not None and ends_with not in members:
            problems.append(
                f"cycles[{i}].ends_with must name one of the members {_shown(list(members))} (the "
                f"side whose call ends a group's iteration; default {_shown(members[1])}), got "
                f"{_got(ends_with)}"
            )
            ends_with = None
        if steps and slow is not None and hop is not None and not any(map(unknown, members)):
            pair = (str(members[0]), str(members[1]))
            ends = None if ends_with in (None, pair[1]) else pair[0]
            cycles.append(CycleSpec(pair, steps, slow, hop, min_group, ends))
    seen: dict[str, int] = {}
    for i, c in enumerate(cycles):
        for v in c.members:
            if v in seen:
                problems.append(
                    f"component {v!r} is in cycles[{seen[v]}] and cycles[{i}]; a component may join one cycle"
                )
            seen[v] = i
    for name, comp in components.items():
        if 0 in comp.valid_devices and name not in declared:
            problems.append(
                f"components.{name}.valid_devices has 0 (host CPU cores only), which only a cycle "
                f"member may have (a cycle split can run one side beside the other's devices); "
                f"drop 0 or declare the cycle under 'cycles'"
            )

    if not problems:
        from loomrl.plan.graph import undeclared_cycles

        for scc in undeclared_cycles(list(components), edges, cycles):
            inside = [
                f"cycles[{i}] ({c.members[0]} <-> {c.members[1]}, which runs both ways)"
                for i, c in enumerate(cycles)
                if set(c.members) <= scc
            ]
            if inside:
                # a path out of a declared cycle and back into it: one node in the plan, it
                # would have to run both before and after the components on that path
                problems.append(
                    f"edges form a cycle among {sorted(scc)} through {' and '.join(inside)}: "
                    "a path leaves the cycle and comes back into it, so no plan can order it; "
                    "remove an edge of that path, or declare a cycle only between components "
                    "that exchange data directly (2-cycles only)"
                )
            else:
                problems.append(
                    f"edges form a cycle among {sorted(scc)} that is not declared under "
                    "'cycles'; declare it as {members: [a, b], steps: S} (2-cycles only) or "
                    "remove an edge"
                )
    if problems:
        raise ConfigError(problems, source=where)
    notes += _unlinked(list(components), edges, cycles)
    for note in notes if warn else ():  # plannable, but likely not what its author meant
        warnings.warn(f"{where}: {note}", stacklevel=3)
    return WorkloadProfile(
        devices=int(n_dev or 1),
        device_memory_gb=float(mem_cap or 0),
        batch=batch,
        granularities=tuple(sorted(set(good_grans))),
        components=components,
        edges=tuple(edges),
        cycles=tuple(cycles),
        cpu_cores_per_node=cores_per_node,
        devices_per_node=dpn,
        iteration_overhead_s=float(overhead),
        fit_reports=tuple(reports),
    )


def _unlinked(names: list[str], edges: Sequence[tuple[str, str]], cycles) -> list[str]:
    """Notes on components of a workflow of several that no edge or cycle links to the others:
    the planner takes them as independent (free to run side by side with no data between),
    which an RL workflow's components rarely are; a forgotten edge plans a wrong overlap."""
    if len(names) < 2:
        return []
    if not edges and not cycles:
        return [
            f"{len(names)} components and no edges: the planner takes them as independent of "
            "each other (no data flows between them, so they may run side by side); add "
            "edges: [[source, destination], ...] for the workflow's data flow"
        ]
    linked = {x for e in edges for x in e} | {m for c in cycles for m in c.members}
    alone = [n for n in names if n not in linked]
    if not alone:
        return []
    return [
        f"component(s) {alone} are in no edge or cycle: the planner takes them as independent "
        "of the others (no data flows to or from them, so they may run side by side with "
        "them); add their edges if data flows"
    ]


def _build_component(
    name: str, craw: Any, problems: list[str], notes: list[str] | None = None
) -> tuple[ComponentProfile | None, FitReport | None]:
    """One component from its raw mapping; what is wrong goes to ``problems``, what is odd but
    plannable (values for device counts that valid_devices leaves out) to ``notes``."""
    where = f"components.{name}"
    if not isinstance(craw, Mapping):
        problems.append(f"{where} must be a mapping, got {_got(craw)}")
        return None, None
    _unknown(craw.keys(), _COMPONENT_KEYS, where, problems)
    valid = craw.get("valid_devices")
    if (
        not isinstance(valid, Sequence)
        or isinstance(valid, str)
        or not valid
        or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_DEVICES for v in valid
        )
    ):
        problems.append(
            f"{where}.valid_devices must be a non-empty list of device counts from 1 to "
            f"{MAX_DEVICES:,} (0: host CPU cores only, for cycle members), got {_got(valid)}"
        )
        return None, None
    valid_t = tuple(sorted(set(valid)))
    samples = craw.get("samples")  # None: not given (an empty list or 0 is refused, not ignored)
    rows = (
        _sample_rows(name, samples, f"{where}.samples", problems) if samples is not None else None
    )
    time_raw = craw.get("time")
    if time_raw is None:
        time_raw = {}
        if samples is None:
            problems.append(
                f"{where}: missing required key 'time' ({{alpha, per_item}}: one call on x "
                f"items with n devices takes alpha + x * per_item[n] seconds); add it, or "
                f"'samples' to fit it from"
            )
    elif not isinstance(time_raw, Mapping):
        problems.append(f"{where}.time must be a mapping {{alpha, per_item}}, got {_got(time_raw)}")
        time_raw = {}
    elif "per_item" not in time_raw and samples is None:
        problems.append(
            f"{where}.time: missing required key 'per_item' (seconds per item for each count "
            f"of valid_devices, e.g. {{1: 2.0, 2: 1.05}}); add it, or 'samples' to fit it from"
        )
    _unknown(time_raw.keys(), _TIME_KEYS, f"{where}.time", problems)

    alpha = None  # None: not given (0, or the samples' fit)
    if "alpha" in time_raw:
        alpha = _number(
            time_raw["alpha"], f"{where}.time.alpha", problems, "each call's fixed cost", unit=_S
        )
        alpha = 0.0 if alpha is None else alpha
    per_raw = time_raw.get("per_item")
    per_item = _count_map(
        per_raw,
        f"{where}.time.per_item",
        problems,
        lambda v, at: _number(v, at, problems, "per item on this many devices", unit=_S),
        "seconds per item",
    )
    if per_item is None:  # not given (said above, or fitted), or refused: no count is missing
        per_item = {} if per_raw is None else {n: 0.0 for n in valid_t}
    item_cv = _number(
        time_raw.get("item_cv", 0.0),
        f"{where}.time.item_cv",
        problems,
        "spread of one item's cost relative to its mean; 0 = none",
    )
    memory: dict[int, Any] | None = None
    mem_raw = craw.get("memory_gb")
    mem_what = "per device while resident"
    if not isinstance(mem_raw, Mapping) and mem_raw is not None:  # one number for every count
        one = _number(mem_raw, f"{where}.memory_gb", problems, mem_what, unit=_GB)
        memory = {n: 0.0 if one is None else one for n in valid_t}
    elif mem_raw is not None:
        memory = _count_map(
            mem_raw,
            f"{where}.memory_gb",
            problems,
            lambda v, at: _number(v, at, problems, mem_what, unit=_GB),
            "GB per device",
            one=True,
        )
        if memory is None:  # refused, and said: no count is missing besides
            memory = {n: 0.0 for n in valid_t}
    switch = _number(
        craw.get("switch_s", 0.0),
        f"{where}.switch_s",
        problems,
        "one offload and onload per iteration; 0 = none",
        unit=_S,
    )
    cores_raw = craw.get("cpu_cores")

    def core_count(v: Any, at: str) -> int | None:
        n = _whole(v) if not isinstance(v, str) else None
        if n is None or n < 0:
            problems.append(
                f"{at} must be a whole number of CPU cores >= 0 (what the component keeps busy "
                f"while it runs), got {_got(v)}"
            )
            return None
        return n

    cores: dict[int, int] | None
    if cores_raw is not None and not isinstance(cores_raw, Mapping):  # one number for every count
        one_c = core_count(cores_raw, f"{where}.cpu_cores")
        cores = {n: one_c or 0 for n in valid_t}
    else:
        cores = _count_map(cores_raw, f"{where}.cpu_cores", problems, core_count, "CPU cores")

    for key, given in (
        (f"{where}.time.per_item", per_item),
        (f"{where}.memory_gb", memory if isinstance(mem_raw, Mapping) else None),
        (f"{where}.cpu_cores", cores if isinstance(cores_raw, Mapping) else None),
    ):
        unused = sorted(n for n in given or () if n not in valid_t)
        if unused and notes is not None:
            # valid_devices [1, 2] beside per_item {1: .., 2: .., 4: ..}: 4 was likely meant too
            notes.append(
                f"{key} has values for device count(s) {count_ranges(unused)}, which "
                f"{where}.valid_devices {list(valid_t)} leaves out: the planner never uses "
                "them; add the counts to valid_devices, or drop the values"
            )
    if samples is not None and rows is None:  # malformed samples, said: nothing more to say
        return None, None
    report = None
    missing_t = [n for n in valid_t if n not in per_item]
    missing_m = [n for n in valid_t if memory is not None and n not in memory]
    if rows and 0 in valid_t and (0 in missing_t or memory is None or 0 in missing_m):
        # the fit scales with devices (n^-p, b / n): it says nothing of host cores alone
        problems.append(
            f"{where}: valid device count 0 (host cores only) needs its own time.per_item[0] "
            "and memory_gb[0]; samples (n_devices >= 1) cannot give them"
        )
        return None, None
    if rows and (missing_t or memory is None or missing_m):
        # What the profile leaves out, the samples' fit gives; what it states, it keeps. The fit
        # estimates alpha and per_item together: its alpha only goes with its own per_item
        # (beside costs measured apart it would count the fixed cost twice).
        on_devices = [n for n in valid_t if n >= 1]  # 0's own values are stated (above)
        fitted, report = fit_component(rows, valid_devices=on_devices, switch_s=switch or 0.0)
        alpha = fitted.alpha if alpha is None and not per_item else alpha
        per_item = {**{n: fitted.per_item[n] for n in missing_t}, **per_item}
        memory = {**fitted.memory_gb, **(memory or {})}
        missing_t, missing_m = [], []
    if memory is None:  # no memory_gb and nothing to fit it from: memory never limits it
        memory = {n: 0.0 for n in valid_t}
    if missing_t and per_raw is not None:
        problems.append(
            f"{where}.time.per_item has no cost for valid device count(s) {missing_t} and there are "
            f"no samples to fit it from; add them to per_item, drop them from valid_devices, or add samples"
        )
    if missing_m:
        problems.append(
            f"{where}.memory_gb has no value for valid device count(s) {missing_m}; add them or give one number"
        )
    if cores is not None:
        miss_c = [n for n in valid_t if n not in cores]
        if miss_c:
            problems.append(f"{where}.cpu_cores has no value for valid device count(s) {miss_c}")
    if missing_t or missing_m:
        return None, report
    return (
        ComponentProfile(
            name=name,
            valid_devices=valid_t,
            alpha=float(alpha or 0.0),
            per_item={n: float(per_item[n]) for n in valid_t},
            memory_gb={n: float(memory[n]) for n in valid_t},
            switch_s=float(switch or 0.0),
            cpu_cores=None if cores is None else {n: int(cores.get(n, 0)) for n in valid_t},
            item_cv=float(item_cv or 0.0),
        ),
        report,
    )


def _sample_rows(name: str, samples: Any, where: str, problems: list[str]) -> list[Sample] | None:
    """Measured rows [n_devices, items, seconds, peak_memory_gb] as fit_component's samples;
    None (and a problem per bad row) if any row is malformed. The fit takes logs of n and
    divides by n and by items, so n >= 1 and items > 0."""
    shape = "[n_devices, items, seconds, peak_memory_gb]"
    if not isinstance(samples, Sequence) or isinstance(samples, str) or not samples:
        problems.append(
            f"{where} must be a non-empty list of measured rows {shape}, got {_got(samples)}; "
            "add rows, or drop the key and give time.per_item"
        )
        return None
    rows: list[Sample] = []
    for i, s in enumerate(samples):
        at = f"{where}[{i}]"
        if not isinstance(s, Sequence) or isinstance(s, str) or len(s) != 4:
            problems.append(f"{at} must be a row {shape}, got {_got(s)}")
            continue
        before = len(problems)
        n = _device_count(s[0], f"{at} n_devices", problems)
        items = _number(s[1], f"{at} items", problems, "items in the measured call", above=True)
        sec = _number(s[2], f"{at} seconds", problems, "the measured call's duration", unit=_S)
        peak = _number(s[3], f"{at} peak_memory_gb", problems, "per device at its peak", unit=_GB)
        if len(problems) == before:
            rows.append((name, int(n or 1), float(items or 0), float(sec or 0), float(peak or 0)))
    return rows if len(rows) == len(samples) else None


# --------------------------------------------------------------------------- fitting

Sample = tuple[
    str, int, float, float, float
]  # (component, n_devices, items, seconds, peak_memory_gb)


def fit_component(
    samples: Sequence[Sample],
    valid_devices: Sequence[int] | None = None,
    switch_s: float = 0.0,
    cpu_cores: dict[int, int] | None = None,
    item_cv: float = 0.0,
) -> tuple[ComponentProfile, FitReport]:
    """Fit ``t(n, x) = alpha + x * per_item[n]`` and ``memory(n) = a + b / n`` to samples.

    ``alpha`` and one ``per_item[n]`` per measured ``n`` come from one linear least
    squares; unmeasured ``n`` in ``valid_devices`` are extrapolated with the power
    law ``per_item(n) = c * n ** -p`` fitted in log-log space over the measured n.
    """
    if not samples:
        raise ConfigError(["fit_component needs at least one sample"])
    names = {s[0] for s in samples}
    if len(names) != 1:
        raise ConfigError([f"fit_component takes samples of one component, got {sorted(names)}"])
    name = samples[0][0]
    ns = np.array([int(s[1]) for s in samples])
    xs = np.array([float(s[2]) for s in samples])
    ts = np.array([float(s[3]) for s in samples])
    mem = np.array([float(s[4]) for s in samples])
    measured = sorted(set(ns.tolist()))
    # Design: [1, x * [n == n_1], x * [n == n_2], ...]; alpha is shared by all n.
    cols = [np.ones_like(xs)] + [xs * (ns == n) for n in measured]
    design = np.stack(cols, axis=1)
    coef, *_ = np.linalg.lstsq(design, ts, rcond=None)
    alpha = float(coef[0])
    if alpha < 0:  # a negative fixed cost is unphysical; refit through the origin
        coef2, *_ = np.linalg.lstsq(design[:, 1:], ts, rcond=None)
        alpha, coef = 0.0, np.concatenate([[0.0], coef2])
    measured_per = {n: max(float(c), 0.0) for n, c in zip(measured, coef[1:], strict=True)}
    pos = [(n, v) for n, v in measured_per.items() if v > 0]
    if len(pos) >= 2:
        ln = np.log([n for n, _ in pos])
        lv = np.log([v for _, v in pos])
        slope, intercept = np.polyfit(ln, lv, 1)
        exponent, scale = float(-slope), float(np.exp(intercept))
    else:  # one device count measured: assume ideal scaling
        n0, v0 = pos[0] if pos else (measured[0], 0.0)
        exponent, scale = 1.0, v0 * n0
    # memory(n) = a + b / n (a: replicated state, b: sharded state)
    if len(measured) >= 2:
        md = np.stack([np.ones_like(mem), 1.0 / ns], axis=1)
        (ma, mb), *_ = np.linalg.lstsq(md, mem, rcond=None)
    else:
        ma, mb = float(mem.max()), 0.0
    valid = tuple(sorted(set(valid_devices))) if valid_devices else tuple(measured)
    per_item: dict[int, float] = {}
    memory: dict[int, float] = {}
    extrap = []
    for n in valid:
        if n in measured_per:
            per_item[n] = measured_per[n]
            memory[n] = float(mem[ns == n].max())
        else:
            extrap.append(n)
            per_item[n] = scale * n**-exponent
            memory[n] = max(float(ma + mb / n), 0.0)
    far = [n for n in extrap if n > EXTRAPOLATION_WARN_FACTOR * max(measured)]
    if far:
        warnings.warn(
            f"component {name!r}: extrapolating per_item to n = {count_ranges(far)}, more than "
            f"{EXTRAPOLATION_WARN_FACTOR}x the largest measured n={max(measured)}; measure larger n",
            stacklevel=2,
        )
    pred = np.array(
        [alpha + x * per_item.get(n, scale * n**-exponent) for n, x in zip(ns, xs, strict=True)]
    )
    # Samples of absurd size (1e300 s) overflow here to inf: the fit's costs are then refused
    # as past MAX_MAGNITUDE, with the key named, so numpy's own warning would only add noise.
    with np.errstate(over="ignore", invalid="ignore"):
        rel = np.abs(pred - ts) / np.maximum(np.abs(ts), 1e-12)
        mem_pred = np.array([memory.get(n, ma + mb / n) for n in ns])
        mem_rel = np.abs(mem_pred - mem) / np.maximum(np.abs(mem), 1e-12)
    report = FitReport(
        component=name,
        n_samples=len(samples),
        measured_devices=tuple(measured),
        extrapolated_devices=tuple(extrap),
        exponent=exponent,
        rel_err_mean=float(rel.mean()),
        rel_err_max=float(rel.max()),
        memory_rel_err_max=float(mem_rel.max()),
    )
    comp = ComponentProfile(
        name=name,
        valid_devices=valid,
        alpha=alpha,
        per_item=per_item,
        memory_gb=memory,
        switch_s=float(switch_s),
        cpu_cores=None if cpu_cores is None else {n: int(cpu_cores[n]) for n in valid},
        item_cv=float(item_cv),
    )
    return comp, report


def fit_profile(
    samples: Sequence[Sample],
    devices: int,
    device_memory_gb: float,
    batch: int,
    granularities: Sequence[int],
    edges: Sequence[tuple[str, str]] = (),
    cycles: Sequence[CycleSpec | Mapping[str, Any]] = (),
    valid_devices: Mapping[str, Sequence[int]] | None = None,
    switch_s: Mapping[str, float] | None = None,
    cpu_cores: Mapping[str, dict[int, int]] | None = None,
    cpu_cores_per_node: int | None = None,
    devices_per_node: int | None = None,
    item_cv: Mapping[str, float] | None = None,
) -> WorkloadProfile:
    """Fit every component found in ``samples`` and assemble a validated profile."""
    by_comp: dict[str, list[Sample]] = {}
    for s in samples:
        by_comp.setdefault(s[0], []).append(s)
    raw: dict[str, Any] = {
        "devices": devices,
        "device_memory_gb": device_memory_gb,
        "batch": batch,
        "granularities": list(granularities),
        "edges": [list(e) for e in edges],
        "cycles": [c.to_dict() if isinstance(c, CycleSpec) else dict(c) for c in cycles],
        "components": {},
    }
    if cpu_cores_per_node is not None:
        raw["cpu_cores_per_node"] = cpu_cores_per_node
    if devices_per_node is not None:
        raw["devices_per_node"] = devices_per_node
    reports = []
    for name, rows in by_comp.items():
        vd = (valid_devices or {}).get(name)
        comp, rep = fit_component(
            rows,
            valid_devices=vd,
            switch_s=(switch_s or {}).get(name, 0.0),
            cpu_cores=(cpu_cores or {}).get(name),
            item_cv=(item_cv or {}).get(name, 0.0),
        )
        reports.append(rep)
        raw["components"][name] = WorkloadProfile(1, 1, 1, (1,), {name: comp}).to_dict()[
            "components"
        ][name]
    prof = load_profile(raw)
    from dataclasses import replace

    return replace(prof, fit_reports=tuple(reports))
