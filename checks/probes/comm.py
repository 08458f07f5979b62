"""Record every collective a rank issues, in call order, at the dispatcher: ``with record_comm() as comm: ...``.

Where it listens: a Python kernel at the ``Autograd`` dispatch key of every ``c10d::*``, ``_c10d_functional::*``
and ``_dtensor::*`` collective operator (see `checks.probes.collectives`), registered while a recording is open.
Most have no autograd formula, so the kernel stands where autograd's fallback would (it records, then runs the
kernels below autograd, as the fallback does); the few functional collectives that have one keep it, and the
kernel stands right after it (``ADInplaceOrView``). Every other operator runs untouched: a
``TorchDispatchMode`` would put every aten operator of the step through Python (about 1.44× on a mini_gpt step for a
mode that does nothing). That layer is below every Python API name (torch 2.13 FSDP calls ``dist.all_gather_single``
/ ``reduce_scatter_single``, FSDP1 on CPU the list ``dist.all_gather``, older code ``all_gather_into_tensor`` /
``_all_gather_base``: all the same operators), below every ``from ... import`` copy of those names, and it also
sees C++ callers: DDP's reducer all-reduces its buckets from C++, through ``ProcessGroup::allreduce``, which
dispatches ``c10d::allreduce_`` like any other caller. Measured on the toy model: one ``allreduce_`` of 98 elements
per DDP step, recorded with ``api="<C++>"``. That is why this recorder does not use a DDP comm hook: a hook must be
registered before the first backward and replaces the C++ built-in all-reduce with a Python one, so it observes a
different code path than the one a guide reads. The kernels are process-wide, so collectives issued from other
threads (a Python thread started in the block, autograd's) are recorded too.

Each record (`Collective`) keeps op kind, operator, dtype, full payload (elements, bytes), ring-model bytes sent
per rank, group size and ranks, the Python API the caller used (outermost frame in ``distributed_c10d`` or
``_functional_collectives``; ``"<C++>"`` when no Python frame issued it), the calling function (the nearest frame
outside torch's collective plumbing, e.g.
``torch.distributed.fsdp._flat_param:FlatParamHandle._all_gather_flat_param``), whether it was issued inside
backward, asynchronously, or by an object collective (``all_gather_object`` and friends, marked
``object_collective``), the data pointer of each payload tensor's storage (``storages``), and for a send or a
receive the global rank at its other end (``peer``). Async work handles
are recorded when issued; waits are not recorded. When the check is captured (`checks.ranks.capture`),
``source`` is the line the calling function is executing (the call in progress,
``torch/distributed/fsdp/_flat_param.py:<line>``); a collective C++ issued (DDP's buckets) names the Python frame
that was running then, typically the autograd engine's ``run_backward`` call.

A collective issued inside another collective's kernel (a functional collective's own c10d call) is not recorded
again: the outer operator is the record, as it was for the dispatch mode this replaced.

Blind spots, each caught by the cross-check (`checks.probes.crosscheck`, on by default) rather than missed:
calls made directly on a backend object (``group._get_backend(device).allreduce``) skip the dispatcher, and code
that runs with the Autograd key excluded skips the kernels: ``torch.inference_mode()``, and a collective issued
from inside another operator's autograd kernel (a tensor subclass redistributing inside an aten operator's
dispatch). The cross-check needs async collectives to finish inside the block (wait before leaving it), and it
explains a backend event only by count and size, not by the order of the calls.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
import torch.distributed as dist

from checks.probes import clock, collectives
from checks.probes.collectives import Collective
from checks.probes.crosscheck import BackendEvents, CrossCheck, compare
from checks.ranks import capture

# Frames that are torch's collective plumbing, never "the caller".
_API_MODULES = {
    "torch.distributed.distributed_c10d": "",
    "torch.distributed._functional_collectives": "funcol.",
    "torch.distributed._functional_collectives_impl": "funcol.",
}
_PLUMBING = (
    "torch._dynamo", "torch._compile", "torch._ops", "torch._library", "torch.distributed.c10d_logger",
    "typing_extensions", "functools", "contextlib", "torch.utils._python_dispatch", "torch.utils._contextlib",
    "torch.library", "torch.autograd.function",
    "torch.autograd.profiler", "checks.probes.comm", "checks.probes.crosscheck",
)  # fmt: skip
_MODE_HANDLERS = frozenset({"__torch_dispatch__", "__torch_function__"})  # other modes and subclasses in between
OBJECT_APIS = frozenset(
    {
        "all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list", "send_object_list",
        "recv_object_list",
    }
)  # fmt: skip


@dataclass(frozen=True)
class OpTotals:
    op: str
    count: int
    numel: int
    nbytes: int
    ring_bytes: float


@dataclass
class CommLog:
    """What `record_comm` recorded on one rank."""

    rank: int = -1
    world_size: int = 0
    records: list[Collective] = field(default_factory=list)
    crosscheck: CrossCheck | None = None

    def __iter__(self) -> Iterator[Collective]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> Collective:
        return self.records[index]

    def select(
        self, op: str | None = None, *, objects: bool | None = False, in_backward: bool | None = None
    ) -> list[Collective]:
        """Records of one kind (all when ``op`` is None). Object collectives are left out unless ``objects`` is
        True (only them) or None (both)."""
        return [
            r
            for r in self.records
            if (op is None or r.op == op)
            and (objects is None or r.object_collective == objects)
            and (in_backward is None or r.in_backward == in_backward)
        ]

    def count(self, op: str | None = None, **filters: Any) -> int:
        return len(self.select(op, **filters))

    def nbytes(self, op: str | None = None, **filters: Any) -> int:
        return sum(r.nbytes for r in self.select(op, **filters))

    def ring_bytes(self, op: str | None = None, **filters: Any) -> float:
        return sum(r.ring_bytes for r in self.select(op, **filters))

    def totals(self, *, objects: bool | None = False) -> list[OpTotals]:
        """Per op kind (in `collectives.KINDS` order, then unknown ones): count, elements, bytes, ring bytes."""
        kinds = [k for k in collectives.KINDS if self.count(k, objects=objects)]
        kinds += sorted({r.op for r in self.select(objects=objects)} - set(kinds))
        return [
            OpTotals(
                k,
                self.count(k, objects=objects),
                sum(r.numel for r in self.select(k, objects=objects)),
                self.nbytes(k, objects=objects),
                self.ring_bytes(k, objects=objects),
            )
            for k in kinds
        ]

    def keys(self) -> list[tuple[Any, ...]]:
        return [r.key() for r in self.records]


class UnrecordedCollectives(AssertionError):
    """The backend ran collectives the recorder did not see (or did not run ones it recorded)."""


class _Recorder:
    """Turns one intercepted operator call into a `Collective` on its log."""

    def __init__(self, log: CommLog) -> None:
        self.log = log
        self._groups: dict[Any, tuple[Any, tuple[int, tuple[int, ...], str]]] = {}  # by group: (it, its facts)

    def record(self, name: str, bound: dict[str, Any], issuer: types.FrameType | None) -> None:
        payload = collectives.payload(name, bound)
        size, ranks, backend = self._group(payload.group)
        factor = size if payload.per_rank else 1
        numels = tuple(t.numel() * factor for t in payload.tensors)
        nbytes = sum(t.numel() * t.element_size() * factor for t in payload.tensors)
        dtypes = {str(t.dtype) for t in payload.tensors}
        api, caller, frame = _attribute(issuer, name)
        kind = payload.kind
        ring = (
            float(payload.sent_bytes_p2p)
            if payload.sent_bytes_p2p is not None
            else collectives.ring_bytes(kind, nbytes, size)
            if not kind.startswith("unknown:")
            else 0.0
        )
        self.log.records.append(
            Collective(
                index=len(self.log.records) + 1,
                op=kind,
                torch_op=name,
                api=api,
                caller=caller,
                dtype=dtypes.pop() if len(dtypes) == 1 else ("mixed" if dtypes else ""),
                numel=sum(numels),
                nbytes=nbytes,
                ring_bytes=ring,
                group_size=size,
                group_ranks=ranks,
                backend=backend,
                numels=numels,
                tensors=payload.count,
                async_op=payload.async_op,
                object_collective=api in OBJECT_APIS,
                in_backward=torch._C._current_graph_task_id() != -1,
                rank=self.log.rank,
                seq=clock.tick(),
                source=capture.where(frame) if frame is not None and capture.active() else "",
                storages=tuple(_storage(t) for t in payload.tensors),
                peer=_peer(kind, bound, ranks),
            )
        )

    def _group(self, group: Any) -> tuple[int, tuple[int, ...], str]:
        """`_group`, once per group a recording meets (the group is held, so its id stays its own)."""
        if isinstance(group, torch.ScriptObject):  # a new box every call; the group inside is the same object
            group = dist.ProcessGroup.unbox(group)
        key = group if isinstance(group, str) else id(group)
        cached = self._groups.get(key)
        if cached is None:
            cached = self._groups[key] = (group, _group(group))
        return cached[1]


def _peer(kind: str, bound: dict[str, Any], ranks: tuple[int, ...]) -> int:
    """The global rank at the other end of a send or receive (its ``dst`` or ``src``, a group rank)."""
    peer = bound.get("dst", bound.get("src")) if kind in ("send", "recv") else None
    if not isinstance(peer, int):
        return -1
    return ranks[peer] if 0 <= peer < len(ranks) else peer


def _storage(tensor: torch.Tensor) -> int:
    """The data pointer of ``tensor``'s storage; 0 for a tensor without one (a meta or fake tensor)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _group(group: Any) -> tuple[int, tuple[int, ...], str]:
    """(size, global ranks, backend) of the group an operator received (a boxed ProcessGroup or a group name)."""
    if isinstance(group, torch.ScriptObject):
        group = dist.ProcessGroup.unbox(group)
    elif isinstance(group, str):
        group = dist.distributed_c10d._resolve_process_group(group)
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    try:
        ranks = tuple(dist.get_process_group_ranks(group))
    except (ValueError, RuntimeError):  # a group c10d does not know (e.g. FSDP1's fake process group)
        ranks = ()
    try:
        backend = str(dist.get_backend(group))
    except (ValueError, RuntimeError):
        backend = group.name()
    return group.size(), ranks, backend


