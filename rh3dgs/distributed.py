"""torch.distributed in rh3dgs: the process group, every collective, and the watch over the ranks.

Past one process the lift and the distillation are data-parallel over K processes (ranks), one per GPU
(``nccl``) or per group of CPU cores (``gloo``), on one machine or on M of them::

    torchrun --nproc_per_node=K -m rh3dgs.cli lift SCENE.ply --data DIR --output OUT
    torchrun --nnodes=M --node_rank=I --nproc_per_node=K --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT \\
        -m rh3dgs.cli distill SCENE.ply --data DIR --output OUT

torchrun sets ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` in each worker;
:func:`process_group_from_env` reads them (``WORLD_SIZE`` unset or 1: a plain single-process run) and
initialises the default group: ``nccl`` with each rank on GPU ``LOCAL_RANK`` when CUDA is available, ``gloo``
on CPU. In Python, :func:`current` is the group the caller initialised (``lift()`` and ``distill()`` shard
themselves inside one).

**Collectives** live here and nowhere else (the lift, the distillation and the feature cache call them):

* :func:`all_reduce` (sums), :func:`broadcast`, :func:`all_gather_rows` (blocks of rows, padded to the
  largest), :func:`all_gather_object`, :func:`barrier`;
* :class:`RowExchange`: rows of per-Gaussian tensors between the ranks that *hold* them (a rank's views
  see some Gaussians) and the ranks that *own* them (the scene split into contiguous blocks of rows):
  :meth:`RowExchange.to_owners` is a sparse reduce-scatter (the held rows summed into the owners' blocks),
  :meth:`RowExchange.from_owners` its reverse. Each is K - 1 rounds of ``all_to_all_single`` in which a
  rank sends to one rank and receives from one, so that it never holds more than its block plus one
  sender's rows (gloo has ``reduce_scatter`` only for dense, equal blocks; this one moves only the rows a
  rank holds, in any split). Bytes per call: the rows sent, ``rows x channels x 4`` per rank.

:data:`TRAFFIC` counts the bytes each collective of this process sent (the benchmark reads it).

**Faults.** A worker that dies (killed, out of memory, a crash) must not leave the others waiting in a
collective for the group's timeout (30 min). Each rank of a group this module initialised beats a
heartbeat in the job's rendezvous store every second and watches the others' (:class:`_Watch`):

* a rank on the same machine whose process is gone is seen within a second;
* a rank anywhere whose heartbeat stops for ``RH3DGS_DIST_TIMEOUT`` seconds (default 60) is declared lost;
* a collective that fails (gloo: the peer's connection closed) names the lost rank;
* torchrun's agent stops the other workers of its machine with SIGTERM when one fails: they say which.

Each survivor then prints ONE line ``rh3dgs: error: rank R (pid P on HOST) stopped ...; rank S stops too``
and exits with status 1; torchrun then reports the failed workers. A rerun of the same command resumes
from the last completed pass (the lift) or checkpoint (the distillation).
"""
from __future__ import annotations

import contextlib
import datetime
import gc
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor


__all__ = ["DistInfo", "RowExchange", "TRAFFIC", "all_gather_object", "all_gather_rows",
           "all_reduce", "barrier", "block_bounds", "broadcast", "current", "env_world_size",
           "process_group_from_env", "shard"]

DEFAULT_HEARTBEAT_TIMEOUT_S = 60.0
"""Seconds without a heartbeat after which a rank is declared lost (``RH3DGS_DIST_TIMEOUT`` overrides)."""
FAILED_GRACE_S = 5.0
"""Seconds a rank that stopped on an error has to print it and leave before the others name it."""

TRAFFIC: Dict[str, List[int]] = {}
"""Bytes sent by this process, per call of each collective (name -> list of bytes)."""


@dataclass(frozen=True)
class DistInfo:
    """This worker's place in the process group."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_world_size() -> int:
    """``WORLD_SIZE`` from the environment (1 when unset)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def _dist():
    import torch.distributed as dist

    return dist


def current() -> Optional[DistInfo]:
    """The initialised default process group of more than one rank, else None (a single-process run)."""
    dist = _dist()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return None
    backend = dist.get_backend()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, backend=backend,
                    device=device)


def rank_world() -> Tuple[int, int]:
    """``(rank, world size)`` of the initialised default process group (a group of one rank included); RuntimeError
    when none is initialised."""
    dist = _dist()
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("no initialised torch.distributed process group (see rh3dgs.distributed."
                           "process_group_from_env)")
    return dist.get_rank(), dist.get_world_size()


