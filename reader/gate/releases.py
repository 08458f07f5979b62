"""Torch releases compared as versions, not strings: ``2.15``, ``2.15.0`` and ``2.15.0+cu132`` name one release.

A build tag (``+cpu``, ``+cu132``) says how a wheel was built, not what source it holds, so it never reaches the
lock, a matrix or a venv's name. A release is written with three numbers (``2.15.0``), its pre-release or dev
part kept (``2.16.0.dev20260101`` is not 2.16.0).
"""

from __future__ import annotations

from collections.abc import Iterable

from packaging.version import InvalidVersion, Version

UNKNOWN = "unknown"  # a torch whose version.py could not be read


def release(text: str) -> str:
    """The release ``text`` names, in its canonical spelling: ``2.15`` → ``2.15.0``, ``2.15.0+cu132`` →
    ``2.15.0``. Raises `ValueError` naming the text when it is not a version."""
    try:
        version = Version(text.strip())
    except InvalidVersion:
        raise ValueError(f"`{text}` is not a torch release such as `2.13` or `2.15.0`") from None
    numbers = (*version.release, 0, 0)[: max(3, len(version.release))]
    spelled = ".".join(map(str, numbers))
    if version.epoch:
        spelled = f"{version.epoch}!{spelled}"
    if version.pre is not None:
        spelled += f"{version.pre[0]}{version.pre[1]}"
    if version.post is not None:
        spelled += f".post{version.post}"
    if version.dev is not None:
        spelled += f".dev{version.dev}"
    return spelled


def release_or_unknown(text: str | None) -> str:
    """`release`, or ``unknown`` for a torch whose version could not be read (it never matches a matrix)."""
    if text is None:
        return UNKNOWN
    try:
        return release(text)
    except ValueError:
        return UNKNOWN


def same_release(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and release_or_unknown(a) == release_or_unknown(b) != UNKNOWN


def version_key(text: str) -> tuple[int, Version]:
    """Sort key: releases in version order, ``unknown`` (and anything unparseable) first."""
    try:
        return (1, Version(text))
    except InvalidVersion:
        return (0, Version("0"))


def sorted_releases(texts: Iterable[str]) -> tuple[str, ...]:
    """Canonical releases, each once, oldest first."""
    return tuple(sorted({release_or_unknown(t) for t in texts}, key=version_key))
