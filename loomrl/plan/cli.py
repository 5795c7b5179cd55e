"""``loomrl plan PROFILE --devices N``: print the best plan and how each pure mode compares.

Exit status 0 on success, 2 when an argument or the profile is malformed, the device count is
past the planner's limit (``MAX_DEVICES``), the workflow graph is past what the search can take
(``graph.search_size_problem``), the search runs out of memory, --exhaustive runs past
``EXHAUSTIVE_LIMIT_S``, no plan fits, or an output file (--save, --timeline) cannot be written,
names the profile itself or both name one file (one line on stderr, "loomrl plan: ...", that
names the key, the flag or the component and the constraint; no traceback); 130 on Ctrl-C; 141
when stdout's reader left (``| head``). The folders of an output file that do not exist yet are
made when it is written; --save writes the plan whole or not at all. Warnings about the profile
(a component no edge links, costs for device counts valid_devices leaves out, a fit carried far)
are printed, one line each, once a plan is found; a command that fails prints its error alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from loomrl.errors import ConfigError, PlanError
from loomrl.plan.graph import GraphTooLarge, check_search_size
from loomrl.plan.profile import MAX_DEVICES
from loomrl.plan.simulate import MAX_ITERATIONS, MAX_SIGMA, simulation_problems
from loomrl.runlog import quiet_closed_stdout

__all__ = ["build_parser", "plan_main"]

SIGMA, ITERATIONS = 0.3, 200  # --simulate's spread and iterations when not given
# The most calls --simulate plays out (about a microsecond each, so some ten seconds): a plan of
# 10**6 micro-batches, or a bounded channel replaying its upstream side once per micro-batch,
# would otherwise run for hours.
SIM_CALLS = 10_000_000
# How long --exhaustive may search before it stops with a message: the brute force grows
# exponentially (6 components on 16 devices ran for hours), and the DP finds the same optimum.
EXHAUSTIVE_LIMIT_S = 60.0


class _Parser(argparse.ArgumentParser):
    """An argument mistake reads as one line, as the command's other errors do (argparse's
    default prints the whole usage first); --help still shows it."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message}{self._flag_hint(message)} (see {self.prog} --help)\n")

    def _flag_hint(self, message: str) -> str:
        """For `devices=8` (a run's override) where `--devices 8` is meant: the flag to use."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        flags = {o for a in self._actions for o in a.option_strings if o.startswith("--")}
        import difflib

        hints, typos = [], []
        for word in message.split(":", 1)[1].split():
            key, eq, value = word.partition("=")
            flag = "--" + key.lstrip("-").replace("_", "-")
            if eq and not key.startswith("-") and flag in flags:
                hints.append(f"{flag} {value}" if value else flag)
            elif key.startswith("--") and (close := difflib.get_close_matches(key, flags, n=1)):
                typos.append(f"{key} -> {close[0]}")
        said = ""
        if hints:
            said += f"; {self.prog} takes flags, not key=value: {', '.join(hints)}"
        if typos:
            said += f"; did you mean: {', '.join(typos)}?"
        return said


def build_parser(prog: str = "loomrl plan") -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="Find the fastest temporal / spatial / hybrid plan for a workload profile.",
    )
    p.add_argument("profile", help="workload profile (YAML or JSON)")
    p.add_argument(
        "--devices",
        type=int,
        default=None,
        help=f"number of devices, 1 to {MAX_DEVICES:,} (default: the profile's)",
    )
    p.add_argument(
        "--mode",
        choices=["best", "temporal", "spatial", "hybrid"],
        default="best",
        help="restrict the chosen plan to one mode",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument(
        "--exhaustive",
        action="store_true",
        help="brute force every plan (reference; small instances only: it stops with an "
        f"error after {EXHAUSTIVE_LIMIT_S:g} s)",
    )
    p.add_argument(
        "--simulate",
        action="store_true",
        help="also simulate the plan (discrete events) and print mean/p95 vs analytic",
    )
    # None: not given, so that one given without --simulate is refused rather than ignored
    p.add_argument(
        "--sigma",
        type=float,
        default=None,
        help=f"log-normal spread of call durations for --simulate, 0 to {MAX_SIGMA:g} (default "
        f"{SIGMA:g}; past {MAX_SIGMA:g} nearly every call takes ~0 s and the mean rests on rare "
        "draws)",
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=None,
        help=f"iterations for --simulate, 1 to {MAX_ITERATIONS:,} (default {ITERATIONS})",
    )
    p.add_argument(
        "--channel-capacity",
        type=int,
        default=None,
        help="micro-batches a channel holds in --simulate (default unbounded)",
    )
    p.add_argument("--timeline", metavar="PNG", default=None, help="draw the predicted timeline")
    p.add_argument(
        "--save",
        metavar="PATH",
        default=None,
        help="write the plan: JSON for PATH ending in .json (in any case), else YAML (.yaml); a "
        "plan file for placement=PATH. Not an image name (that is --timeline), nor the "
        "profile's own path",
    )
    return p


def _argument_problems(args: argparse.Namespace) -> list[str]:
    """Mistakes in the command's own arguments, found before any search."""
    p = []
    if args.devices is not None and args.devices < 1:
        p.append(f"--devices must be a positive integer, got {args.devices}")
    elif args.devices is not None and args.devices > MAX_DEVICES:
        p.append(
            f"--devices must be at most {MAX_DEVICES:,} (the planner's limit: its search keeps "
            f"arrays of one entry per device count), got {args.devices:,}"
        )
    sim_flags = {
        "--sigma": args.sigma,
        "--iterations": args.iterations,
        "--channel-capacity": args.channel_capacity,
    }
    given = [flag for flag, v in sim_flags.items() if v is not None]
    if given and not args.simulate:
        verb, it = ("applies", "it") if len(given) == 1 else ("apply", "them")
        p.append(f"{' and '.join(given)} {verb} to --simulate only; add --simulate or drop {it}")
    p += simulation_problems(_sigma(args), _iterations(args), "--sigma", "--iterations")
    if args.channel_capacity is not None and args.channel_capacity < 1:
        p.append(f"--channel-capacity must be >= 1 micro-batch, got {args.channel_capacity}")
    outputs: dict[Path, str] = {}  # each output file -> the flag that names it
    for flag, path, suffixes in (
        ("--timeline", args.timeline, _image_suffixes() if args.timeline else None),
        ("--save", args.save, None),
    ):
        if path is None:
            continue
        if not path.strip():
            p.append(f"{flag} {path!r}: an empty path; name a file")
            continue
        # Missing folders are made when the file is written (as loomrl report --out does);
        # the deepest one that exists must be a folder this command can write in.
        there = _existing_ancestor(Path(path).parent)
        if not there.is_dir():
            p.append(
                f"{flag} {path}: {str(there)!r} is a file, not a directory; name a file in a "
                "writable directory"
            )
        elif Path(path).is_dir():
            p.append(f"{flag} {path}: is a directory; name a file")
        elif _same_file(path, args.profile):
            p.append(
                f"{flag} {path}: is the profile being planned, which writing there would "
                "replace; name another file"
            )
        elif (why := _unwritable(Path(path))) is not None:
            p.append(
                f"{flag} {path}: cannot write there ({why}); name a file in a writable directory"
            )
        if suffixes and Path(path).suffix.lower() not in suffixes:
            p.append(f"{flag} {path}: an image file ending in one of {', '.join(suffixes)}")
        if flag == "--save" and Path(path).suffix.lower() in _PICTURES:
            # the plan is JSON or YAML text: plan.png would hold YAML, not a picture
            p.append(
                f"--save {path}: --save writes the plan as text (JSON for a name ending in "
                ".json, else YAML), not an image; name a .json or .yaml file, and draw the "
                f"timeline with --timeline {path}"
            )
        key = Path(os.path.abspath(path))
        if key in outputs:
            p.append(
                f"{flag} {path}: {outputs[key]} writes the same file; give them different files"
            )
        outputs[key] = flag
    return p