def shard(n: int, world: int, rank: int) -> Tuple[int, int]:
    """``[start, end)`` of rank ``rank``'s contiguous share of ``n`` items (the first ``n % world`` shares one larger).

    >>> [shard(10, 3, r) for r in range(3)]
    [(0, 4), (4, 7), (7, 10)]
    """
    q, m = divmod(int(n), int(world))
    start = rank * q + min(rank, m)
    return start, start + q + (1 if rank < m else 0)


def block_bounds(n: int, world: int) -> List[int]:
    """The ``world + 1`` boundaries of :func:`shard`'s blocks: block j is ``[b[j], b[j + 1])``.

    >>> block_bounds(10, 3)
    [0, 4, 7, 10]
    """
    return [shard(n, world, r)[0] for r in range(world)] + [int(n)]


# ---------------------------------------------------------------------------------------------- collectives

_WATCH: Optional["_Watch"] = None


def _count(name: str, nbytes: int) -> None:
    TRAFFIC.setdefault(name, []).append(int(nbytes))


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _call(name: str, fn, nbytes: int):
    """Run a collective. When it fails because a rank is gone (gloo: its connection closed; a timeout), the watch
    names that rank in one line and ends this process (the other failures are raised as they are)."""
    _count(name, nbytes)
    try:
        return fn()
    except RuntimeError:  # DistBackendError and gloo's errors are RuntimeErrors
        lost = _WATCH.describe_lost(wait_s=_WATCH.timeout) if _WATCH is not None else None
        if lost:
            _WATCH.say(f"{lost}; rank {_dist().get_rank()} stops too (in a {name}). Rerun the same command to resume")
        raise


def _wire(t: Tensor) -> Tensor:
    """What a collective can carry: bools as uint8 (nccl has no bool sums)."""
    return t.to(torch.uint8) if t.dtype == torch.bool else t


def all_reduce(t: Tensor) -> Tensor:
    """Sum ``t`` over the ranks, in place (returned). Bytes: ``t``'s size (a ring sends about twice that)."""
    dist = _dist()
    _call("all_reduce", lambda: dist.all_reduce(t), _nbytes(t))
    return t


def all_reduce_max(value: int) -> int:
    """The largest ``value`` over the ranks."""
    dist = _dist()
    t = torch.tensor([int(value)], dtype=torch.int64, device=_device())
    _call("all_reduce", lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX), 8)
    return int(t.item())


def broadcast(t: Tensor, src: int = 0) -> Tensor:
    """``t`` of rank ``src`` on every rank (in place; the others' ``t`` must have its shape and dtype)."""
    dist = _dist()
    w = _wire(t)
    _call("broadcast", lambda: dist.broadcast(w, src), _nbytes(w) if dist.get_rank() == src else 0)
    if w is not t:
        t.copy_(w.to(t.dtype))
    return t


def barrier() -> None:
    dist = _dist()
    _call("barrier", lambda: dist.barrier(), 0)


def all_gather_object(obj: Any) -> List[Any]:
    """Every rank's ``obj`` (picklable, small), in rank order."""
    dist = _dist()
    out: List[Any] = [None] * dist.get_world_size()
    _call("all_gather_object", lambda: dist.all_gather_object(out, obj), 0)
    return out


def all_gather_rows(t: Tensor, counts: Sequence[int]) -> Tensor:
    """The ranks' blocks of rows ``t`` ([counts[rank], ...]) concatenated in rank order ([sum(counts), ...]).
    Blocks are padded to the largest one on the wire (gloo gathers equal sizes only)."""
    dist = _dist()
    w = _wire(t)
    most = max(int(c) for c in counts)
    pad = w.new_zeros((most, *w.shape[1:]))
    pad[: w.shape[0]] = w
    out = w.new_empty((len(counts) * most, *w.shape[1:]))
    _call("all_gather", lambda: dist.all_gather_into_tensor(out, pad), _nbytes(pad))
    rows = torch.cat([out[r * most: r * most + int(c)] for r, c in enumerate(counts)])
    return rows.to(t.dtype) if w is not t else rows


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if _dist().get_backend() == "nccl" else torch.device("cpu")


