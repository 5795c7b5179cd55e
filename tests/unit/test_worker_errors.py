"""Ray's log lines about results no one read: those of dead workers are dropped, others kept."""

from __future__ import annotations

import logging

from loomrl.worker import _DeadWorkerNoise


def _line(e: BaseException) -> logging.LogRecord:
    msg = f"Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): {e}"
    return logging.LogRecord("ray._private.worker", logging.ERROR, __file__, 1, msg, None, None)


def test_unhandled_errors_of_dead_workers_are_dropped_and_others_kept():
    from ray import exceptions as rex

    quiet = _DeadWorkerNoise()
    # The message of a dead actor's error need not name its class.
    assert not quiet.filter(_line(rex.ActorDiedError()))
    assert not quiet.filter(_line(rex.RayActorError()))
    assert quiet.filter(_line(ValueError("a user's stage raised")))  # a real error: kept
    other = logging.LogRecord("x", logging.ERROR, __file__, 1, "The actor died", None, None)
    assert quiet.filter(other)  # only Ray's unhandled-error lines are looked at
