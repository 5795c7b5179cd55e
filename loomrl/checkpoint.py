"""Atomic, verified checkpoints and RNG state capture.

A checkpoint is a directory ``<run_dir>/checkpoints/step-000120/`` holding one file per
state entry and a ``manifest.json`` that lists every file with its size and sha256:

    meta.json        entries that are plain JSON (counters, config, data-loader position)
    <name>.pt        each other entry, through torch.save (the recipes' actor.pt: weights and
                     optimizer; rng.pt: the RNG states)
    manifest.json    {"format": 1, "step": 120, "time": ..., "entries": {...}, "files": {...}}

It is written under a hidden temporary name (``.tmp-step-000120-<pid>``), each file is
fsynced, the manifest is written last, then the directory is fsynced and renamed into place
in one atomic step. So a crash at any moment leaves either the previous checkpoint or the new
one, never half of one; ``latest_checkpoint`` also re-verifies the checksums, so a file
corrupted later (a full disk, a bad copy) makes it fall back to the previous checkpoint.

This module does not know what a model is: it stores what it is given. torch is imported
only when an entry needs it. ``load_checkpoint`` unpickles with ``weights_only=True`` by
default (tensors, containers and numbers only); ``capture_rng`` returns state in that form.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from loomrl.errors import LoomError
from loomrl.runlog import RunDirWriteError, write_failure

__all__ = [
    "CheckpointError",
    "CheckpointWriteError",
    "save_checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "verify_checkpoint",
    "checkpoint_step",
    "list_checkpoints",
    "set_aside",
    "capture_rng",
    "restore_rng",
    "follow_umask",
]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
META_FILE = "meta.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_ENTRY_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")

# Test seam: called after each data file is written and synced, before the manifest.
# Lets a test kill the writer half-way through a save.
_after_file_hook: Callable[[Path], None] | None = None


class CheckpointError(LoomError):
    """A checkpoint is missing, incomplete or does not match its manifest."""


class CheckpointWriteError(CheckpointError, RunDirWriteError):
    """A checkpoint could not be written (a full disk): the earlier ones stay intact. An
    OSError too, as the bare one it replaces was."""


def _checkpoints_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def _step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


# --------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    state: Mapping[str, Any],
    keep: int | None = 3,
) -> Path:
    """Write ``state`` atomically as ``<run_dir>/checkpoints/step-<step:06d>`` and return its path.

    ``state`` maps entry names (file-name safe: letters, digits, ``_.-``) to values. Values that
    are plain JSON (dict with str keys, list, str, int, float, bool, None) go to ``meta.json``;
    anything else (tensors, state dicts, tuples) is saved with ``torch.save`` as ``<name>.pt``.
    An existing checkpoint of the same step is replaced. Afterwards older checkpoints are pruned
    so that ``keep`` remain, this one included (``keep=None`` keeps all). Checkpoints of later
    steps than ``step`` are never pruned.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"keep must be an int >= 1 or None (keep all), got {keep!r}")
    _check_entry_names(state)

    root = _checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / _step_dir_name(step)
    tmp = root / f".tmp-{_step_dir_name(step)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        manifest = _write_entries(tmp, state)
        manifest.update({"format": FORMAT_VERSION, "step": step, "time": time.time()})
        # The manifest is the commit record: written (and synced) only once all data is down.
        _write_file(tmp / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())
        _fsync_dir(tmp)
        _move_into_place(tmp, final)
        _fsync_dir(root)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        # torch.save on a full disk raises a RuntimeError ("unexpected pos") around the
        # OSError: either way it is the disk, which the user can fix and resume from.
        if isinstance(e, OSError) or isinstance(e.__context__ or e.__cause__, OSError):
            what = f"the checkpoint of step {step}"
            raise write_failure(e, what, final, Path(run_dir), CheckpointWriteError) from e
        raise
    _clean_stale_temp_dirs(root)
    if keep is not None:
        _prune(root, step, keep)
    return final


