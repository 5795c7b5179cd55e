"""Run logging: metrics.jsonl (the record of truth), TensorBoard, Weights & Biases, a progress bar.

``metrics.jsonl`` in the run directory gets one JSON object per ``log()`` call:
``{"step": 12, "time": <unix seconds>, "elapsed_s": 3.4, "reward_mean": 0.41, ...}``.
It is strict JSON: non-finite floats are written as the strings ``"NaN"``, ``"Infinity"``
and ``"-Infinity"``, which ``read_metrics`` turns back into floats. Everything else
(TensorBoard, wandb, the bar) is a view of the same numbers and may be switched off.

Nothing heavy is imported with this module: torch (for TensorBoard's writer), wandb and
tqdm are imported when a ``RunLogger`` asks for them.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from loomrl.errors import ConfigError, LoomError

__all__ = [
    "RunLogger",
    "RunDirWriteError",
    "write_failure",
    "read_metrics",
    "read_summary",
    "say",
    "METRICS_FILE",
    "SUMMARY_FILE",
]

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "run_summary.json"
CONFIG_FILE = "config.yaml"
TENSORBOARD_DIR = "tensorboard"
_RESERVED = ("step", "time", "elapsed_s")
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_WANDB_MODES = ("off", "offline", "online")


class RunDirWriteError(LoomError, OSError):
    """A run's record (metrics, a checkpoint) could not be written: a full disk, a lost mount.
    An OSError still, so code that handled the bare one goes on handling it."""


def write_failure(
    error: BaseException,
    what: str,
    path: Path,
    run_dir: Path,
    kind: type[RunDirWriteError] = RunDirWriteError,
    stopped: bool = True,
) -> RunDirWriteError:
    """The error a failed write of ``what`` at ``path`` stops a run with: what failed, why
    (a full filesystem said as such, with the space left) and how to go on. torch.save wraps
    the OSError in a RuntimeError of its own, so the whole chain is searched for the cause."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    import errno
    import shutil

    where = path if path.exists() else path.parent
    try:
        free = f"{shutil.disk_usage(where).free / 2**20:.1f} MB free there"
    except OSError:
        free = "its free space unknown"
    if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
        why = f"the filesystem is full ({cause.strerror}; {free})"
        fix = f"free space there, or copy {run_dir} to a disk with room"
    else:
        why = str(cause or error)
        fix = f"make {path.parent} writable again"
    if not stopped:  # the run's work is done; only this record is missing
        return kind(
            f"could not write {what} to {path}: {why}. The run's steps had ended; its "
            f"{METRICS_FILE}, checkpoints and logs are as they were written: {fix}"
        )
    return kind(
        f"could not write {what} to {path}: {why}; the run stopped. The checkpoints already "
        f"saved are intact: {fix}, then `loomrl resume {run_dir}` continues from the last one"
    )


