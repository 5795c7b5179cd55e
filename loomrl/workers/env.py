"""The env worker: one ``VecEnv`` of simulators in a loomrl worker process.

Rank ``r`` of a group of env workers holds envs ``[r * num_envs, (r + 1) * num_envs)`` of the
logical batch (``index_offset = rank * num_envs``), so any number of workers together behave like
one ``VecEnv`` of all the envs: same seeds, same RNG streams, same per-row sampling keys. The
worker reserves its CPU cores through ``Cluster.launch(..., num_cpus=env.cpu_cores)``.

``step`` takes the policy's output for a whole group (a list with one action array per env
worker part of that group) and the part it should apply, so the policy's result can be passed
to every env worker of the group as one Ray object reference while the driver goes on
submitting. Where every group lies on one env worker, ``run_groups`` lets the worker call the
policy itself instead (``EnvPolicyCycle(handoff="direct")``). On one node, ``run_pipe``
passes replies and actions to and from the policy worker over a socket of their own, any
layout (``handoff="pipe"``). Every reply carries what the policy needs next: the
observations to act on and the (global env id, env step) keys of those rows.

A pixel env worker placed on a GPU renders (EGL) on that GPU: rendering beside the policy on one
GPU slowed both sides when they ran at once (a split cycle), while rendering on a GPU of its
own did not (scripts/gpu/RESULTS.md, session of 2026-11-30). ``MUJOCO_EGL_DEVICE_ID``, when set,
wins.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from loomrl.envs.vec import EnvConfig, VecEnv
from loomrl.worker import Worker

__all__ = ["EnvWorker", "PolicyCallError", "StepReply", "egl_device_for"]

StepReply = dict[str, Any]
"""What ``EnvWorker.observe`` / ``step`` return, arrays indexed by row of the stepped slice:
obs[n, *obs_shape] (to act on next), env_ids[n], env_steps[n] (sampling keys of those rows);
``step`` adds final_obs, reward, terminated, truncated, failed (see ``loomrl.envs.StepResult``)."""


def egl_device_for(visible: str | None, environ: Mapping[str, str]) -> str | None:
    """The ``MUJOCO_EGL_DEVICE_ID`` for a worker whose ``CUDA_VISIBLE_DEVICES`` is ``visible``:
    its first GPU (EGL does not read ``CUDA_VISIBLE_DEVICES``, so without it every worker
    renders on EGL device 0). None when there is nothing to set: the variable is already set
    in ``environ``, no GPU is visible, or GPUs are named by UUID. Assumes EGL lists NVIDIA GPUs
    in CUDA's order, as it did on the H200 hosts (nvidia-smi showed the renderers there). Pure."""
    if "MUJOCO_EGL_DEVICE_ID" in environ or not visible:
        return None
    first = visible.split(",")[0].strip()
    return first if first.isdigit() else None