def _check_entry_names(state: Mapping[str, Any]) -> None:
    if not isinstance(state, Mapping):
        raise TypeError(
            f"state must be a mapping of entry name to value, got {type(state).__name__}"
        )
    for name in state:
        if not isinstance(name, str) or not _ENTRY_NAME.match(name):
            raise ValueError(
                f"checkpoint entry name {name!r} is not file-name safe: use letters, digits, '_', '.', '-'"
            )
        if name in ("manifest", "meta"):
            raise ValueError(f"checkpoint entry name {name!r} is reserved; pick another name")


def _write_entries(directory: Path, state: Mapping[str, Any]) -> dict[str, Any]:
    files: dict[str, dict[str, Any]] = {}
    entries: dict[str, str] = {}
    meta = {name: value for name, value in state.items() if _is_plain_json(value)}
    tensors = {name: value for name, value in state.items() if name not in meta}
    if meta:
        path = directory / META_FILE
        _write_file(path, json.dumps(meta, indent=1, allow_nan=True).encode())
        files[META_FILE] = _describe(path)
        entries.update({name: META_FILE for name in meta})
        _after_write(path)
    if tensors:
        import torch  # only when an entry needs it

        for name, value in tensors.items():
            path = directory / f"{name}.pt"
            with open(path, "wb") as f:
                torch.save(value, f)
                f.flush()
                os.fsync(f.fileno())
            files[path.name] = _describe(path)
            entries[name] = path.name
            _after_write(path)
    return {"files": files, "entries": entries}


def _after_write(path: Path) -> None:
    if _after_file_hook is not None:
        _after_file_hook(path)


def _is_plain_json(value: Any) -> bool:
    """True when ``json`` stores ``value`` without changing its type (no tuples, no int keys)."""
    # Exact types: a numpy float or an IntEnum would come back from JSON as something else.
    if type(value) in (type(None), bool, int, float, str):
        return True
    if type(value) is list:
        return all(_is_plain_json(v) for v in value)
    if type(value) is dict:
        return all(isinstance(k, str) and _is_plain_json(v) for k, v in value.items())
    return False


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _describe(path: Path) -> dict[str, Any]:
    return {"sha256": _sha256(path), "bytes": path.stat().st_size}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _verified_sha256(path: Path) -> str:
    """The file's sha256 as a check read it, read once per process while it stays the same
    file: a resume checks its checkpoint where it picks it, then where it restores and loads it
    (a language model's actor state is gigabytes). A save's own hash is never reused here, so
    what a check vouches for it has read."""
    st = path.stat()
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = _sha256(path)
    return _HASHED[key]


_HASHED: dict[tuple, str] = {}  # (path, inode, bytes, mtime) -> sha256
_TOLD: set[tuple[str, str]] = set()  # (checkpoint, why it was skipped) already logged


def _fsync_dir(path: Path) -> None:
    # Makes the directory entries (new files, a rename) durable, not only the file contents.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _move_into_place(tmp: Path, final: Path) -> None:
    if not final.exists():
        os.rename(tmp, final)
        return
    # rename() cannot replace a non-empty directory: move the old one aside first. A crash
    # between the two renames leaves no step-N directory, and the previous one is used.
    aside = final.with_name(f".old-{final.name}-{os.getpid()}")
    os.rename(final, aside)
    os.rename(tmp, final)
    shutil.rmtree(aside, ignore_errors=True)


def _clean_stale_temp_dirs(root: Path) -> None:
    """Remove temp/aside directories left by writers that have died."""
    for p in root.iterdir():
        m = re.match(r"^\.(?:tmp|old|trash)-step-\d+-(\d+)$", p.name)
        if m and p.is_dir() and not pid_alive(int(m.group(1))):
            log.info("removing %s left by a writer (pid %s) that is gone", p, m.group(1))
            shutil.rmtree(p, ignore_errors=True)


