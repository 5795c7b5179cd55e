"""scripts/plan_exactness.py: agrees on a few profiles, reports and fails on a wrong reference,
and puts back what it patched."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _scripts import load_script  # noqa: E402


def test_exactness_script_passes_and_restores(capsys):
    mod = load_script("scripts/plan_exactness.py")
    before = (mod.search._DENSE_OPTIONS, mod.search._scout, mod.search._DP._hybrid)
    assert mod.main(["--brute", "6", "--dense-brute", "6", "--plain", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "mismatches: 0 of 13"
    assert (mod.search._DENSE_OPTIONS, mod.search._scout, mod.search._DP._hybrid) == before


def test_exactness_script_fails_on_a_mismatch(monkeypatch, capsys):
    mod = load_script("scripts/plan_exactness.py")
    real = mod.search.exhaustive_times

    def off(prof):
        return {k: (v * 1.01 if v is not None else None) for k, v in real(prof).items()}

    monkeypatch.setattr(mod.search, "exhaustive_times", off)
    assert mod.main(["--brute", "4", "--dense-brute", "0", "--plain", "0"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH brute seed" in out and out.splitlines()[-1].startswith("mismatches: ")
