"""Batched actor-critic policies for embodied RL (torch ``nn.Module``s).

The protocol every policy follows (built-in or user-written; nothing inherits from anything):

    act(obs[B, *obs_shape], generators=None) -> (action[B, *action_shape], logp[B], value[B])
    evaluate(obs[B, *obs_shape], action[B, *action_shape]) -> (logp[B], entropy[B], value[B])
    value(obs) -> value[B]                       (optional; act()'s value is used otherwise)

``generators``, when given, holds one random stream per row: row b's sample draws only from
row b's. The policy worker passes ``row_generators``' ``RowStreams``: a sequence of
``torch.Generator`` (one per row) for any policy, from which the built-ins instead draw every
row at once by a counter-based generator keyed by the row. With ``batch_invariant=True`` the
built-ins also run ``act``'s and ``value``'s forward in blocks of exactly ``row_block`` rows,
the last block padded with zero rows: BLAS and cuDNN pick different kernels for different
batch sizes, which changes the last bits, but one shape always runs the same kernels. Whether
those kernels give a row the same bits at every position of a block depends on the machine
(on one x86 CPU 8 rows pass and 5 fail, on another the MLP fails at 8), so each net checks it
at first use, per device, shape and thread count, and runs row by row where it fails.
Together these make a row's action a function of that row's observation and stream only, so
splitting the envs into groups (pipelined collection) cannot change a trajectory. The policy
worker re-seeds the same generator objects for every call (``row_generators(..., reuse=)``):
a policy must not keep them past its ``act``. ``row_block=1`` is the forward row by row; a
larger block costs the padding's arithmetic but launches a block's kernels once
rather than once per row. ``evaluate`` (training) always runs batched.

Weights are initialised from ``seed`` alone (orthogonal, a local generator): the same seed
gives the same policy regardless of the global torch RNG.

On a GPU, a blocked forward is still tens of tiny kernels per call (hundreds row by row), so
its cost is the host launching them, and it moves with the speed of whichever host core runs
the process. ``use_cuda_graphs()`` records act's forward once per batch shape as a CUDA graph
and replays it: one launch per call, the same kernels on the same rows, so the same bits.
"""

from __future__ import annotations

import math
import operator
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor, nn
from torch.distributions import Categorical, Normal

__all__ = [
    "ActorCritic",
    "CNNActorCritic",
    "MLPActorCritic",
    "RowStreams",
    "make_policy",
    "row_generators",
    "row_seeds",
]