class RunLogger:
    """Record a run's metrics under ``run_dir``.

    Args:
        run_dir: created if needed; ``metrics.jsonl`` is appended to, so a resumed run continues it.
        config_dict: the run's configuration (a dict or a config dataclass), written to
            ``config.yaml`` and handed to wandb; None writes nothing.
        use_tensorboard: write scalars under ``run_dir/tensorboard`` (skipped with one warning if
            no SummaryWriter is importable).
        wandb: ``"off"``, ``"offline"`` (writes under run_dir, no network) or ``"online"``.
        total_steps: the bar's total, for its ETA.
        progress: True shows a bar when stderr is a terminal, ``"always"`` shows it anyway,
            False never.
        postfix_keys: metrics shown after the bar (their last value), when present.
        project, run_name: wandb project and run name.
        continues: this run resumes the one whose records ``metrics.jsonl`` holds (cut back to
            the checkpoint it resumes from): ``elapsed_s`` and ``last_metrics`` go on from them,
            and TensorBoard hides the earlier attempt's rows past them.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        config_dict: Any = None,
        use_tensorboard: bool = True,
        wandb: Literal["off", "offline", "online"] = "off",
        total_steps: int | None = None,
        progress: bool | Literal["always"] = True,
        postfix_keys: Sequence[str] = ("reward_mean", "eval_accuracy", "episode_return"),
        project: str = "loomrl",
        run_name: str | None = None,
        continues: bool = False,
    ):
        if wandb not in _WANDB_MODES:
            raise ConfigError(
                [f"wandb: expected one of {', '.join(map(repr, _WANDB_MODES))}, got {wandb!r}"]
            )
        if progress not in (True, False, "always"):
            raise ValueError(f"progress must be True, False or 'always', got {progress!r}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.total_steps = total_steps
        self.postfix_keys = tuple(postfix_keys)
        self._closed = False
        self.last_metrics: dict[str, Any] = {}  # each key's last logged value
        # A resumed run continues the records left in metrics.jsonl (cut back to its
        # checkpoint): elapsed_s goes on from theirs, and TensorBoard hides what an earlier
        # attempt logged past them (its event files stay, so their rows would show twice).
        here = self.run_dir / METRICS_FILE
        earlier = read_metrics(self.run_dir) if continues and here.is_file() else []
        steps = [r["step"] for r in earlier if isinstance(r.get("step"), int)]
        elapsed = [r["elapsed_s"] for r in earlier if isinstance(r.get("elapsed_s"), (int, float))]
        for r in earlier:
            self.last_metrics.update((k, v) for k, v in r.items() if k not in _RESERVED)
        self._start = time.monotonic() - (max(elapsed) if elapsed else 0.0)
        purge = max(steps) + 1 if steps else None
        self._config = _plain_config(config_dict)
        if self._config is not None:
            _atomic_write(self.run_dir / CONFIG_FILE, config_text(config_dict))

        self._tb = (
            _open_tensorboard(self.run_dir / TENSORBOARD_DIR, purge) if use_tensorboard else None
        )
        self._wandb = None
        if wandb != "off":
            self._wandb = _open_wandb(wandb, self.run_dir, self._config, project, run_name)
        self._show_bar = progress == "always" or (progress is True and _stderr_is_tty())
        self._bar = None  # created at the first log(), so the ETA ignores start-up time
        # Line-buffered append: each record reaches the file when log() returns.
        self.metrics_restarted_at: list[int] = []  # steps where a deleted file began anew
        metrics_path = self._file_path = self.run_dir / METRICS_FILE
        torn = _ends_mid_line(metrics_path)
        self._file = open(metrics_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        if torn:
            # A crash cut the last record short: end that line so the next record stands alone.
            self._file.write("\n")

    # ---------------------------------------------------------------- logging

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record ``metrics`` for ``step``. Values: numbers, bools, strings, one-element tensors
        or numpy scalars (read with ``.item()``) and JSON-able lists/dicts; only numbers and
        bools go to TensorBoard, wandb and the bar."""
        if self._closed:
            raise RuntimeError("RunLogger.log() after close()")
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"step must be an int, got {step!r} ({type(step).__name__})")
        clash = [k for k in metrics if k in _RESERVED]
        if clash:
            raise ValueError(f"metric name(s) {clash} are reserved in {METRICS_FILE}; rename them")
        values = {str(k): _plain_value(k, v) for k, v in metrics.items()}
        record = {"step": step, "time": time.time(), "elapsed_s": time.monotonic() - self._start}
        record.update(values)
        self._reopen_if_deleted(step)
        try:
            self._file.write(json.dumps(_encode(record), allow_nan=False) + "\n")
        except OSError as e:  # a full disk: said as such, not as a bare errno traceback
            raise write_failure(e, f"step {step}'s metrics", self._file_path, self.run_dir) from e
        self.last_metrics.update(values)

        scalars = {k: _scalar(v) for k, v in values.items() if isinstance(v, (int, float))}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, global_step=step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        if self._show_bar:
            try:
                self._advance_bar(step, scalars)
            except BrokenPipeError:  # stderr's reader left: the bar goes, the run goes on
                _to_devnull(sys.stderr)

    def _reopen_if_deleted(self, step: int) -> None:
        """A metrics.jsonl deleted (or moved) while the run holds it open would take every
        later record with it, unseen: write a new one, and say and keep at which step."""
        try:
            gone = os.fstat(self._file.fileno()).st_nlink == 0 or not self._file_path.exists()
        except OSError:
            gone = True
        if not gone:
            return
        self.metrics_restarted_at.append(step)
        try:
            self._file.close()
        except OSError:  # its rows have nowhere to go now
            pass
        self._file = open(self._file_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self.echo(
            f"{self._file_path} was deleted or moved while the run wrote it; a new one starts "
            f"at step {step} (earlier rows are lost; run_summary.json lists the step under "
            f"metrics_restarted_at)"
        )

    def _advance_bar(self, step: int, scalars: Mapping[str, float]) -> None:
        if self._bar is None:
            from tqdm import tqdm

            # smoothing=0: the rate (and so the ETA) is the average since the first log().
            self._bar = tqdm(
                total=self.total_steps,
                initial=step,
                file=sys.stderr,
                dynamic_ncols=True,
                smoothing=0,
                unit="step",
            )
        shown = {k: f"{scalars[k]:.4g}" for k in self.postfix_keys if k in scalars}
        if shown:
            self._bar.set_postfix(shown, refresh=False)
        if step > self._bar.n:
            self._bar.update(step - self._bar.n)
        else:
            self._bar.refresh()

    def echo(self, text: str) -> None:
        """Print a line to stderr without breaking the progress bar (nor the run, when stderr's
        reader has left: see ``say``)."""
        if self._bar is None:
            say(text, sys.stderr)
            return
        try:
            self._bar.write(text, file=sys.stderr)
        except BrokenPipeError:
            _to_devnull(sys.stderr)

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        """Write ``run_summary.json`` atomically (replacing any previous one); returns its path."""
        plain = {str(k): _plain_value(k, v) for k, v in summary.items()}
        path = self.run_dir / SUMMARY_FILE
        try:
            _atomic_write(path, json.dumps(_encode(plain), indent=2, allow_nan=False) + "\n")
        except OSError as e:  # a full disk at the very end: say so, not a raw traceback
            raise write_failure(e, SUMMARY_FILE, path, self.run_dir, stopped=False) from e
        if self._wandb is not None:
            self._wandb.summary.update(plain)
        return path

    def close(self) -> None:
        """Flush and close every sink. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        failing = sys.exc_info()[1]  # read here: inside the except below it is that OSError
        lost = None
        try:
            self._file.close()
        except OSError as e:
            # A record that did not fit (full disk) is still buffered and fails again here:
            # the error already on its way out (the failed log()) is the one to report.
            if failing is None:
                lost = write_failure(e, METRICS_FILE, self._file_path, self.run_dir)
        if self._bar is not None:
            try:
                self._bar.close()  # its last line
            except BrokenPipeError:
                _to_devnull(sys.stderr)
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
        if self._wandb is not None:
            # A run stopped by an error shows in W&B as failed, not as finished.
            self._wandb.finish(exit_code=0 if failing is None else 1)
        if lost is not None:
            raise lost

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of ``run_dir/metrics.jsonl`` in file order (a resumed run may repeat steps).

    A line cut short by a crash is skipped with a warning, as is any other unreadable line.
    Raises ``FileNotFoundError`` when the file does not exist.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no {METRICS_FILE} in {run_dir}: was the run logged with RunLogger?"
        )
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                log.warning("%s line %d is not JSON (cut short by a crash?); skipped", path, n)
                continue
            if isinstance(record, dict):
                records.append(_decode(record))
            else:
                log.warning("%s line %d is not a JSON object; skipped", path, n)
    return records


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The contents of ``run_dir/run_summary.json``."""
    return _decode(json.loads((Path(run_dir) / SUMMARY_FILE).read_text()))


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def _plain_value(key: Any, value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            value = item()  # one-element tensors and numpy scalars
        except (ValueError, RuntimeError) as e:
            raise TypeError(
                f"metric {key!r}: cannot log a value with several elements ({e})"
            ) from None
        if isinstance(value, (bool, int, float, str)) or value is None:
            return value
        # else a complex or a datetime: refused below by its type, with the metric's name
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"metric {key!r}: cannot log {type(value).__name__}; log numbers, strings or JSON-able lists/dicts"
        ) from None
    return value


def _scalar(value: int | float) -> float:
    """The float TensorBoard, wandb and the bar get. An int past float's range (metrics.jsonl
    keeps it exact) is shown as an infinity of its sign rather than stopping the run."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _encode(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    # The inverse of _encode, nested values included (a dict metric, the summary's metrics).
    if isinstance(value, str):
        return _NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _plain_config(config: Any) -> dict | None:
    if config is None:
        return None
    from loomrl.config import to_dict

    plain = to_dict(config)
    if not isinstance(plain, dict):
        raise TypeError(
            f"config_dict must be a dict or a config dataclass, got {type(config).__name__}"
        )
    return plain


def config_text(config: Any) -> str:
    """What a ``RunLogger`` given ``config`` writes as ``config.yaml``."""
    import yaml

    return yaml.safe_dump(_plain_config(config), sort_keys=False)


def _ends_mid_line(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except FileNotFoundError:
        return False


def say(text: str, stream: Any = None) -> None:
    """Print ``text`` and a newline to ``stream`` (default: stdout), flushed. A stream whose
    reader has left (``loomrl run ... | head``) goes to /dev/null from then on, without an
    error: what a run prints is for whoever watches it, its files are its record, and it goes
    on."""
    stream = sys.stdout if stream is None else stream
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:
        _to_devnull(stream)


def quiet_closed_stdout() -> bool:
    """After a BrokenPipeError: whether it came from stdout's reader leaving (``loomrl ... |
    head``); if so, stdout goes to /dev/null from then on (the flush at exit too)."""
    if not _stdout_reader_gone():
        return False
    _to_devnull(sys.stdout)
    return True


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe nobody reads any more. The failed write emptied the buffer, so
    a flush need not fail again; poll reports the reader's end closed (POLLERR) either way."""
    import select

    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return True
    except (OSError, ValueError):
        return False
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        # a pipe's closed reader shows as POLLERR, a socket's as POLLHUP
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll here, or stdout is no file
        return False


