"""Load a repository script (benchmarks/, scripts/) as a module, for tests of its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(rel: str) -> ModuleType:
    """The script at ``ROOT / rel``, imported under ``_script_<its file name>`` (registered in
    ``sys.modules`` first, as an import does: dataclasses look their module up there)."""
    path = ROOT / rel
    name = f"_script_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