def _attribute(frame: types.FrameType | None, op_name: str) -> tuple[str, str, types.FrameType | None]:
    """(api, caller, its frame): the outermost Python collective API on the stack and the frame that called it."""
    api = ""
    direct = False  # Python called the operator itself (torch.ops....), not through an API function
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module in _API_MODULES:
            api = _API_MODULES[module] + frame.f_code.co_name
        elif frame.f_code.co_name in _MODE_HANDLERS:
            direct = False  # operator frames so far were another mode re-dispatching; what called it is above
        elif module.startswith(_PLUMBING):
            direct = direct or module == "torch._ops"
        else:
            break
        frame = frame.f_back
    caller = f"{frame.f_globals.get('__name__', '?')}:{frame.f_code.co_qualname}" if frame is not None else "?"
    if not api:
        api = f"torch.ops.{op_name.replace('::', '.')}" if direct else "<C++>"
    return api, caller, frame


# -- the interception point: a kernel at the Autograd key of every collective operator ----------------------------
_active: list[_Recorder] = []  # the open recordings, outermost first; every one records every collective
_libraries: list[torch.library.Library] = []  # our kernels, registered while a recording is open


@cache
def _collective_ops() -> tuple[tuple[str, torch._ops.OpOverload, str], ...]:
    """(name, default overload, dispatch key for our kernel) of every dispatcher operator the recorder accounts
    for, as this torch has them. Most have no autograd formula: ours stands at their Autograd key. A few
    functional collectives have one (registered from Python when ``_functional_collectives`` is imported; its
    kernel redispatches to the keys after autograd): ours stands after it, at ADInplaceOrView, so that the
    formula keeps working."""
    import torch.distributed._functional_collectives  # registers the ops and their formulas

    out = []
    for name in sorted(torch._C._dispatch_get_all_op_names()):
        namespace, _, op = name.partition("::")
        if collectives.is_collective(name) and "." not in op:
            keys = {line.split(":")[0].removesuffix("[alias]") for line in torch._C._dispatch_dump(name).splitlines()}
            key = "ADInplaceOrView" if keys & {"Autograd", "AutogradCPU", "AutogradCUDA"} else "Autograd"
            out.append((name, getattr(getattr(torch.ops, namespace), op).default, key))
    return tuple(out)