class EnvWorker(Worker):
    """``env.num_envs`` simulators per worker; ranks hold consecutive slices of the batch."""

    def __init__(self, env: EnvConfig) -> None:
        super().__init__()
        self.cfg = env
        if env.pixels and self.device_kind == "gpu":
            dev = egl_device_for(os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ)
            if dev is not None:  # before the first render creates the EGL display
                os.environ["MUJOCO_EGL_DEVICE_ID"] = dev
        # Every env worker of the group on this node may build at once: each projects its
        # simulators times their count against this node's available memory
        # (loomrl.envs.memory); ranks on other nodes use other nodes' memory.
        self.venv = VecEnv(
            env, index_offset=self.rank * env.num_envs, memory_share=self.local_world_size
        )
        self.busy_s = 0.0  # time spent inside step(), for the cycle's timing report
        # Time spent waiting for actions in a rollout this worker drives (pipe or direct hand-
        # offs): what the policy's pace costs the simulators.
        self.wait_s = 0.0
        self.calls = 0

    # -- what the driver and the policy need to know -------------------------------------------
    def spaces(self) -> dict[str, Any]:
        """Observation / action spaces of one env (gymnasium objects, picklable)."""
        return {
            "observation_space": self.venv.single_observation_space,
            "action_space": self.venv.single_action_space,
            "num_envs": self.venv.num_envs,
            "index_offset": self.venv.index_offset,
            "render_path": self.venv.render_path,  # pixels: "batched" or why env by env
        }

    def config(self) -> dict[str, Any]:
        return asdict(self.cfg)

    # -- the cycle ------------------------------------------------------------------------------
    def reset(self) -> np.ndarray:
        """Start a new episode in every env of this worker -> obs [num_envs, *obs_shape]."""
        return self.venv.reset()

    def observe(self, lo: int = 0, hi: int | None = None) -> StepReply:
        """The current observations of local envs [lo, hi) with their sampling keys (resets
        the envs first if they never were)."""
        if self.venv.obs is None:
            self.venv.reset()
        sl = slice(lo, self.venv.num_envs if hi is None else hi)
        ids, steps = self.venv.row_ids(sl)
        return {
            "obs": self.venv.obs[sl],  # type: ignore[index]
            "env_ids": np.asarray(ids),
            "env_steps": steps,
        }

    def step(self, actions: Any, part: int | None, lo: int, hi: int, *after: Any) -> StepReply:
        """Step local envs [lo, hi) with ``actions[part]`` (or ``actions`` when part is None).

        ``after``: ignored; object references passed there make the call wait for other calls
        (how ``measure_costs`` chains calls the way the cycle does)."""
        t = time.perf_counter()
        a = actions if part is None else actions[part]
        sl = slice(lo, hi)
        res = self.venv.step(a, sl)
        ids, steps = self.venv.row_ids(sl)
        self.busy_s += time.perf_counter() - t
        self.calls += 1
        return {
            "obs": res.obs,
            "final_obs": res.final_obs,
            "reward": res.reward,
            "terminated": res.terminated,
            "truncated": res.truncated,
            "failed": res.failed,
            "env_ids": np.asarray(ids),
            "env_steps": steps,
        }

    def run_groups(self, policy: Any, parts: list[tuple[int, int]], steps: int) -> None:
        """Drive this worker's ring groups (local envs ``[lo, hi)`` each) through ``steps`` steps,
        calling the ``policy`` actor itself: each hand-off is one message, policy to env, where
        a driver-submitted cycle's takes two (the policy's result goes back to the driver, the
        result's owner, which sends it on with the next call). The policy acts on each group
        as it would through the driver (same calls, same order per group), so the trajectories
        are the same. Groups take turns: while this worker steps one, the policy acts on the
        next. A failed policy call is raised as ``PolicyCallError``, naming the call."""
        from loomrl.cycle import settle

        pending = [policy.act.remote(0, self.observe(lo, hi)) for lo, hi in parts]
        try:
            for t in range(steps):
                for g, (lo, hi) in enumerate(parts):
                    w0 = time.perf_counter()
                    actions = _policy_result(pending[g], "act", t, lo, hi)
                    self.wait_s += time.perf_counter() - w0
                    reply = self.step(actions, 0, lo, hi)
                    last = t + 1 == steps
                    pending[g] = (
                        policy.close_group.remote(reply)
                        if last
                        else policy.act.remote(t + 1, reply)
                    )
            for g, (lo, hi) in enumerate(parts):
                _policy_result(pending[g], "close_group", steps - 1, lo, hi)
        except BaseException:
            # None of this worker's policy calls may still run when the error reaches the
            # driver: the next rollout's begin() would race them for the policy's buffer.
            settle(pending)
            raise

    def run_pipe(
        self,
        address: str,
        token: str,
        rank: int,
        parts: list[tuple[int, int]],
        steps: int,
        timeout: float,
        stats: bool = False,
    ) -> dict[str, Any] | None:
        """Drive this worker's parts (local envs ``[lo, hi)``, in ring-group order) through
        ``steps`` steps of rollout ``token`` over one socket to the policy worker's
        ``serve_pipe`` at ``address`` (``EnvPolicyCycle(handoff="pipe")``): observations go out
        as pickled replies, actions come back, no Ray call per step. The policy visits the
        groups in the driver's order, so the trajectories are the same. Errors on either side travel over the socket as an
        ``("error", message)`` so that the other side stops at once; a policy that is gone,
        silent for ``timeout`` seconds, or raising becomes ``PolicyCallError``. ``stats``:
        return ``pop_stats()`` at the end, which then needs no call of its own."""
        from loomrl.transport._socket import connect

        try:
            conn = connect(address, timeout)
        except OSError as e:
            raise PolicyCallError(
                f"cycle_handoff='pipe': env worker {rank} cannot reach the policy worker's "
                f"socket {address!r} ({type(e).__name__}: {e}); pipe hand-offs need the env "
                "workers and the policy on one node: use cycle_handoff: driver"
            ) from None
        try:
            _pipe_send(conn, ("hello", token, rank), 0, 0, 0)
            for lo, hi in parts:
                _pipe_send(conn, ("reply", self.observe(lo, hi)), 0, lo, hi)
            for t in range(steps):
                for lo, hi in parts:
                    # Twice the policy's wait: where another env worker is the silent one, the
                    # policy names it and tells this worker, before this worker gives up.
                    w0 = time.perf_counter()
                    actions = _pipe_actions(conn, 2 * timeout, t, lo, hi)
                    self.wait_s += time.perf_counter() - w0
                    _pipe_send(conn, ("reply", self.step([actions], 0, lo, hi)), t + 1, lo, hi)
        except PolicyCallError:
            raise
        except BaseException as e:
            try:  # the policy is waiting for this worker: tell it why nothing comes
                conn.send(("error", f"env worker {rank}: {type(e).__name__}: {e}"))
            except OSError:
                pass
            raise
        finally:
            conn.close()
        return self.pop_stats() if stats else None

    def sample_actions(self, n: int, seed: int = 0) -> np.ndarray:
        """``n`` random valid actions (for timing the simulator without a policy)."""
        space = self.venv.single_action_space
        space.seed(seed)
        return np.stack([space.sample() for _ in range(n)])

    def pop_busy(self) -> float:
        """Seconds spent inside step() since the last pop (see PolicyWorker.pop_busy); the wait
        for actions restarts too, so that the next ``pop_stats`` counts from here."""
        busy, self.busy_s, self.wait_s = self.busy_s, 0.0, 0.0
        return busy

    def time_step(self, n: int, reps: int) -> float:
        """Median seconds of stepping ``n`` local envs with random actions, inside the worker."""
        a = self.sample_actions(n)
        if self.venv.obs is None:
            self.venv.reset()
        out = []
        for _ in range(reps):
            t = time.perf_counter()
            self.venv.step(a, slice(0, n))
            out.append(time.perf_counter() - t)
        return float(np.median(out))

    # -- statistics ------------------------------------------------------------------------------
    def pop_stats(self) -> dict[str, Any]:
        """Episodes finished and events since the last call, plus time spent stepping."""
        s = self.venv.pop_episode_stats()
        events = [asdict(e) for e in self.venv.pop_events()]
        out = {
            "returns": list(s.returns),
            "lengths": list(s.lengths),
            "successes": list(s.successes),
            "ends": [list(e) for e in s.ends],
            "success_ends": [list(e) for e in s.success_ends],
            "events": events,
            "busy_s": self.busy_s,
            "wait_s": self.wait_s,
            "calls": self.calls,
            "render_s": self.venv.render_s,
            "render_reads": self.venv.render_reads,
        }
        self.busy_s, self.wait_s, self.calls = 0.0, 0.0, 0
        self.venv.render_s, self.venv.render_reads = 0.0, 0
        return out

    # -- time-sharing ----------------------------------------------------------------------------
    def onload(self) -> None:
        self.venv.onload()

    def offload(self) -> None:
        self.venv.offload()

    def close(self) -> None:
        self.venv.close()