def _to_devnull(stream: Any) -> None:
    """Point ``stream``'s file descriptor at /dev/null: its later writes, and the flush at exit
    of what it still holds, succeed unseen."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # no file behind it: nothing to point
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _open_tensorboard(log_dir: Path, purge_step: int | None = None) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            log.warning(
                "TensorBoard logging skipped: no SummaryWriter (pip install tensorboard); "
                "metrics still go to %s",
                METRICS_FILE,
            )
            return None
    if purge_step is not None and log_dir.is_dir():  # readers drop earlier rows from this step
        return SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)
    return SummaryWriter(log_dir=str(log_dir))


def _open_wandb(
    mode: str, run_dir: Path, config: dict | None, project: str, name: str | None
) -> Any:
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            [
                f"wandb: {mode!r} needs the wandb package, which is not installed \u2014 "
                "pip install wandb, or set wandb=off"
            ]
        ) from None
    return wandb.init(project=project, name=name, dir=str(run_dir), config=config or {}, mode=mode)


def _atomic_write(path: Path, text: str) -> None:
    # Readers (a dashboard, the plotter) see the old file or the new one, never half of one.
    from loomrl.config import atomic_write_text

    atomic_write_text(path, text)


# --------------------------------------------------------------------------------------
# A run directory used again
# --------------------------------------------------------------------------------------

# What a run writes into its directory (and nothing else there is moved or trimmed: a user may
# point output_dir at a folder that holds other files).
RUN_RECORDS = (
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    TENSORBOARD_DIR,
    "timeline.jsonl",
    "plan.json",
    "profile.json",
    "adapt.jsonl",
    "adapted.json",
    "restarts.jsonl",
    "trials.json",
    "cycle_costs.json",
    "tool_plan.json",
    "tool_events.jsonl",
    "env_events.jsonl",
    "checkpoints",
    "plots",
    "wandb",
    "timeline_measured_vs_predicted.png",
    "trace.json",
    ".failure-injected",
    ".attempt.json",
    ".attempt.json.tmp",
)
# Records of steps, by whether a row of step s belongs to a run resumed after s steps (metrics
# and tool events: the row logged after s steps; timeline and adaptation: iteration s, 0-based,
# which it runs).
_STEP_RECORDS = {
    METRICS_FILE: True,
    "timeline.jsonl": False,
    "tool_events.jsonl": True,
    "adapt.jsonl": False,
}


# Records that only a run that got going writes (a run that failed at its start leaves at most
# a config, an empty metrics file and its summary).
_RAN = (
    "timeline.jsonl",
    "checkpoints",
    "restarts.jsonl",
    "env_events.jsonl",
    "tool_events.jsonl",
    ".failure-injected",
)


def set_aside_records(
    run_dir: str | os.PathLike,
    keep: Sequence[str | os.PathLike] = (),
    config: str | None = None,
) -> Path | None:
    """Move an earlier run's records (``RUN_RECORDS``) out of ``run_dir`` into
    ``run_dir/before-<time>/``, kept whole, and return where; None when there were none. A new
    run in a used directory calls this first, so that its logs, reports and restarts never mix
    with the earlier run's. ``keep``: files the new run reads (its plan or profile file, which
    may be the earlier run's): copied there, left in place. ``config``: the text the new run
    writes as ``config.yaml`` (``config_text``); a ``config.yaml`` there that says anything else
    (written by hand, or by a run with other settings) is set aside too, not written over."""
    import shutil

    d = Path(run_dir)
    found = [d / name for name in RUN_RECORDS if (d / name).exists()]
    kept = {Path(k).resolve() for k in keep}
    metrics = d / METRICS_FILE
    logged = metrics.is_file() and metrics.stat().st_size > 0
    summary = d / SUMMARY_FILE
    if (
        not logged
        and not _other_config(d / CONFIG_FILE, config)
        and not any(p.name in _RAN for p in found)
        and (not summary.exists() or _failed_at_start(summary))
    ):
        # No earlier run: at most the new run's own config, an empty metrics file and the
        # summary of a run that failed at its start (the new run writes over them), or a plot
        # left by hand. That summary goes now: a new run killed before it writes its own must
        # not show it.
        summary.unlink(missing_ok=True)
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, n = d / f"before-{stamp}", 1
    while dest.exists():
        n += 1
        dest = d / f"before-{stamp}-{n}"
    dest.mkdir()
    for p in found:
        if p.resolve() in kept:
            shutil.copy2(p, dest / p.name)
        elif any(p.resolve() in k.parents for k in kept):  # a folder holding one of them
            shutil.copytree(p, dest / p.name)
        else:
            os.rename(p, dest / p.name)
    return dest


def count_lines(path: str | os.PathLike) -> int:
    """Non-empty lines of ``path``, a record of one line per event (0 when it does not exist)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