def _kernel(name: str, op: torch._ops.OpOverload, key: str) -> Callable[..., Any]:
    below = torch._C._AutoDispatchBelowAutograd if key == "Autograd" else torch._C._AutoDispatchBelowADInplaceOrView

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if _active:
            bound = collectives.bind(op, args, kwargs)
            issuer = sys._getframe(1)  # the Python frame running when it was issued (none between: C++ called us)
            for recorder in _active:
                recorder.record(name, bound, issuer)
        # What autograd's fallback does for an operator without a formula: run the kernels below our key;
        # collectives that kernel issues itself (a functional collective's c10d call) stay inside.
        with below():
            return op(*args, **kwargs)

    return kernel


def _install() -> None:
    libraries: dict[str, torch.library.Library] = {}
    for name, op, key in _collective_ops():
        namespace, _, short = name.partition("::")
        if namespace not in libraries:
            libraries[namespace] = torch.library.Library(namespace, "IMPL")
        libraries[namespace].impl(short, _kernel(name, op, key), key)
    _libraries.extend(libraries.values())


def _uninstall() -> None:
    while _libraries:
        _libraries.pop()._destroy()


@contextmanager
def _intercepting(recorder: _Recorder) -> Iterator[None]:
    if not _active:
        _install()
    _active.append(recorder)
    try:
        yield
    finally:
        _active.remove(recorder)
        if not _active:
            _uninstall()


@contextmanager
def record_comm(*, crosscheck: bool = True) -> Iterator[CommLog]:
    """Record the collectives issued in the block on this rank.

    With ``crosscheck`` (the default) the backend's own profiler events are collected too and, when the block
    finishes, every one must be explained by a record and every record by one: otherwise `UnrecordedCollectives`
    is raised with both lists. The result is kept on ``log.crosscheck``. Without it, the blind spots of the module
    docstring (backend objects, code running with the Autograd key excluded) go unnoticed: say so in the claim.
    """
    log = CommLog(
        rank=dist.get_rank() if dist.is_initialized() else 0,
        world_size=dist.get_world_size() if dist.is_initialized() else 1,
    )
    witness = BackendEvents() if crosscheck else None
    if witness is not None:
        witness.__enter__()
    try:
        with _intercepting(_Recorder(log)):
            yield log
    finally:
        if witness is not None:
            witness.__exit__(None, None, None)
        capture.add(log)  # the same object: the cross-check below is filled in before the result is sent
    if witness is not None:
        log.crosscheck = compare(log.records, witness.events, witness.method)
        if not log.crosscheck.ok:
            raise UnrecordedCollectives(log.crosscheck.explain())