def follow_umask(directory: str | os.PathLike) -> None:
    """Give every file under ``directory`` the mode a new file gets there (0666 less the
    umask), as the run's other outputs have. Libraries that write through a private temp file
    and rename it (safetensors, through transformers' ``save_pretrained``) leave theirs 0600:
    a model exported for a group to share would be unreadable to it."""
    root = Path(directory)
    # The mode a file created there gets, read off one made: no umask() call to race with.
    probe = root / f".mode-probe-{os.getpid()}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        os.close(fd)
        mode = probe.stat().st_mode & 0o777
    finally:
        probe.unlink()
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, mode)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (stale files of dead writers may go)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _prune(root: Path, step: int, keep: int) -> None:
    older = [(s, p) for s, p in list_checkpoints(root.parent) if s < step]
    # The one just written counts as one of the `keep`.
    for s, p in older[: max(len(older) - (keep - 1), 0)]:
        # Rename first so that a crash mid-delete leaves a hidden directory, not a broken step-N.
        trash = root / f".trash-{p.name}-{os.getpid()}"
        try:
            os.rename(p, trash)
        except OSError as e:
            log.warning("could not prune checkpoint %s: %s", p, e)
            continue
        shutil.rmtree(trash, ignore_errors=True)
        log.debug("pruned checkpoint of step %d", s)


# --------------------------------------------------------------------------------------
# Finding and loading
# --------------------------------------------------------------------------------------


def set_aside(run_dir: str | os.PathLike) -> Path | None:
    """Move an earlier run's checkpoints out of ``run_dir/checkpoints`` (to
    ``checkpoints-before-<time>`` beside it, kept whole) and return where; None when there were
    none. A fresh run in a reused directory calls this first, so that its restarts resume from
    its own checkpoints, never from a later step another run left there."""
    root = _checkpoints_dir(run_dir)
    if not list_checkpoints(run_dir):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = root.with_name(f"checkpoints-before-{stamp}")
    n = 1
    while dest.exists():
        n += 1
        dest = root.with_name(f"checkpoints-before-{stamp}-{n}")
    os.rename(root, dest)
    return dest


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step-N`` directory under ``run_dir/checkpoints``, oldest first.

    Temp directories are left out; the checkpoints themselves are not verified here."""
    root = _checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return sorted(found)


def verify_checkpoint(path: str | os.PathLike) -> list[str]:
    """Every reason ``path`` is not a complete, intact checkpoint; an empty list when it is."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return [f"no {MANIFEST} (the save did not finish)"]
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as e:
        return [f"{MANIFEST} is unreadable: {type(e).__name__}: {e}"]
    absent = [
        k
        for k in ("format", "step", "entries", "files")
        if not isinstance(manifest, dict) or k not in manifest
    ]
    if absent:
        return [f"{MANIFEST} lacks {', '.join(absent)}"]
    files, entries = manifest["files"], manifest["entries"]
    if manifest.get("format") != FORMAT_VERSION:
        return [
            f"{MANIFEST} has format {manifest.get('format')!r}, this loomrl reads {FORMAT_VERSION}"
        ]
    # A manifest edited or written by something else must not crash the search for the last
    # good checkpoint: a shape it does not have is a reason to skip it, like a bad checksum.
    if not isinstance(files, dict) or not all(isinstance(i, dict) for i in files.values()):
        return [f"{MANIFEST}: 'files' is not a mapping of file name to its bytes and sha256"]
    if not isinstance(entries, dict) or not all(isinstance(f, str) for f in entries.values()):
        return [f"{MANIFEST}: 'entries' is not a mapping of entry name to file name"]
    problems = []
    for entry, name in sorted(entries.items()):
        if name not in files:  # load_checkpoint would read it unchecked, whatever it holds
            problems.append(
                f"entry {entry!r} is stored in {name}, which {MANIFEST} lists no checksum for"
            )
    for name, info in sorted(files.items()):
        f = path / name
        if Path(name).name != name:
            problems.append(f"{name} is not a file of the checkpoint directory")
            continue
        if not f.is_file():
            problems.append(f"{name} is missing")
            continue
        size = f.stat().st_size
        if size != info.get("bytes"):
            problems.append(f"{name} has {size} bytes, the manifest says {info.get('bytes')}")
        elif _verified_sha256(f) != info.get("sha256"):
            problems.append(f"{name} does not match its sha256 in the manifest")
    return problems


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest verified checkpoint under ``run_dir/checkpoints``, or None.

    Unfinished (temp) and corrupted checkpoints are skipped with a log line saying why."""
    root = _checkpoints_dir(run_dir)
    if not root.is_dir():
        return None
    for p in sorted(root.iterdir()):
        if p.name.startswith((".tmp-", ".old-", ".trash-")):
            log.info("skipping %s: an unfinished write or delete", p)
    for _step, p in reversed(list_checkpoints(run_dir)):
        problems = verify_checkpoint(p)
        if not problems:
            return p
        why = "; ".join(problems)
        if (str(p), why) not in _TOLD:  # a resume looks twice: say it once
            _TOLD.add((str(p), why))
            log.warning("skipping checkpoint %s: %s", p, why)
    return None


def checkpoint_step(path: str | os.PathLike) -> int:
    """The training step recorded in a checkpoint's manifest."""
    manifest_path = Path(path) / MANIFEST
    try:
        return int(json.loads(manifest_path.read_text())["step"])
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"cannot read the step of {path}: {e}") from e