def _other_config(path: Path, config: str | None) -> bool:
    """Whether ``path`` holds a config other than ``config`` (None: no config to compare)."""
    if config is None or not path.exists():
        return False
    try:
        return path.read_text(encoding="utf-8") != config
    except (OSError, UnicodeDecodeError):  # not one a run wrote: kept rather than lost
        return True


def _failed_at_start(summary: Path) -> bool:
    """Whether ``summary`` is a run's that stopped before completing a step."""
    try:
        s = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(s, dict)
        and s.get("status") in ("failed", "interrupted")
        and not s.get("steps_done")
    )


def trim_records(run_dir: str | os.PathLike, step: int) -> dict[str, int]:
    """Cut ``run_dir``'s step records back to a run resumed after ``step`` completed steps: the
    rows of later steps (written after the checkpoint it resumes from) and lines cut short by a
    crash are dropped, so the resumed run's rows follow the kept ones once each. Returns the
    number of lines dropped per file (only files that lost any)."""
    dropped = {}
    for name, inclusive in _STEP_RECORDS.items():
        path = Path(run_dir) / name
        if not path.is_file():
            continue
        kept, lost = [], 0
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    s = json.loads(line)["step"]
                    keep = s <= step if inclusive else s < step
                except (ValueError, KeyError, TypeError):
                    keep = False
                if keep:
                    kept.append(line if line.endswith("\n") else line + "\n")
                elif line.strip():
                    lost += 1
        if lost:
            _atomic_write(path, "".join(kept))
            dropped[name] = lost
    return dropped