@runtime_checkable
class ActorCritic(Protocol):
    def act(self, obs: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...

    def evaluate(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...


_MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser over uint64 arrays (wrapping arithmetic): a bijection whose
    outputs for nearby inputs look unrelated."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_MIX[1])
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_MIX[2])
    return x ^ (x >> np.uint64(31))


def row_seeds(seed: int, env_ids: Sequence[int], steps: Sequence[int]) -> np.ndarray:
    """The seed of each row's sampling stream [B] (uint64, below 2**63), from (seed, global env
    id, that env's step count) by chained SplitMix64 rounds, for all rows at once."""
    ids = np.asarray(env_ids, dtype=np.uint64)
    st = np.asarray(steps, dtype=np.uint64)
    if ids.shape != st.shape:
        raise ValueError(f"row_seeds: {ids.shape[0]} env ids for {st.shape[0]} step counts")
    golden = np.uint64(_MIX[0])
    with np.errstate(over="ignore"):
        x = _splitmix(np.full(ids.shape, seed & 0xFFFF_FFFF_FFFF_FFFF, np.uint64) + golden)
        x = _splitmix(x ^ (ids + golden))
        x = _splitmix(x ^ (st + golden))
    return x & np.uint64(0x7FFF_FFFF_FFFF_FFFF)


class RowStreams(Sequence):
    """The random streams of a batch's rows, one per row, keyed by each row's seed (``seeds``,
    from ``row_seeds``). Two views of the same keys:

    * vectorised draws for all rows at once, ``normal(*shape)`` and ``uniform(*shape)``: a
      counter-based generator (SplitMix64 outputs of the row's seed, Box-Muller for normals),
      numpy arithmetic on every row together. A draw is a pure function of the row's seed and
      the shape asked: it starts the row's stream from its beginning at every call. The
      built-in policies draw a row's noise (continuous actions) or its uniform (discrete) this
      way. Drawn one ``torch.Generator`` per row, the noise of 256 rows took 0.8 ms of host
      time on this project's 2-core CPU, 0.3-0.5 ms of a 1.4-1.9 ms policy call on a GPU host;
      vectorised it is tens of microseconds.
    * a sequence of ``torch.Generator``, one per row seeded with its seed, made on first use
      (``len``, indexing, iteration; a slice shares the generators already made): what a user
      policy with an ``act(obs, generators=...)`` draws from as before.

    A row's draws do not depend on which rows came with it nor on its place among them, so a
    row's action stays a function of its observation and its key alone."""

    __slots__ = ("seeds", "_pool", "_gens")

    def __init__(
        self,
        seeds: np.ndarray,
        reuse: list[torch.Generator] | None = None,
        _gens: list[torch.Generator] | None = None,
    ):
        self.seeds = np.asarray(seeds, dtype=np.uint64).reshape(-1)
        self._pool = reuse
        self._gens = _gens

    def __len__(self) -> int:
        return len(self.seeds)

    def _generators(self) -> list[torch.Generator]:
        if self._gens is None:
            pool = self._pool if self._pool is not None else []
            seeds = self.seeds.tolist()
            while len(pool) < len(seeds):
                pool.append(torch.Generator())
            self._gens = [g.manual_seed(s) for g, s in zip(pool, seeds, strict=False)]
        return self._gens

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return RowStreams(self.seeds[i], None, None if self._gens is None else self._gens[i])
        return self._generators()[i]

    def __iter__(self) -> Any:
        return iter(self._generators())

    def _bits(self, n: int) -> np.ndarray:
        """The first ``n`` outputs of each row's SplitMix64 sequence [B, n] (uint64)."""
        counters = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(_MIX[0])
        with np.errstate(over="ignore"):
            return _splitmix(self.seeds[:, None] + counters[None, :])

    def uniform(self, *shape: int) -> np.ndarray:
        """Uniform draws in [0, 1) per row [B, *shape] (float64, 53 random bits each)."""
        n = math.prod(shape)
        u = (self._bits(n) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        return u.reshape(len(self.seeds), *shape)

    def normal(self, *shape: int) -> np.ndarray:
        """Standard-normal draws per row [B, *shape] (float32), by Box-Muller in float64."""
        n = math.prod(shape)
        half = (n + 1) // 2
        u = self.uniform(2 * half)
        radius = np.sqrt(-2.0 * np.log(1.0 - u[:, :half]))  # 1 - u lies in (0, 1]
        angle = (2.0 * math.pi) * u[:, half:]
        z = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)], axis=1)[:, :n]
        return z.astype(np.float32).reshape(len(self.seeds), *shape)


def row_generators(
    seed: int,
    env_ids: Sequence[int],
    steps: Sequence[int],
    reuse: list[torch.Generator] | None = None,
) -> RowStreams:
    """Each row's random stream, keyed by (seed, global env id, that env's step count): a
    ``RowStreams``, which the built-in policies draw from for all rows at once and which reads
    as one ``torch.Generator`` per row for any other policy.

    Stateless: whoever holds (seed, env id, step) can rebuild the stream, so it survives
    offload and moving envs between workers. ``reuse``: generators to re-seed (grown as needed)
    instead of making new ones when the rows' generators are asked for; the returned streams
    then share them, so use them before the next call re-seeds them.
    """
    return RowStreams(row_seeds(seed, env_ids, steps), reuse)


MAX_ROW_BLOCK = 1024


def _row_block(value: Any, owner: str) -> int:
    try:
        n = operator.index(value) if not isinstance(value, bool) else 0
    except TypeError:
        n = 0
    if not 1 <= n <= MAX_ROW_BLOCK:
        raise ValueError(
            f"{owner}: row_block must be a positive number of rows up to {MAX_ROW_BLOCK}, got "
            f"{value!r}; 8 launches few kernels and pads little, 1 is the forward row by row"
        )
    return int(n)


def _init_layer(layer: nn.Module, gain: float, gen: torch.Generator) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain, generator=gen)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(sizes: Sequence[int], out_gain: float, gen: torch.Generator) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        last = i == len(sizes) - 2
        layers.append(
            _init_layer(nn.Linear(sizes[i], sizes[i + 1]), out_gain if last else math.sqrt(2), gen)
        )
        if not last:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


