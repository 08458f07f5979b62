"""Test support for the reader: a synthetic torch-like source tree, wheels built from it, guide text.

A module with a unique name (not ``conftest``) so test modules can import it without depending on which
``conftest`` module pytest imported last.
"""

from __future__ import annotations

import textwrap
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from checks.ranks.protocol import CheckRequest, CheckRun, RankResult
from reader.format.body import BodyContext, Fence
from reader.source.torch_source import DirSource

RUNTIME_UTILS = '''\
"""A synthetic stand-in for torch/distributed/fsdp/_runtime_utils.py."""

from enum import Enum, auto
from typing import Optional

from torch.distributed.fsdp._flat_param import FlatParamHandle

_PREFETCH_LIMIT: int = 2
HOOKS, ORDER = ("pre", "post"), 3


class _PrefetchMode(Enum):
    BACKWARD = auto()
    FORWARD = auto()


# Prefetch is issued from the hooks, never from user code.
@no_type_check
def _prefetch_handle(state, current_handle: Optional[FlatParamHandle], prefetch_mode: "_PrefetchMode"):
    """Prefetch the next handle if needed (without synchronization)."""
    if not current_handle:
        return
    handle = _get_handle_to_prefetch(state, current_handle)
    if not handle:
        return
    prev_training_state = handle._training_state
    _unshard(state, handle, state._unshard_stream, state._pre_unshard_stream)
    handle._training_state = prev_training_state
    handle._prefetched = True


def _get_handle_to_prefetch(state, current_handle):
    training_state = current_handle._training_state
    if training_state == "BACKWARD_PRE":
        target = state._exec_order_data.get_handle_to_backward_prefetch(current_handle)
    elif training_state == "FORWARD":
        target = state._exec_order_data.get_handle_to_forward_prefetch(current_handle)
    else:
        target = None
    return target


def _unshard(state, handle, unshard_stream, pre_unshard_stream):
    handle.unshard()


def _register_pre_backward_hooks(state, outputs):
    def _register_hook(t):
        return t

    return [_register_hook(o) for o in outputs]
'''

FLAT_PARAM = '''\
"""A synthetic stand-in for torch/distributed/fsdp/_flat_param.py."""

import torch


class FlatParamHandle:
    """Manages one flat parameter."""

    class Layout:
        def offsets(self) -> list:
            return [0, 16]

    def __init__(self, params, *, use_orig_params: bool = False):
        self._params = params
        self._use_orig_params = use_orig_params

    def unshard(self):
        unsharded = self._alloc_padded_unsharded_flat_param()
        padded_unsharded_flat_param = self._all_gather_flat_param(unsharded)
        self._use_unsharded_flat_param(padded_unsharded_flat_param)

    @property
    def sharded(self) -> bool:
        return self._sharded

    @sharded.setter
    def sharded(self, value: bool) -> None:
        self._sharded = value
'''

VERSION_PY = """\
from typing import Optional

__version__ = '{version}'
git_version = '{git}'
cuda: Optional[str] = None
"""


@dataclass
class TorchTree:
    """A site-packages-like directory holding a tiny fake ``torch`` package."""

    root: Path

    def path(self, relpath: str) -> Path:
        return self.root / relpath

    def read(self, relpath: str) -> str:
        return self.path(relpath).read_text()

    def write(self, relpath: str, text: str) -> None:
        target = self.path(relpath)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def edit(self, relpath: str, old: str, new: str) -> None:
        text = self.read(relpath)
        assert old in text, f"{old!r} not in {relpath}"
        self.write(relpath, text.replace(old, new, 1))

    def set_version(self, version: str, git: str = "0123456789abcdef0123456789abcdef01234567") -> None:
        self.write("torch/version.py", VERSION_PY.format(version=version, git=git))

    def source(self) -> DirSource:
        return DirSource(self.root, "site-packages")

    def wheel(self, path: Path, version: str = "2.99.0") -> Path:
        """Zip the tree as a wheel (with a dist-info) the way pip would find it."""
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for file in sorted(self.root.rglob("*")):
                if file.is_file():
                    archive.write(file, file.relative_to(self.root).as_posix())
            archive.writestr(
                f"torch-{version}.dist-info/METADATA",
                f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
            )
        return path


def make_tree(root: Path) -> TorchTree:
    tree = TorchTree(root)
    tree.write("torch/__init__.py", "")
    tree.set_version("2.13.0+cpu")
    tree.write("torch/distributed/__init__.py", "")
    tree.write("torch/distributed/fsdp/__init__.py", "")
    tree.write("torch/distributed/fsdp/_runtime_utils.py", RUNTIME_UTILS)
    tree.write("torch/distributed/fsdp/_flat_param.py", FLAT_PARAM)
    return tree


