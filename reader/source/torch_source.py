"""Where torch's source is read from: the installed package, a site-packages dir, a checkout, or a wheel file.

Nothing here imports torch. The installed copy is found with ``importlib.util.find_spec("torch")`` (a
top-level spec lookup does not execute the package), versions are read from ``torch/version.py`` as text, and
a wheel is read member by member straight from the zip (its central directory is read once; nothing is
extracted), so a 500 MB wheel costs a fraction of a second per file.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import os
import re
import tokenize
import zipfile
from abc import ABC, abstractmethod
from functools import cached_property
from pathlib import Path


class SourceError(ValueError):
    """The given path is not a torch source we can read."""


class TorchSource(ABC):
    """Read access to torch's ``.py`` files by path relative to the directory that contains ``torch/``."""

    kind: str  # "installed", "site-packages", "checkout", "wheel"
    location: Path

    @abstractmethod
    def read_bytes(self, relpath: str) -> bytes | None:
        """The file's bytes, or None if it does not exist."""

    @abstractmethod
    def list_dir(self, reldir: str) -> list[str]:
        """Names directly inside ``reldir`` (files and folders), sorted."""

    @abstractmethod
    def display(self, relpath: str) -> str:
        """A location a person can open: an absolute path, or ``wheel.whl!/member`` inside a wheel."""

    def close(self) -> None:  # noqa: B027 - only the wheel holds a resource
        """Release what the source holds open."""

    def exists(self, relpath: str) -> bool:
        return self.read_bytes(relpath) is not None

    def module_file(self, module: str) -> str | None:
        """``torch.distributed.fsdp._flat_param`` → ``torch/distributed/fsdp/_flat_param.py`` if it exists."""
        base = module.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if self.exists(candidate):
                return candidate
        return None

    def read_text(self, relpath: str) -> str | None:
        data = self.read_bytes(relpath)
        return None if data is None else decode_source(data)

    @cached_property
    def _version_assignments(self) -> dict[str, str]:
        return self._read_versions()

    def _read_versions(self) -> dict[str, str]:
        text = self.read_text("torch/version.py")
        return _string_assignments(text) if text else {}

    @property
    def version(self) -> str | None:
        return self._version_assignments.get("__version__")

    @property
    def git_version(self) -> str | None:
        return self._version_assignments.get("git_version")

    def describe(self) -> str:
        git = f" (git {self.git_version[:12]})" if self.git_version else ""
        return f"torch {self.version or '?'}{git}, {self.kind} at {self.location}"


class DirSource(TorchSource):
    """A directory that contains ``torch/``: site-packages, or a source checkout."""

    def __init__(self, root: Path, kind: str) -> None:
        self.location = root
        self.kind = kind

    def read_bytes(self, relpath: str) -> bytes | None:
        try:
            return (self.location / relpath).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def list_dir(self, reldir: str) -> list[str]:
        try:
            return sorted(child.name for child in (self.location / reldir).iterdir())
        except OSError:
            return []

    def display(self, relpath: str) -> str:
        return str(self.location / relpath)

    def _read_versions(self) -> dict[str, str]:
        found = super()._read_versions()
        if found or self.kind != "checkout":
            return found
        # A checkout has no generated torch/version.py until it is built: read version.txt and .git as text.
        found = {}
        version_txt = self.location / "version.txt"
        if version_txt.is_file():
            found["__version__"] = version_txt.read_text().strip()
        git = _git_head(self.location / ".git")
        if git:
            found["git_version"] = git
        return found


class WheelSource(TorchSource):
    """A torch wheel, read in place. Only the members asked for are decompressed."""

    kind = "wheel"

    def __init__(self, path: Path) -> None:
        self.location = path
        try:
            self._zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise SourceError(f"{path} is not a readable wheel: {exc}") from exc
        self._names = {info.filename for info in self._zip.infolist() if not info.is_dir()}
        if "torch/__init__.py" not in self._names:
            self._zip.close()
            raise SourceError(f"{path} is a zip but holds no torch/__init__.py; pass a torch wheel")

    @cached_property
    def _children(self) -> dict[str, set[str]]:
        children: dict[str, set[str]] = {}
        for name in self._names:
            parts = name.split("/")
            for depth in range(1, len(parts)):
                children.setdefault("/".join(parts[:depth]), set()).add(parts[depth])
        return children

    def read_bytes(self, relpath: str) -> bytes | None:
        if relpath not in self._names:
            return None
        return self._zip.read(relpath)

    def list_dir(self, reldir: str) -> list[str]:
        return sorted(self._children.get(reldir.rstrip("/"), ()))

    def display(self, relpath: str) -> str:
        return f"{self.location}!/{relpath}"

    def close(self) -> None:
        self._zip.close()

    def _read_versions(self) -> dict[str, str]:
        found = super()._read_versions()
        if "__version__" not in found:  # fall back to the dist-info, always present in a wheel
            for name in self._names:
                if re.fullmatch(r"torch-[^/]+\.dist-info/METADATA", name):
                    match = re.search(rb"^Version: *(\S+)", self._zip.read(name), re.MULTILINE)
                    if match:
                        found["__version__"] = match.group(1).decode()
                    break
        return found


def installed_root() -> Path:
    """The directory holding the installed ``torch/`` package, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SourceError("torch is not installed here; install it, or preview one with --torch-source PATH")
    return Path(next(iter(spec.submodule_search_locations))).parent


def open_source(path: str | os.PathLike[str] | None = None) -> TorchSource:
    """Open the installed torch (``path`` None), or a wheel / site-packages / checkout / ``torch`` package
    dir."""
    if path is None:
        return DirSource(installed_root(), "installed")
    given = Path(path).expanduser()
    if given.is_file():
        return WheelSource(given)
    if not given.is_dir():
        raise SourceError(f"--torch-source {given}: no such file or directory")
    if (given / "torch" / "__init__.py").is_file():
        is_checkout = any((given / marker).exists() for marker in ("setup.py", "version.txt", ".git"))
        return DirSource(given, "checkout" if is_checkout else "site-packages")
    if given.name == "torch" and (given / "__init__.py").is_file():
        return DirSource(given.parent, "site-packages")
    raise SourceError(
        f"--torch-source {given}: expected a torch wheel (.whl), a site-packages directory or a checkout "
        "containing torch/__init__.py"
    )


def decode_source(data: bytes) -> str:
    """Decode a Python file as the interpreter would (UTF-8 by default, BOM and coding cookies honoured),
    with universal newlines so line numbers agree with every other tool."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:
        encoding = "utf-8"
    text = data.decode(encoding, errors="replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _string_assignments(text: str) -> dict[str, str]:
    """Module-level ``NAME = "literal"`` (or annotated) assignments, read with ast: never executed."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    found: dict[str, str] = {}
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            for target in targets:
                if isinstance(target, ast.Name):
                    found[target.id] = value.value
    return found


def _git_head(git_dir: Path) -> str | None:
    try:
        head = (git_dir / "HEAD").read_text().strip()
    except OSError:
        return None
    if not head.startswith("ref:"):
        return head or None
    ref = head.split(None, 1)[1]
    ref_file = git_dir / ref
    if ref_file.is_file():
        return ref_file.read_text().strip() or None
    try:
        for line in (git_dir / "packed-refs").read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name == ref:
                return sha
    except OSError:
        pass
    return None