class PolicyCallError(RuntimeError):
    """A policy call an env worker made itself (direct hand-offs) failed or found the policy
    worker gone; the message names the call, the step and the rows."""


def _policy_result(ref: Any, call: str, t: int, lo: int, hi: int) -> Any:
    import ray
    from ray import exceptions as rex

    try:
        return ray.get(ref)
    except (rex.RayTaskError, rex.RayActorError) as e:
        gone = isinstance(e, rex.RayActorError)
        what = "the policy worker died" if gone else "the policy worker raised"
        cause = getattr(e, "cause", None) or e
        raise PolicyCallError(
            f"policy.{call} at step {t} for this worker's envs [{lo}, {hi}): {what}: "
            f"{type(cause).__name__}: {cause}"
        ) from None


def _pipe_send(conn: Any, message: tuple, t: int, lo: int, hi: int) -> None:
    """Send ``message``; where the policy has closed its end, raise its reason (an error it sent
    before closing, still in this socket) as ``PolicyCallError``."""
    where = f"before step {t} for this worker's envs [{lo}, {hi})"
    try:
        conn.send(message)
    except TimeoutError:
        raise PolicyCallError(
            f"the policy worker took nothing from this worker for {conn.timeout:g} s {where} "
            "(cycle_timeout_s; a stuck policy)"
        ) from None
    except OSError:
        reason = conn.last_error()
        if reason is not None:
            raise PolicyCallError(f"the policy worker stopped {where}: {reason}") from None
        raise PolicyCallError(
            f"the policy worker closed its connection {where} (its process exited or died)"
        ) from None


def _pipe_actions(conn: Any, timeout: float, t: int, lo: int, hi: int) -> Any:
    from loomrl.transport._socket import PeerClosed

    where = f"at step {t} for this worker's envs [{lo}, {hi})"
    try:
        kind, payload = conn.recv(timeout)
    except TimeoutError:
        raise PolicyCallError(
            f"no actions from the policy worker within {timeout:g} s {where} "
            "(cycle_timeout_s; a stuck policy or another env worker stuck before it)"
        ) from None
    except PeerClosed:
        raise PolicyCallError(
            f"the policy worker closed its connection {where} (its process exited or died)"
        ) from None
    if kind == "error":
        raise PolicyCallError(f"the policy worker stopped {where}: {payload}")
    return payload


def worker_env_config(env: EnvConfig, workers: int) -> EnvConfig:
    """The per-worker EnvConfig when ``env.num_envs`` envs are spread over ``workers`` workers."""
    return replace(env, num_envs=env.num_envs // workers)