def guide(
    gid: str = "04-forward-prefetch",
    *,
    anchors: str = "",
    claims: str = "",
    body: str = "",
    torch: str = ">=2.13",
    extra: str = "",
) -> str:
    """A guide's text: front matter (anchors/claims given as TOML) and a body."""
    front = f'id = "{gid}"\ntitle = "Forward prefetch"\norder = 4\ntorch = "{torch}"\n{extra}'
    parts = [front, textwrap.dedent(anchors).strip(), textwrap.dedent(claims).strip()]
    return "+++\n" + "\n\n".join(p for p in parts if p) + "\n+++\n" + textwrap.dedent(body).lstrip("\n")


PREFETCH_ANCHOR = """
[[anchors]]
name = "prefetch"
symbol = "torch.distributed.fsdp._runtime_utils:_prefetch_handle"
"""

UNSHARD_ANCHOR = """
[[anchors]]
name = "unshard"
symbol = "torch.distributed.fsdp._flat_param:FlatParamHandle.unshard"
"""

LIMIT_ANCHOR = """
[[anchors]]
name = "limit"
symbol = "torch.distributed.fsdp._runtime_utils:_PREFETCH_LIMIT"
"""


@dataclass(frozen=True)
class Quiz:
    """The region of a made-up fence kind (```quiz <question>, one answer per line), registered by tests."""

    question: str
    answers: tuple[str, ...]
    start: int
    end: int


def quiz_blocks(fences: Sequence[Fence], context: BodyContext) -> Iterator[Quiz]:
    for fence in fences:
        if not fence.args:
            context.problem(fence.start, "a quiz block needs a question", "write ```quiz <question>")
            continue
        answers = tuple(line.strip() for line in fence.content.split("\n") if line.strip())
        yield Quiz(" ".join(fence.args), answers, fence.start, fence.end)


class FakeManager:
    """Stands in for a `checks.ranks.manager.PoolManager` in the CLI's claim runner (``args.manager``): a claim
    passes, running every traced symbol, unless its id is in ``fail``, when its check fails on rank 1 with a
    `Violation` reason. Every request is kept in ``requests``."""

    def __init__(self, fail: Iterable[str] = (), reason: str = "dtype-changed") -> None:
        self.fail = set(fail)
        self.reason = reason
        self.requests: list[CheckRequest] = []

    def run(self, request: CheckRequest) -> CheckRun:
        self.requests.append(request)
        executed = frozenset(request.trace)
        if request.kwargs.get("claim") in self.fail:
            message = "reduce dtype was float32, not bfloat16"
            bad = RankResult(1, ok=False, executed=executed, error=f"Violation: {message}",
                             error_type="checks.violation.Violation", message=message, reason=self.reason)  # fmt: skip
            return CheckRun(request, [RankResult(0, ok=True, executed=executed), bad], failure=f"rank 1: {message}")
        return CheckRun(request, [RankResult(r, ok=True, value=r, executed=executed) for r in range(2)])

    def close(self) -> None:
        pass


FAKE_CHECKS = "def check(ctx, **kwargs):\n    pass\n"


def write_fake_checks(root: Path) -> None:
    """A ``fakechecks`` package next to ``readings/``, so a fixture guide's ``check`` names a function that exists."""
    (root / "fakechecks").mkdir(exist_ok=True)
    (root / "fakechecks" / "__init__.py").write_text("")
    (root / "fakechecks" / "claims.py").write_text(FAKE_CHECKS)


def claim(claim_id: str, **fields: str) -> str:
    """A ``[[claims]]`` table whose check is the fake one; its id travels in its kwargs, for `FakeManager`."""
    extra = "".join(f"{key} = {value}\n" for key, value in fields.items())
    return (
        f'[[claims]]\nid = "{claim_id}"\nstatement = "Claim {claim_id} holds."\n'
        f'check = "fakechecks.claims:check"\nworld_size = 2\nkwargs = {{ claim = "{claim_id}" }}\n{extra}'
    )


def cli(argv: Sequence[str], manager: FakeManager | None = None) -> int:
    """``fsdp-readings ARGV`` in process, its claims sent to ``manager`` (as the study commands' tests do)."""
    from reader.commands.app import build_parser, make_console

    args = build_parser().parse_args(list(argv))
    args.manager = manager or FakeManager()
    return int(args.run(args, make_console()))