class _Heads(nn.Module):
    """Turns features into a distribution for a Box (Gaussian, state-independent log-std) or a
    Discrete (Categorical) action space."""

    def __init__(self, action_space: Any, log_std_init: float):
        super().__init__()
        import gymnasium as gym

        if isinstance(action_space, gym.spaces.Box):
            self.discrete = False
            self.action_shape = tuple(action_space.shape)
            self.action_dim = int(np.prod(action_space.shape))
            self.log_std = nn.Parameter(torch.full((self.action_dim,), float(log_std_init)))
        elif isinstance(action_space, gym.spaces.Discrete):
            self.discrete = True
            self.action_shape = ()
            self.action_dim = int(action_space.n)
            self.start = int(action_space.start)
        else:
            raise TypeError(
                f"built-in policies handle Box and Discrete action spaces, not {action_space}; "
                "write an nn.Module with act()/evaluate() for other spaces"
            )

    def dist(self, out: Tensor, validate: bool | None = None) -> Normal | Categorical:
        """``validate=False`` skips torch.distributions' argument checks: on a GPU each check
        waits for the device to copy a flag back, a pause in the middle of every act."""
        if self.discrete:
            return Categorical(logits=out, validate_args=validate)
        return Normal(out, self.log_std.exp().expand_as(out), validate_args=validate)

    def noise(self, generators: Sequence[torch.Generator], device: Any) -> Tensor:
        """The standard-normal noise of each row from its generator [B, action_dim], drawn on
        the host and copied to ``device``. Drawn before the forward is queued, the copy waits
        for nothing; drawn after it, the copy waits until the forward has finished.
        ``RowStreams`` (what ``row_generators`` gives) draw every row at once; other
        generators one row at a time."""
        if isinstance(generators, RowStreams):
            return torch.from_numpy(generators.normal(self.action_dim)).to(device)
        return torch.stack([torch.randn(self.action_dim, generator=g) for g in generators]).to(
            device
        )

    def sample(
        self,
        out: Tensor,
        generators: Sequence[torch.Generator] | None,
        deterministic: bool,
        eps: Tensor | None = None,
    ) -> Tensor:
        """An action per row of ``out``; ``eps``: the rows' noise (``noise(generators)``)
        when already drawn (continuous actions)."""
        if self.discrete:
            if deterministic:
                a = out.argmax(-1)
            elif generators is None:
                a = Categorical(logits=out).sample()
            elif isinstance(generators, RowStreams):
                # Inverse CDF of each row's uniform: the first action whose cumulative
                # probability exceeds it (in float64, where a rounded-up total cannot put a
                # uniform just below 1 past the last action's sum unseen: the clamp covers it).
                u = torch.from_numpy(generators.uniform(1)).to(out.device)
                below = (torch.softmax(out.double(), -1).cumsum(-1) <= u).sum(-1)
                a = below.clamp(max=out.shape[-1] - 1)
            else:
                probs = torch.softmax(out, -1)
                a = torch.stack(
                    [
                        torch.multinomial(probs[b], 1, generator=g)[0]
                        for b, g in enumerate(generators)
                    ]
                )
            return a
        if deterministic:
            return out
        if eps is None:
            eps = (
                torch.randn_like(out) if generators is None else self.noise(generators, out.device)
            )
        return out + self.log_std.exp() * eps.to(out)

    def log_prob(
        self, out: Tensor, action: Tensor, validate: bool | None = None
    ) -> tuple[Tensor, Tensor]:
        d = self.dist(out, validate)
        if self.discrete:
            return d.log_prob(action.long() - self.start), d.entropy()
        return d.log_prob(action.reshape(out.shape)).sum(-1), d.entropy().sum(-1)

    def to_env(self, a: Tensor) -> Tensor:
        return a + self.start if self.discrete else a.reshape(a.shape[0], *self.action_shape)


# The most graphs one policy keeps however many batch shapes its callers announce: each holds
# its inputs and a private pool for the forward's intermediates (blocks of row_block rows).
MAX_GRAPH_SHAPES = 256