def _a2a(name: str, out: Tensor, inp: Tensor, dst: int, src: int, world: int) -> None:
    """One round of a pairwise exchange: all of ``inp`` to rank ``dst``, all of ``out`` from rank ``src``."""
    dist = _dist()
    outs, ins = [0] * world, [0] * world
    outs[src], ins[dst] = int(out.shape[0]), int(inp.shape[0])
    _call(name, lambda: dist.all_to_all_single(out, inp, outs, ins), _nbytes(inp))


class RowExchange:
    """Rows of per-Gaussian tensors between the ranks that hold them and the ranks that own them.

    This rank holds the rows ``ids`` (sorted, unique global row numbers, e.g. the Gaussians its views
    can see); the ``N`` global rows are split into the contiguous blocks ``bounds`` (block j =
    ``[bounds[j], bounds[j + 1])``, owned by rank j, :func:`block_bounds`). Made collectively (every rank
    at once; the ids go to their owners once). A rank's held rows of block j are a contiguous slice of
    its tensors (ids sorted, blocks contiguous), so nothing is copied to send them.

    :meth:`to_owners` sums what every rank holds of each block into the block, in a fixed order (the
    owner's own rows, then those of ranks ``r - 1, r - 2, ...``): deterministic for a given K.
    :meth:`from_owners` hands every rank its held rows of the blocks. Bytes each: the held rows of other
    blocks, ``rows x channels x element size``.

    Example (two ranks; rank 0 holds rows [0, 1, 3], rank 1 holds [1, 2, 3]; blocks [0, 2) and [2, 4))::

        ex = RowExchange(ids, [0, 2, 4])
        block = ex.to_owners(values)   # rank 0: rows 0, 1 (row 1 summed over both ranks); rank 1: rows 2, 3
        held = ex.from_owners(block)   # each rank's rows ids of the summed blocks
    """

    def __init__(self, ids: Tensor, bounds: Sequence[int], name: str = "rows"):
        dist = _dist()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.name = name
        self.bounds = [int(b) for b in bounds]
        dev = ids.device
        cuts = torch.searchsorted(ids, torch.tensor(self.bounds, dtype=ids.dtype, device=dev)).tolist()
        self.held = [(int(cuts[j]), int(cuts[j + 1])) for j in range(self.world)]  # my rows of block j
        self.n_held = int(ids.shape[0])
        r, K = self.rank, self.world
        self.block_rows = self.bounds[r + 1] - self.bounds[r]
        counts = torch.tensor([b - a for a, b in self.held], dtype=torch.int64, device=_wire_device(dev))
        incoming = torch.empty_like(counts)
        _call(f"{name}: setup", lambda: dist.all_to_all_single(incoming, counts), _nbytes(counts))
        self.incoming = [int(c) for c in incoming.tolist()]  # rows of my block each rank holds
        a, b = self.held[r]
        self.local: Dict[int, Tensor] = {r: (ids[a:b] - self.bounds[r]).long()}  # my block's rows, per holder
        for t in range(1, K):
            dst, src = (r + t) % K, (r - t) % K
            a, b = self.held[dst]
            got = torch.empty(self.incoming[src], dtype=torch.int64, device=_wire_device(dev))
            _a2a(f"{name}: setup", got, ids[a:b].long().to(got.device).contiguous(), dst, src, K)
            self.local[src] = (got - self.bounds[r]).to(dev)

    def to_owners(self, values: Tensor) -> Tensor:
        """``values`` [n_held, ...] -> this rank's block [block rows, ...]: the sum of every rank's rows of it."""
        r, K = self.rank, self.world
        out = values.new_zeros((self.block_rows, *values.shape[1:]))
        a, b = self.held[r]
        out.index_add_(0, self.local[r], values[a:b])
        for t in range(1, K):
            dst, src = (r + t) % K, (r - t) % K
            a, b = self.held[dst]
            got = values.new_empty((self.incoming[src], *values.shape[1:]))
            _a2a(f"{self.name}: to owners", got, values[a:b].contiguous(), dst, src, K)
            out.index_add_(0, self.local[src], got)
        return out

    def from_owners(self, block: Tensor) -> Tensor:
        """This rank's block [block rows, ...] -> every rank's held rows of the blocks ([n_held, ...])."""
        r, K = self.rank, self.world
        out = block.new_empty((self.n_held, *block.shape[1:]))
        a, b = self.held[r]
        out[a:b] = block[self.local[r]]
        for t in range(1, K):
            dst, src = (r + t) % K, (r - t) % K  # the reverse of to_owners: send to src, receive from dst
            a, b = self.held[dst]
            w = _wire(block)
            got = w.new_empty((b - a, *block.shape[1:]))
            _a2a(f"{self.name}: from owners", got, w[self.local[src]].contiguous(), src, dst, K)
            out[a:b] = got if got.dtype == out.dtype else got.to(out.dtype)
        return out