LOCK_FILE = ".loomrl.lock"


def lock_run_dir(run_dir: str | os.PathLike, resume: bool = False) -> Any:
    """Hold ``run_dir`` for this process until it exits (or the returned file is closed): a
    second run into the same directory would set this one's records aside and interleave its
    rows with them. Raises ``ConfigError`` naming the directory when another process holds it,
    with the way out for a new run or, with ``resume``, for a resume of the run there (which
    cannot move elsewhere). An advisory lock (``flock``) on the directory's lock file: the
    system drops it with the process, so a crashed run leaves nothing to clean up."""
    import fcntl

    path = Path(run_dir) / LOCK_FILE
    try:
        f = open(path, "a+")  # noqa: SIM115 - held open for the run's lifetime
    except OSError as e:  # a directory this user may not write to, say
        raise ConfigError(
            [
                f"{run_dir}: cannot hold its lock file {LOCK_FILE} ({e.strerror}); a run needs a "
                "directory it can write to: give another output_dir, or fix its permissions"
            ]
        ) from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        who = f.read().strip() or "another process"
        f.close()
        if resume:
            pid = who.removeprefix("pid ")
            stop = f"`kill {pid}`" if pid.isdigit() else "kill"
            problem = (
                f"{run_dir} is in use by a running loomrl run ({who}); wait for it to end, or "
                f"stop it (Ctrl-C where it runs, or {stop}), then resume"
            )
        else:
            problem = (
                f"run.output_dir={str(run_dir)!r} is in use by a running loomrl run ({who}); "
                "wait for it to end, or give this run another output_dir"
            )
        raise ConfigError([problem]) from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    return f