class _GraphCache:
    """CUDA graphs of one forward function, one per input (shape, strides, dtype, device), least
    recently used dropped beyond ``max_shapes``.

    A graph reads the parameters at the addresses they had when it was recorded: in-place
    updates (optimizer steps, ``load_state_dict``) are seen, but a module moved off the device
    and back has new storage, so every graph is dropped when any parameter's address changes.
    Backend switches flipped after recording (TF32, cuDNN algorithm choice) are not seen.
    Copies and pickles of the module start with an empty cache: graphs belong to the tensors
    they were recorded on.
    """

    def __init__(self, max_shapes: int = 8):
        if max_shapes < 1:
            raise ValueError(f"max_shapes must be >= 1, got {max_shapes}")
        self.max_shapes = max_shapes
        self.entries: OrderedDict[tuple, tuple[Tensor, Any, tuple[Tensor, ...]]] = OrderedDict()
        self.params_key: tuple[int, ...] | None = None
        self.captures = 0
        self.failed: str | None = None

    def __reduce__(self) -> tuple:  # copy.deepcopy and pickle both rebuild it empty
        return (_GraphCache, (self.max_shapes,))

    def clear(self) -> None:
        self.entries.clear()
        self.params_key = None

    def reserve(self, n: int) -> None:
        """Keep at least ``n`` graphs (at most ``MAX_GRAPH_SHAPES``); never lowers the limit,
        which ``clear`` keeps too (the caller that reserved it may still call)."""
        self.max_shapes = max(self.max_shapes, min(n, MAX_GRAPH_SHAPES))

    def run(
        self,
        module: nn.Module,
        fn: Callable[..., tuple[Tensor, ...]],
        *xs: Tensor,
        device: Any = None,
        copy_out: bool = True,
    ) -> tuple[Tensor, ...] | None:
        """``fn(*xs)`` by replaying its graph (recorded on first sight of the inputs' layout);
        None once recording has failed, after which the caller runs eagerly. Errors of ``fn``
        itself (a wrong input, out of memory) surface from the warm-up as they would eagerly.

        ``device``: where the graph runs when ``xs`` are host tensors (copied in without a wait
        when pinned). ``copy_out=False`` returns the graph's own output tensors, which the next
        replay overwrites: the caller copies them out first."""
        if self.failed is not None:
            return None
        pkey = tuple(t.data_ptr() for t in (*module.parameters(), *module.buffers()))
        if pkey != self.params_key:
            self.entries.clear()
            self.params_key = pkey
        key = (
            getattr(fn, "__name__", id(fn)),
            str(device),
            *((tuple(x.shape), x.stride(), x.dtype, x.device) for x in xs),
        )
        entry = self.entries.get(key)
        if entry is None:
            statics = _warm_up(fn, xs, device)
            try:
                entry = _capture(fn, statics)
            except RuntimeError as e:  # an op that cannot be captured: say so once, run eagerly
                self.failed = f"{type(e).__name__}: {e}"
                self.clear()
                warnings.warn(
                    f"CUDA graphs disabled for this policy: recording its forward failed "
                    f"({self.failed}); it runs eagerly",
                    stacklevel=3,
                )
                return None
            self.captures += 1
            if len(self.entries) >= self.max_shapes:
                self.entries.popitem(last=False)
            self.entries[key] = entry
        else:
            self.entries.move_to_end(key)
        statics, graph, outs = entry
        for s, x in zip(statics, xs, strict=True):
            s.copy_(x, non_blocking=True)
        graph.replay()
        # The outputs live in the graph's memory and the next replay overwrites them.
        return tuple(o.clone() for o in outs) if copy_out else outs


def _warm_up(
    fn: Callable[..., tuple[Tensor, ...]], xs: Sequence[Tensor], device: Any = None
) -> tuple[Tensor, ...]:
    """Run ``fn`` twice on copies of ``xs`` (on ``device`` when given) off the main stream, as
    capture requires: cuDNN and cuBLAS create their handles and workspaces here rather than
    inside the recording. Returns the copies, the inputs the graph will read."""
    statics = tuple(
        x.clone() if device is None else torch.empty_like(x, device=device).copy_(x) for x in xs
    )
    where = statics[0].device
    main = torch.cuda.current_stream(where)
    side = torch.cuda.Stream(where)
    side.wait_stream(main)
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            fn(*statics)
    main.wait_stream(side)
    return statics


def _capture(fn: Callable[..., tuple[Tensor, ...]], statics: tuple[Tensor, ...]) -> tuple:
    graph = torch.cuda.CUDAGraph()
    # thread_local: CUDA calls of other threads in the process (a runtime's) do not void it.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"), torch.no_grad():
        outs = fn(*statics)
    return statics, graph, tuple(outs)