def _wire_device(dev: torch.device) -> torch.device:
    return dev if _dist().get_backend() != "nccl" else torch.device("cuda", torch.cuda.current_device())


# ------------------------------------------------------------------------------------------------ the watch

def _heartbeat_timeout() -> float:
    try:
        return max(1.0, float(os.environ.get("RH3DGS_DIST_TIMEOUT", DEFAULT_HEARTBEAT_TIMEOUT_S)))
    except ValueError:
        return DEFAULT_HEARTBEAT_TIMEOUT_S


class _Watch:
    """Heartbeats of the ranks in the job's rendezvous store; stops this rank, with one line, when another is lost.

    Keys (under the default group's prefix): ``rh3dgs/who/R`` = "HOST PID", ``rh3dgs/beat/R`` = a counter
    (or "done" once rank R left the group normally). Two store operations per rank per ``interval``.
    """

    def __init__(self, store, rank: int, world: int, interval: float = 1.0, timeout: Optional[float] = None):
        self.store, self.rank, self.world = store, rank, world
        self.interval, self.timeout = float(interval), _heartbeat_timeout() if timeout is None else float(timeout)
        self.host = socket.gethostname()
        self.who: Dict[int, Tuple[str, int]] = {}
        self.last: Dict[int, Tuple[bytes, float]] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._said = False
        self._beats = 0
        self._thread = threading.Thread(target=self._run, name="rh3dgs-watch", daemon=True)

    def _key(self, kind: str, r: int) -> str:
        return f"rh3dgs/{kind}/{r}"

    def start(self) -> None:
        self.store.set(self._key("who", self.rank), f"{self.host} {os.getpid()}")
        self.store.set(self._key("beat", self.rank), "0")
        self._thread.start()

    def stop(self, failed: bool = False) -> None:
        """Leave the watch: "done", or "failed" (an error ends this rank: the others stop at once, naming it)."""
        self._stop.set()
        with contextlib.suppress(Exception):
            self.store.set(self._key("beat", self.rank), "failed" if failed else "done")
        self._thread.join(timeout=2 * self.interval + 1)

    def _peers(self) -> List[int]:
        return [p for p in range(self.world) if p != self.rank]

    def _name(self, p: int) -> str:
        host, pid = self.who.get(p, ("?", 0))
        return f"rank {p} (pid {pid} on {host})" if pid else f"rank {p}"

    def refresh(self) -> None:
        """Read the peers' heartbeats now (one store operation); a heartbeat that changed restarts its clock."""
        peers = self._peers()
        try:
            values = self.store.multi_get([self._key("beat", p) for p in peers])
        except Exception:  # noqa: BLE001 - the store is gone: what was read last stands
            return
        self._update(values, time.monotonic())

    def _update(self, values: List[bytes], now: float) -> None:
        for p, v in zip(self._peers(), values):
            if p not in self.last or self.last[p][0] != v:
                self.last[p] = (v, now)

    def _left(self, p: int) -> bool:
        """Whether peer p left the group normally (its heartbeat says "done")."""
        if not (p in self.last and self.last[p][0] == b"done"):
            self.refresh()
        return p in self.last and self.last[p][0] == b"done"

    def _gone_here(self, p: int) -> bool:
        """Whether peer p ran on this machine and its process ended without leaving the group."""
        host, pid = self.who.get(p, ("", 0))
        if host != self.host or not pid:
            return False
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return not self._left(p)
        except PermissionError:
            return False

    def describe_lost(self, wait_s: float = 0.0) -> Optional[str]:
        """"rank P (pid .. on ..) stopped" for a peer that failed, whose process is gone on this machine or whose
        heartbeat stopped (waiting up to ``wait_s`` for a heartbeat to go stale); None when every peer still beats."""
        deadline = time.monotonic() + wait_s
        while True:
            if wait_s > 0:
                self.refresh()
            now = time.monotonic()
            for p in self._peers():
                value, since = self.last.get(p, (b"", now))
                failed = value == b"failed"  # it prints its error and leaves: gone, or given a few seconds to
                if self._gone_here(p) or (failed and now - since > min(FAILED_GRACE_S, self.timeout)):
                    return f"{self._name(p)} stopped" + (" on an error (its own line says which)" if failed else "")
            for p, (value, since) in self.last.items():
                if value != b"done" and now - since > self.timeout:
                    return f"{self._name(p)} stopped answering ({now - since:.0f} s without a heartbeat)"
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(self.interval, max(0.0, deadline - time.monotonic())))

    def say(self, line: str, code: int = 1) -> None:
        """Print ``line`` once (whichever thread comes first) and end this process at once: the main thread may be
        blocked in a collective with a rank that is gone."""
        with self._lock:
            if not self._said:
                self._said = True
                print(f"rh3dgs: error: {line}", file=sys.stderr, flush=True)
        os._exit(code)

    def _run(self) -> None:
        peers = self._peers()
        try:
            self.store.wait([self._key("beat", p) for p in peers], datetime.timedelta(seconds=self.timeout))
            for p, v in zip(peers, self.store.multi_get([self._key("who", p) for p in peers])):
                host, pid = v.decode().split()
                self.who[p] = (host, int(pid))
        except Exception:  # noqa: BLE001 - a peer that never registered: the collectives' own timeout applies
            pass
        store_ok = time.monotonic()
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            try:
                self._beats += 1
                self.store.set(self._key("beat", self.rank), str(self._beats))
                values = self.store.multi_get([self._key("beat", p) for p in peers])
                store_ok = now
            except Exception:  # noqa: BLE001 - the store's host (torchrun's agent on the first machine) is gone
                if self._stop.is_set():
                    return
                if now - store_ok > self.timeout:
                    lost = self.describe_lost()
                    self.say(f"{lost or 'the rendezvous store (torchrun on the first machine) stopped answering'}; "
                             f"rank {self.rank} stops too. Rerun the same command to resume")
                continue
            self._update(values, now)
            lost = self.describe_lost()
            if lost and not self._stop.is_set():
                self.say(f"{lost}; rank {self.rank} stops too. Rerun the same command to resume")

    def on_sigterm(self, signum, frame) -> None:  # noqa: ARG002
        self.refresh()
        lost = self.describe_lost(wait_s=min(3.0, self.timeout))
        self.say(f"{lost}; the launcher stopped rank {self.rank} too. Rerun the same command to resume" if lost else
                 f"rank {self.rank} was stopped by the launcher (SIGTERM). Rerun the same command to resume", 143)