def load_checkpoint(
    path: str | os.PathLike,
    map_location: Any = "cpu",
    weights_only: bool = True,
    verify: bool = True,
) -> dict[str, Any]:
    """Load the state saved by ``save_checkpoint``: the same entry names and values.

    ``verify`` checks every checksum first and raises ``CheckpointError`` on a mismatch.
    ``weights_only=True`` refuses pickled arbitrary objects; pass False only for checkpoints
    you trust (unpickling can run code).
    """
    path = Path(path)
    if verify:
        problems = verify_checkpoint(path)
        if problems:
            raise CheckpointError(f"checkpoint {path} is not intact: " + "; ".join(problems))
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path / MANIFEST}: {e}") from e
    entries: dict[str, str] = manifest["entries"]
    meta: dict[str, Any] = {}
    if META_FILE in entries.values():
        meta = json.loads((path / META_FILE).read_text())
    state: dict[str, Any] = {}
    for name, filename in entries.items():
        if filename == META_FILE:
            state[name] = meta[name]
            continue
        import torch

        try:
            state[name] = torch.load(
                path / filename, map_location=map_location, weights_only=weights_only
            )
        except Exception as e:
            if weights_only and "weights_only" in str(e):
                raise CheckpointError(
                    f"{path / filename} holds objects other than tensors and containers; "
                    "if you trust this checkpoint, load it with weights_only=False"
                ) from e
            raise
    return state


# --------------------------------------------------------------------------------------
# RNG state
# --------------------------------------------------------------------------------------


def capture_rng() -> dict[str, Any]:
    """The global RNG states of python ``random``, numpy and torch (CPU and every CUDA device).

    Only tensors, tuples, lists and numbers, so the result saves with ``save_checkpoint`` and
    loads with ``weights_only=True``. Generators you create yourself (``np.random.Generator``,
    ``torch.Generator``) are yours to save.
    """
    state: dict[str, Any] = {"python": random.getstate()}
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
        state["numpy"] = (name, [int(k) for k in keys], int(pos), int(has_gauss), float(gauss))
    try:
        import torch
    except ImportError:
        return state
    state["torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Restore what ``capture_rng`` captured. A missing part is left as it is; CUDA states are
    restored only when the same number of CUDA devices is visible (logged otherwise)."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if "torch" in state or "cuda" in state:
        import torch

        if "torch" in state:
            torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8).cpu())
        if "cuda" in state:
            cuda = state["cuda"]
            if torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
                torch.cuda.set_rng_state_all(
                    [torch.as_tensor(s, dtype=torch.uint8).cpu() for s in cuda]
                )
            else:
                visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
                log.warning(
                    "not restoring CUDA RNG state: saved for %d device(s), %d visible",
                    len(cuda),
                    visible,
                )