class _ActorCriticBase(nn.Module):
    """Shared act/evaluate over ``_features -> (actor_out, value)``."""

    heads: _Heads
    batch_invariant: bool
    _row_block: int = 1
    _blocks_checked: dict[tuple, bool]
    _graphs: _GraphCache | None = None

    def use_cuda_graphs(self, on: bool = True, max_shapes: int = 8) -> None:
        """Replay act's forward on a CUDA device as CUDA graphs, one per batch shape (at most
        ``max_shapes`` kept). No effect on CPU tensors, on ``value`` (bootstrap values of
        truncated and last observations, rare and of any row count, run eagerly: the same
        kernels) or on training's ``evaluate``."""
        self._graphs = _GraphCache(max_shapes) if on else None

    def reserve_graph_shapes(self, n: int) -> None:
        """Keep graphs of at least ``n`` batch shapes (at most ``MAX_GRAPH_SHAPES``): a caller
        whose calls take n row counts then replays each without recording it again. Graphs
        beyond the limit drop the least recently used, and a cycle that cycles through more
        shapes than the limit records one on nearly every call."""
        if self._graphs is not None:
            self._graphs.reserve(n)

    def release_graphs(self) -> None:
        """Drop the recorded graphs and the device memory they hold (e.g. before offload)."""
        if self._graphs is not None:
            self._graphs.clear()

    def record_act_graphs(self, sizes: Iterable[int], like: Tensor) -> int:
        """Record ``act_host``'s graphs now for calls of each row count in ``sizes`` on host
        observations shaped and typed like ``like`` (its rows aside), rather than at each count's
        first call. A cycle that acts on whichever parts have replied meets some sums of parts
        only now and then: each first meeting cost two eager forwards and a recording inside a
        timed iteration (on one H100 at 256 envs, k = 4, 7 graphs in a run's first five
        iterations, which ran up to twice its trial's time; scripts/gpu/RESULTS.md, call EG).
        Throw-away inputs and generators: no caller's generator moves. Counts that round to one
        graph record it once. Returns the graphs recorded (0 without CUDA graphs, on a CPU, or
        once recording has failed)."""
        dev = self._device()
        if self._graphs is None or self._graphs.failed is not None or dev.type != "cuda":
            return 0
        before = self._graphs.captures
        probe = torch.empty((0, *like.shape[1:]), dtype=like.dtype, device=dev)
        done: set[int] = set()
        for n in sorted(sizes):
            rows = self._graph_rows(n, probe)
            if n < 1 or rows in done:
                continue
            done.add(rows)
            gens = RowStreams(np.zeros(n, np.uint64))
            self.act_host(torch.zeros((n, *like.shape[1:]), dtype=like.dtype), gens)
        return self._graphs.captures - before

    @property
    def graph_captures(self) -> int:
        """How many forwards were recorded as graphs so far (0 without CUDA graphs)."""
        return 0 if self._graphs is None else self._graphs.captures

    @property
    def row_block(self) -> int:
        """Rows per block of act's and value's forward (batch_invariant)."""
        return self._row_block

    @row_block.setter
    def row_block(self, value: int) -> None:
        self._row_block = _row_block(value, type(self).__name__)
        self.release_graphs()  # recorded with the old blocks

    def __getstate__(self) -> dict[str, Any]:
        # Copies and pickles check their blocks again: they may run on other kernels.
        return {**self.__dict__, "_blocks_checked": {}, "_host_bufs": {}}

    def _forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _block_ok(self, like: Tensor) -> bool:
        """Whether this device's kernels give a row of a ``row_block``-row block the same bits
        at each position tried among other neighbours, on random rows shaped like ``like``:
        what blocking rests on. Tried: every position of blocks up to 16 rows, else 16 spread
        over the block, the last included (tails of a kernel's tiles sit at the end). Checked
        once per block size, device, observation shape and dtype, and CPU thread count (how a
        CPU kernel splits rows between threads can move a row into a tail); where it fails,
        act and value run row by row, with a warning."""
        threads = torch.get_num_threads() if like.device.type == "cpu" else 0
        key = (self.row_block, str(like.device), tuple(like.shape[1:]), like.dtype, threads)
        ok = self._blocks_checked.get(key)
        if ok is not None:
            return ok
        gen = torch.Generator().manual_seed(0)

        def rows(n: int) -> Tensor:
            shape = (n, *like.shape[1:])
            if like.dtype == torch.uint8:
                x = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
            else:
                x = torch.randn(shape, generator=gen).to(like.dtype)
            return x.to(like.device)

        block = self.row_block
        first = rows(block)
        want = [t[0] for t in self._forward(first)]
        ok = True
        tried = sorted(
            {round(i * (block - 1) / 15) for i in range(16)} if block > 16 else range(block)
        )
        for at in tried:  # row 0 of `first` at each position, new neighbours each time
            x = rows(block)
            x[at] = first[0]
            got = [t[at] for t in self._forward(x)]
            ok = ok and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
        self._blocks_checked[key] = ok
        if not ok:
            warnings.warn(
                f"{type(self).__name__}: on {like.device} ({threads or 'any'} threads, rows of "
                f"{tuple(like.shape[1:])} {like.dtype}) a row's result depends on its position "
                f"in a block of row_block={block} rows, so act and value run row by row: more "
                "kernel launches, and other last bits than blocks would give; another "
                "policy_kwargs.row_block may pass",
                stacklevel=2,
            )
        return ok

    def _rows(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """act's and value's forward: batched, or (batch_invariant) in blocks of ``row_block``
        rows, the last one padded with zero rows that are dropped afterwards."""
        n, block = obs.shape[0], self.row_block
        if not self.batch_invariant or n == 0:
            return self._forward(obs)
        if block > 1 and not self._block_ok(obs):
            block = 1
        if n == block:
            return self._forward(obs.contiguous())
        pad = -n % block
        padded = obs.new_zeros((n + pad, *obs.shape[1:]))  # fresh and contiguous, as checked
        padded[:n] = obs
        outs = [self._forward(padded[b : b + block]) for b in range(0, n + pad, block)]
        return torch.cat([o[0] for o in outs])[:n], torch.cat([o[1] for o in outs])[:n]

    @torch.no_grad()
    def act(
        self,
        obs: Tensor,
        generators: Sequence[torch.Generator] | None = None,
        deterministic: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """obs [B, *obs_shape] -> (action [B, *action_shape], logp [B], value [B])."""
        if generators is not None and len(generators) != obs.shape[0]:
            raise ValueError(
                f"act: got {len(generators)} generators for {obs.shape[0]} observations; pass one per row"
            )
        eps = None
        if generators is not None and not deterministic and not self.heads.discrete:
            eps = self.heads.noise(generators, obs.device)
        graphed = None
        if self._graphs is not None and obs.is_cuda:
            graphed = self._graph_run(self._rows, obs)
        out, value = graphed if graphed is not None else self._rows(obs)
        a = self.heads.sample(out, generators, deterministic, eps)
        # Unchecked: every check would stall a GPU call (non-finite actions are refused by
        # the env, which names them). Training's evaluate() keeps torch's default checks
        # unless its caller passes validate=False (a step recorded as a CUDA graph, whose
        # non-finite weights then surface here, at the env, in the next rollout).
        logp, _ = self.heads.log_prob(out, self.heads.to_env(a), validate=False)
        return self.heads.to_env(a), logp, value

    # How act_host moves its graph's inputs and output: "pageable" (plain copies; the output's
    # waits) or "pinned" (page-locked buffers, copies without waits, one wait at the end). On
    # one H200 beside 4 EGL renderers a 32-row call took 1.20 ms pageable, 7.98 pinned (alone
    # 1.04 and 0.99; scripts/gpu/policy_call.py, RESULTS.md call BR).
    host_io: str = "pageable"

    def act_host(
        self, obs: Tensor, generators: Sequence[torch.Generator] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``act`` on host observations with the results on the host: (action, logp, value),
        the last two float32; the same bits as ``act`` on the policy's device.

        On a CUDA device with ``use_cuda_graphs()``, continuous actions and per-row generators,
        one recorded graph covers the forward, the sampling and the log-probability: one copy
        each way and one wait per call (``host_io`` says how the copies go). Eager act and a
        copy per result wait for the device once per result, and beside other work on the GPU
        (renderers of a split cycle) every wait is a chance to queue behind it."""
        dev = self._device()
        fused = (
            self._graphs is not None
            and self._graphs.failed is None
            and dev.type == "cuda"
            and generators is not None
            and not self.heads.discrete
        )
        if fused:
            if len(generators) != obs.shape[0]:
                raise ValueError(
                    f"act: got {len(generators)} generators for {obs.shape[0]} observations; "
                    "pass one per row"
                )
            eps = self.heads.noise(generators, "cpu")
            pinned = self.host_io == "pinned"
            n = obs.shape[0]
            obs_p, eps_p = self._pad_rows((obs, eps), dev)  # rows rounded to whole blocks
            staged = (
                (self._pinned("obs", obs_p), self._pinned("eps", eps_p))
                if pinned
                else (obs_p, eps_p)
            )
            outs = self._graphs.run(self, self._act_packed, *staged, device=dev, copy_out=False)
            if outs is not None:
                outs = (outs[0][:n],)
                if pinned:
                    packed = self._pinned("out", outs[0], non_blocking=True)
                    torch.cuda.current_stream(dev).synchronize()
                else:
                    packed = outs[0].cpu()
                n, k = obs.shape[0], self.heads.action_dim
                a = packed[:, :k].reshape(n, *self.heads.action_shape).clone()
                return a, packed[:, k].clone(), packed[:, k + 1].clone()
        a, logp, value = self.act(obs.to(dev), generators)
        return a.cpu(), logp.float().cpu(), value.float().cpu()

    def _graph_rows(self, n: int, like: Tensor) -> int:
        """The rows a graphed call of ``n`` rows shaped like ``like`` (on the device it runs on)
        is recorded and replayed with: ``n`` rounded up to a whole block of ``row_block`` rows
        where the forward runs in blocks (``_rows`` pads to blocks anyway, and the block check
        gives a row the same bits at any place in any block), else ``n``. A cycle that acts on
        whichever parts have replied calls with any sum of its parts' rows; rounded, at most
        num_envs / row_block shapes are recorded (16 at 128 envs) instead of every sum (44 for
        k = 3 on 4 env workers at 128 envs)."""
        block = self.row_block
        if not self.batch_invariant or block <= 1 or n == 0 or n % block == 0:
            return n
        return n if not self._block_ok(like) else n + (-n % block)

    def _pad_rows(self, xs: tuple[Tensor, ...], device: Any = None) -> tuple[Tensor, ...]:
        """``xs`` (the same rows each) with zero rows appended up to ``_graph_rows`` rows, for a
        graph on ``device`` (default: where ``xs`` are)."""
        n = xs[0].shape[0]
        dev = xs[0].device if device is None else torch.device(device)
        like = torch.empty((0, *xs[0].shape[1:]), dtype=xs[0].dtype, device=dev)
        m = self._graph_rows(n, like)
        if m == n:
            return xs
        return tuple(torch.cat([x, x.new_zeros((m - n, *x.shape[1:]))]) for x in xs)

    def _graph_run(
        self, fn: Callable[..., tuple[Tensor, ...]], *xs: Tensor, device: Any = None
    ) -> tuple[Tensor, ...] | None:
        """``fn(*xs)`` replayed from the graph cache on ``xs`` padded by ``_pad_rows``, each
        output cut back to the call's rows; None when recording has failed."""
        assert self._graphs is not None
        n = xs[0].shape[0]
        outs = self._graphs.run(self, fn, *self._pad_rows(xs, device), device=device)
        return None if outs is None else tuple(o[:n] for o in outs)

    def _act_packed(self, obs: Tensor, eps: Tensor) -> tuple[Tensor]:
        """act's arithmetic (continuous actions, the rows' noise given) with the results in one
        float32 tensor [B, action_dim + 2]: action, logp, value. Same ops as ``act``, so the
        same kernels and bits."""
        out, value = self._rows(obs)
        a = out + self.heads.log_std.exp() * eps.to(out)
        logp, _ = self.heads.log_prob(out, self.heads.to_env(a), validate=False)
        n = out.shape[0]
        return (torch.cat([a.reshape(n, -1), logp.float()[:, None], value.float()[:, None]], 1),)

    def _pinned(self, name: str, x: Tensor, non_blocking: bool = False) -> Tensor:
        """``x`` copied into this net's page-locked host buffer ``name`` (kept per shape and
        dtype; reused, so valid until the next call): device copies from and to it need no
        wait of the host."""
        bufs: dict[tuple, Tensor] = self.__dict__.setdefault("_host_bufs", {})
        key = (name, tuple(x.shape), x.dtype)
        buf = bufs.get(key)
        if buf is None:
            # three buffers a graphed shape; beyond: start over rather than grow without end
            if len(bufs) >= 3 * (8 if self._graphs is None else self._graphs.max_shapes):
                bufs.clear()
            buf = bufs[key] = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        return buf.copy_(x, non_blocking=non_blocking)

    def _device(self) -> torch.device:
        return next(self.parameters()).device

    def evaluate(
        self, obs: Tensor, action: Tensor, validate: bool | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """obs [B, *obs_shape], action [B, *action_shape] -> (logp [B], entropy [B], value [B]).
        ``validate=False`` skips torch.distributions' checks of the action (each reads the
        device, which a CUDA graph cannot record)."""
        out, value = self._forward(obs)
        logp, ent = self.heads.log_prob(out, action, validate)
        return logp, ent, value

    @torch.no_grad()
    def value(self, obs: Tensor) -> Tensor:
        """obs [B, *obs_shape] -> value [B] (in blocks of row_block rows when batch_invariant)."""
        return self._rows(obs)[1]


class MLPActorCritic(_ActorCriticBase):
    """Separate tanh MLPs for actor and critic over flat float observations [B, obs_dim]."""

    def __init__(
        self,
        obs_dim: int,
        action_space: Any,
        hidden: Sequence[int] = (64, 64),
        seed: int = 0,
        log_std_init: float = 0.0,
        batch_invariant: bool = True,
        row_block: int = 8,
    ):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.heads = _Heads(action_space, log_std_init)
        self.batch_invariant = batch_invariant
        self._blocks_checked = {}
        self.row_block = row_block
        self.actor = _mlp([obs_dim, *hidden, self.heads.action_dim], 0.01, gen)
        self.critic = _mlp([obs_dim, *hidden, 1], 1.0, gen)

    def _forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        obs = obs.float()
        return self.actor(obs), self.critic(obs).squeeze(-1)


class CNNActorCritic(_ActorCriticBase):
    """A small conv torso over uint8 images [B, C, H, W] shared by actor and critic heads."""

    def __init__(
        self,
        obs_shape: Sequence[int],
        action_space: Any,
        seed: int = 0,
        channels: Sequence[int] = (32, 64, 64),
        feature_dim: int = 256,
        log_std_init: float = 0.0,
        batch_invariant: bool = True,
        row_block: int = 8,
    ):
        super().__init__()
        if len(obs_shape) != 3:
            raise ValueError(f"CNNActorCritic: obs_shape must be (C, H, W), got {tuple(obs_shape)}")
        c, h, w = obs_shape
        if min(h, w) < 16:
            raise ValueError(
                f"CNNActorCritic: images must be at least 16x16, got {h}x{w}; raise EnvConfig.image_size"
            )
        gen = torch.Generator().manual_seed(seed)
        self.heads = _Heads(action_space, log_std_init)
        self.batch_invariant = batch_invariant
        self._blocks_checked = {}
        self.row_block = row_block
        k = [(8, 4), (4, 2), (3, 1)] if min(h, w) >= 36 else [(4, 2), (3, 2), (3, 1)]
        layers: list[nn.Module] = []
        prev = c
        for ch, (ks, st) in zip(channels, k, strict=True):
            layers += [_init_layer(nn.Conv2d(prev, ch, ks, st), math.sqrt(2), gen), nn.ReLU()]
            prev = ch
        self.torso = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            flat = self.torso(torch.zeros(1, c, h, w)).shape[1]
        self.fc = nn.Sequential(
            _init_layer(nn.Linear(flat, feature_dim), math.sqrt(2), gen), nn.ReLU()
        )
        self.actor = _init_layer(nn.Linear(feature_dim, self.heads.action_dim), 0.01, gen)
        self.critic = _init_layer(nn.Linear(feature_dim, 1), 1.0, gen)

    def _forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        z = self.fc(self.torso(obs.float() / 255.0))
        return self.actor(z), self.critic(z).squeeze(-1)


def make_policy(
    observation_space: Any, action_space: Any, seed: int = 0, **kwargs: Any
) -> nn.Module:
    """MLP for flat observations, CNN for uint8 images [C, H, W]."""
    shape = tuple(observation_space.shape)
    if len(shape) == 3 and observation_space.dtype == np.uint8:
        return CNNActorCritic(shape, action_space, seed=seed, **kwargs)
    if len(shape) == 1:
        return MLPActorCritic(shape[0], action_space, seed=seed, **kwargs)
    raise ValueError(
        f"make_policy: no built-in policy for observations of shape {shape} ({observation_space.dtype}); "
        "flat vectors get an MLP and uint8 [C, H, W] images a CNN. Pass your own nn.Module with act()/evaluate()."
    )