@contextlib.contextmanager
def process_group_from_env(timeout_s: float = 1800.0) -> Iterator[Optional[DistInfo]]:
    """Yields ``None`` outside torchrun (``WORLD_SIZE`` <= 1), else the :class:`DistInfo` of the
    initialised default group (destroyed on exit unless it was initialised by the caller).

    ``timeout_s`` bounds each collective (a rank that hangs without dying); a group initialised here is also
    watched (:class:`_Watch`, the module docstring): a rank that dies stops the others within seconds on its
    machine and ``RH3DGS_DIST_TIMEOUT`` seconds (default 60) across machines."""
    global _WATCH
    world = env_world_size()
    if world <= 1:
        yield None
        return
    dist = _dist()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    owned = not dist.is_initialized()
    watch, old_handler = None, None
    if owned:
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
        from torch.distributed.distributed_c10d import _get_default_store

        watch = _Watch(_get_default_store(), dist.get_rank(), dist.get_world_size())
        watch.start()
        _WATCH = watch
        if threading.current_thread() is threading.main_thread():
            old_handler = signal.signal(signal.SIGTERM, watch.on_sigterm)
    failed = False
    try:
        yield DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank,
                       backend=dist.get_backend(), device=device)
    except BaseException:
        failed = True
        raise
    finally:
        if owned:
            if watch is not None:
                watch.stop(failed)
                _WATCH = None
                if old_handler is not None:
                    signal.signal(signal.SIGTERM, old_handler)
            dist.destroy_process_group()
            # free what still holds the group now, while the interpreter is alive: left to the
            # collection at interpreter exit, a gloo thread still releasing the last collective's
            # tensors cannot take the GIL and the process aborts ("terminate called without an
            # active exception"; 3 of about 50 two-rank `rh3dgs extract` runs here, 0 of 40 with this)
            gc.collect()