def _same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name one file (through links too); False when either is
    missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


# Names --save refuses: a picture's (that is --timeline's work), not a plan's
_PICTURES = frozenset(
    (".png", ".jpg", ".jpeg", ".svg", ".svgz", ".pdf", ".gif", ".tif", ".tiff", ".webp", ".eps")
)


def _existing_ancestor(folder: Path) -> Path:
    """``folder``, or the deepest of its parents that exists."""
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    return folder


def _unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written (None: it can), found before a search that may take long.
    The permission bits alone do not tell (root passes os.access on /proc, which takes no new
    file), so a scratch file is made beside it, or in the deepest of its missing folders'
    parents that exists (where the first of them would be made), and removed."""
    import tempfile

    if path.exists() and not os.access(path, os.W_OK):
        return "the file is read-only"
    try:
        fd, scratch = tempfile.mkstemp(dir=_existing_ancestor(path.parent), prefix=".loomrl-plan-")
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    os.unlink(scratch)
    return None


class _OutputError(Exception):
    """An output file (--save, --timeline) could not be written, or --simulate cannot run."""


@contextlib.contextmanager
def _writing(flag: str, path: str):
    """Report a failed write of ``path`` (a full disk, a directory gone since the check) as a
    message naming the flag, not as a traceback."""
    try:
        yield
    except OSError as e:
        raise _OutputError(
            f"{flag} {path}: writing failed ({e.strerror or e}); name a file in a writable "
            "directory with space left"
        ) from None


def _image_suffixes() -> tuple[str, ...]:
    """The file endings matplotlib can write a figure as (png, pdf, svg, jpg, ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return tuple(f".{k}" for k in FigureCanvasBase.get_supported_filetypes())


def plan_main(argv: list[str] | None = None) -> int:
    _tolerant_stdout()
    args = build_parser().parse_args(argv)
    problems = _argument_problems(args)
    if problems:
        print("loomrl plan: " + "; ".join(problems), file=sys.stderr)
        return 2
    try:
        with warnings.catch_warnings(record=True) as caught:
            # Warnings about the profile are held until a plan is found (_say_warnings), then
            # read as one line each, not as a source location; a command that fails says its
            # error alone (a profile's oddities beside it would only bury it).
            warnings.simplefilter("default")  # each distinct warning once per call
            args.warned = caught
            return _run(args)
    except ConfigError as e:
        print(f"loomrl plan: {_profile_problems(e)}", file=sys.stderr)
        return 2
    except GraphTooLarge as e:
        print(f"loomrl plan: graph too large to search: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except PlanError as e:
        print(f"loomrl plan: no plan fits: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except _OutputError as e:
        print(f"loomrl plan: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # stdout's reader left (`loomrl plan P | head -1`): stop quietly (stdout to devnull, so
        # that the flush at exit does not fail on the pipe again); another pipe is a failure
        if not quiet_closed_stdout():
            raise
        return 141  # 128 + SIGPIPE, what a shell reports for a writer whose pipe closed
    except KeyboardInterrupt:
        # Ctrl-C in a long search: stop without a traceback (--save is written whole or not at all)
        print("loomrl plan: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, what a shell reports
    except MemoryError:
        # numpy's "Unable to allocate ..." included: the search's arrays grow with the device
        # count and the number of valid counts per component, and a traceback says neither.
        on = f"--devices {args.devices:,}" if args.devices else "the profile's devices"
        print(
            f"loomrl plan: out of memory while searching plans for {args.profile} on {on}; plan "
            "for fewer --devices, or allow fewer valid_devices per component",
            file=sys.stderr,
        )
        return 2


def _tolerant_stdout() -> None:
    """Let a name the terminal's encoding lacks (a component called 'ロールアウト' under
    PYTHONIOENCODING=ascii) print as a backslash escape, not end the command in a traceback;
    stderr does so already."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        with contextlib.suppress(Exception):  # a stream that cannot change its error handler
            reconfigure(errors="backslashreplace")


def _one_line(text: str) -> str:
    """``text`` on one line: its lines stripped and joined by a space (a parser's message may
    show the offending line with a caret under it)."""
    return " ".join(x.strip() for x in text.splitlines() if x.strip())


# The most problems of a profile said at once (a profile with a thousand bad edges would print a
# thousand; the first ones show what to fix)
SHOWN_PROBLEMS = 12


def _profile_problems(e: ConfigError) -> str:
    """A profile's problems as one line: where, then each problem, joined by '; '."""
    where = f" {e.source}" if e.source else ""
    said = [_one_line(p) for p in e.problems[:SHOWN_PROBLEMS]]
    if len(e.problems) > SHOWN_PROBLEMS:
        said.append(f"and {len(e.problems) - SHOWN_PROBLEMS} more problem(s) of the same file")
    return f"invalid profile{where}: " + "; ".join(said)


def _say_warnings(args: argparse.Namespace) -> None:
    """Print the warnings held so far (see plan_main), one line each."""
    held = getattr(args, "warned", None) or []
    for w in held:
        print(f"loomrl plan: warning: {_one_line(str(w.message))}", file=sys.stderr)
    held.clear()


@contextlib.contextmanager
def _search_bar():
    """A progress bar on stderr for searches that take more than a second (many valid device
    counts on large graphs); none when stderr is not a terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(total=1, desc="searching plans", unit="pass", delay=1.0, leave=False)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)  # update, not refresh: it keeps to the delay

    try:
        yield progress
    finally:
        bar.close()


def _run(args: argparse.Namespace) -> int:
    from loomrl.plan.profile import load_profile
    from loomrl.plan.search import search_all

    profile = load_profile(args.profile, devices=args.devices)
    check_search_size(profile)  # before --exhaustive's warning: neither search can take it
    if args.exhaustive:
        import time

        from loomrl.plan.search import ExhaustiveTooLong, exhaustive_all

        big = len(profile.components) > 4 or profile.devices > 12
        if big:
            # Brute force over every tree, split and m grows exponentially: it is a reference
            # for the tests' small instances (PLANNER.md: V <= 4, N <= 12).
            print(
                f"loomrl plan: warning: --exhaustive on {len(profile.components)} components and "
                f"{profile.devices} devices may take very long (it is meant for <= 4 components "
                f"and <= 12 devices; it stops after {EXHAUSTIVE_LIMIT_S:g} s); drop --exhaustive "
                "for the exact DP search",
                file=sys.stderr,
            )
        try:
            plans = exhaustive_all(profile, deadline=time.perf_counter() + EXHAUSTIVE_LIMIT_S)
        except ExhaustiveTooLong:
            raise _OutputError(
                f"--exhaustive: the brute force over every plan of {len(profile.components)} "
                f"components on {profile.devices:,} devices did not end within "
                f"{EXHAUSTIVE_LIMIT_S:g} s and was stopped (it grows exponentially; it is a "
                "reference for <= 4 components and <= 12 devices); drop --exhaustive for the "
                "exact DP search, or plan for fewer --devices"
            ) from None
    else:
        with _search_bar() as progress:
            plans = search_all(profile, progress=progress)
    plan = plans[args.mode]
    if plan is None:
        from loomrl.plan.search import _diagnose

        raise PlanError(_diagnose(profile, profile.devices, args.mode))
    _say_warnings(args)
    sim = None
    if args.simulate:
        sim = _simulate(args, plan, profile)
    if args.timeline:
        from loomrl.plan.timeline import draw_timeline

        with _writing("--timeline", args.timeline):
            Path(args.timeline).parent.mkdir(parents=True, exist_ok=True)
            draw_timeline(plan, args.timeline, title=f"{args.profile}: {plan.mode} plan")
    if args.save:
        with _writing("--save", args.save):
            Path(args.save).parent.mkdir(parents=True, exist_ok=True)
            plan.save(args.save)
    if args.json:
        out = plan.to_dict()
        out["profile"] = str(args.profile)
        out["plans"] = {
            k: (v.to_dict() | {"timeline": []} if v else None)
            for k, v in plans.items()
            if k != "best"
        }
        if profile.fit_reports:  # components given as samples: how well their fits match
            out["fits"] = [
                {
                    "component": r.component,
                    "samples": r.n_samples,
                    "measured_devices": list(r.measured_devices),
                    "extrapolated_devices": list(r.extrapolated_devices),
                    "exponent": r.exponent,
                    "rel_err_mean": r.rel_err_mean,
                    "rel_err_max": r.rel_err_max,
                    "memory_rel_err_max": r.memory_rel_err_max,
                }
                for r in profile.fit_reports
            ]
        if sim is not None:
            out["simulated"] = {
                "mean_s": sim.mean_s,
                "p95_s": sim.p95_s,
                "analytic_s": sim.analytic_s,
                "sigma": _sigma(args),
                "iterations": _iterations(args),
            }
        # JSON has no NaN or Infinity: a number that is not finite is written as null
        print(json.dumps(json_safe(out), indent=2, allow_nan=False))
        _say_warnings(args)
        return 0
    print(_human(args, profile, plan, sim, plans))
    _say_warnings(args)
    return 0


def _simulate(args: argparse.Namespace, plan, profile):
    """--simulate's run, or an ``_OutputError`` saying why it would take too long."""
    from loomrl.plan.simulate import SimulationTooLong, calls_per_iteration, simulate

    iterations = _iterations(args)
    per = calls_per_iteration(plan.tree, profile, plan.micro_batch)
    if per * iterations > SIM_CALLS:
        fewer = (
            f"lower --iterations to {SIM_CALLS // per:,} or fewer"
            if per <= SIM_CALLS
            else "one iteration alone is too many (drop --simulate: the plan's predicted time "
            "comes from the closed form)"
        )
        raise _OutputError(
            f"--simulate: {iterations:,} iteration(s) of this plan would play out "
            f"{per * iterations:,} calls ({per:,} each: micro-batches times the components "
            f"they pass, a cycle's steps times its groups), more than the {SIM_CALLS:,} it "
            f"simulates; {fewer}"
        )
    try:
        return simulate(
            plan,
            profile,
            sigma=_sigma(args),
            iterations=iterations,
            channel_capacity=args.channel_capacity,
            max_calls=SIM_CALLS,
        )
    except SimulationTooLong:
        raise _OutputError(
            f"--simulate: channels of --channel-capacity {args.channel_capacity} replay their "
            f"upstream side until the back-pressure settles, which passed {SIM_CALLS:,} calls "
            f"over {iterations:,} iteration(s) of {plan.num_micro_batches:,} micro-batches; "
            "raise --channel-capacity or lower --iterations"
        ) from None


def _human(args, profile, plan, sim, plans=None) -> str:
    lines = [
        f"profile {args.profile}: {len(profile.components)} components, {plan.devices} devices, "
        f"batch {profile.batch}",
        f"{_plan_label(args.mode, plan)}: "
        f"{plan.predicted_s:.4f} s/iteration, micro-batch {plan.micro_batch} "
        f"({plan.num_micro_batches} micro-batches), peak memory {plan.memory_gb:.1f} GB/device",
        plan.tree.pretty(1),
    ]
    if profile.fit_reports:
        lines.append("costs fitted from samples:")
        lines += [f"  {r}" for r in profile.fit_reports]
    lines.append("devices per component:")
    width = max(len(c) for c in profile.components)
    for comp, devs in plan.assignment().items():
        lines.append(f"  {comp:<{width}}  {_ranges(devs)}")
    lines.append("pure modes (predicted s/iteration, slowdown vs best):")
    found = [v for v in plan.modes.values() if v is not None]
    ref = min([*found, plan.predicted_s])
    for mode in ("temporal", "spatial", "hybrid"):
        v = plan.modes.get(mode)
        if v is None:
            lines.append(f"  {mode:<8}  infeasible")
        else:
            lines.append(f"  {mode:<8}  {v:10.4f} s  {_slowdown(v, ref)}")
    # Each pure mode's own best plan, where it is not the plan shown above.
    for mode in ("temporal", "spatial", "hybrid"):
        other = (plans or {}).get(mode)
        if other is not None and other is not plan and other.tree != plan.tree:
            lines.append(
                f"best {mode} plan: micro-batch {other.micro_batch}, "
                f"{other.predicted_s:.4f} s/iteration"
            )
            lines.append(other.tree.pretty(1))
    if sim is not None:
        lines.append(
            f"simulated ({len(sim.times)} iterations, sigma {_sigma(args):g}): mean {sim.mean_s:.4f} s, "
            f"p95 {sim.p95_s:.4f} s, analytic {sim.analytic_s:.4f} s"
        )
    lines.append(f"search time {plan.search_s:.4f} s")
    return "\n".join(lines)


def _plan_label(asked: str, plan) -> str:
    """The header's name for the plan: the best of all modes, or the fastest of the mode asked
    with --mode (then it is no claim of being the best overall)."""
    how = ", exhaustive search" if plan.method == "exhaustive" else ""
    if asked == "best":
        return f"best plan ({plan.mode}{how})"
    return f"fastest {asked} plan (--mode {asked}{how})"


def _sigma(args: argparse.Namespace) -> float:
    return SIGMA if args.sigma is None else args.sigma


def _iterations(args: argparse.Namespace) -> int:
    return ITERATIONS if args.iterations is None else args.iterations


def json_safe(x: Any) -> Any:
    """``x`` with every float that is not finite (nan, inf) replaced by None, through dicts,
    lists and tuples: what ``json.dumps(..., allow_nan=False)`` accepts."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def _slowdown(v: float, ref: float) -> str:
    """How many times slower ``v`` is than the best time ``ref``. A profile whose costs are all
    zero plans a 0 s iteration: a mode as fast is 1x, a slower one has no finite ratio."""
    if v <= ref:
        return f"{1.0:6.3f}x"
    if ref <= 0:
        return "   n/a (the best plan takes 0 s)"
    return f"{v / ref:6.3f}x"


def _ranges(devs: list[int]) -> str:
    if not devs:
        return "-"
    out, start, prev = [], devs[0], devs[0]
    for d in devs[1:] + [None]:  # type: ignore[list-item]
        if d is not None and d == prev + 1:
            prev = d
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if d is not None:
            start = prev = d
    return ",".join(out)
