"""finish_first: an interrupt while a checkpoint is written waits for the write to end."""

from __future__ import annotations

import os
import signal

import pytest

from loomrl.run import finish_first


@pytest.fixture(autouse=True)
def _python_sigint():
    # Python's own Ctrl-C handler, whatever started the tests (a background job ignores SIGINT).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _interrupt(sig: int = signal.SIGINT) -> None:
    os.kill(os.getpid(), sig)


def test_one_ctrl_c_lets_the_save_finish_then_interrupts(capsys):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with finish_first("the checkpoint of step 3"):
            _interrupt()
            done.append("saved")  # reached: the interrupt waits
    assert done == ["saved"]
    assert "finishing the checkpoint of step 3 first; Ctrl-C again" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_leaves_at_once():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with finish_first("the save"):
            _interrupt()
            _interrupt()
            done.append("saved")
    assert done == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_sigterm_is_handed_to_its_own_handler_after_the_save():
    seen = []
    before = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        with finish_first("the save"):
            _interrupt(signal.SIGTERM)
            assert seen == []  # held while the save runs
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_nothing_happens_without_an_interrupt():
    with finish_first("the save"):
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_ctrl_c_stays_ignored():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    done = []
    with finish_first("the save"):
        _interrupt()
        _interrupt()
        done.append("saved")
    assert done == ["saved"]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
