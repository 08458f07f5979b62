"""What the reader's pytest plugin keeps for one session, split by lifetime.

- `Options`: what the command line asked for, parsed once at configure time (a bad ``--approve`` is a usage
  error before anything is collected).
- `Resources`: torch's source, the workspace over it and the check runner, opened on first use and closed at
  the end, so a session that runs no guide item never reads torch or starts a rank pool.
- `Findings`: what collection and the items found (guides, broken input, each claim's verdict, the approvals
  decided, the other tests that failed); the outcome and exit code (`reader.gate.outcome`), the terminal
  summary and the drift report are made from it.

`ReaderSession` bundles the three with `Display`; ``session_of(config)`` finds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from reader.format.parse import GuideRegistry
from reader.gate.approval import NotApprovable, force_reason
from reader.gate.drift_report import reserved_name
from reader.gate.lock import LockError
from reader.gate.outcome import DEFAULT_FAIL_ON
from reader.gate.report import SessionReport
from reader.gate.workspace import LOCK_NAME, GuideApproval, Workspace
from reader.pytest_plugin.runner import CheckRunner, PoolRunner
from reader.source.checkref import CheckFinder
from reader.source.index import IndexCache
from reader.source.torch_source import SourceError, TorchSource, open_source

if TYPE_CHECKING:
    from reader.claims.verdict import ClaimVerdict


@dataclass(frozen=True)
class Display:
    """How paths appear in messages: relative to where pytest was invoked, else to its rootdir."""

    bases: tuple[Path, ...]

    def __call__(self, path: Path) -> str:
        for base in self.bases:
            try:
                return str(path.resolve().relative_to(base.resolve()))
            except ValueError:
                continue
        return str(path)


@dataclass(frozen=True)
class Options:
    readings_dir: Path  # ini ``readings_dir``, resolved against the rootdir
    approve_ids: frozenset[str] | None  # --approve: None when absent; "*": the one guide that drifts
    drift_report: Path | None
    torch_source: str | None  # --torch-source: preview anchors against another torch
    force: str | None = None  # --force: why a guide is approved although a claim failed or did not run
    fail_on: str = DEFAULT_FAIL_ON  # --fail-on: the least severe outcome that fails the session

    @classmethod
    def from_config(cls, config: pytest.Config) -> Options:
        report = config.getoption("drift_report")
        if report and (clash := reserved_name(Path(report))):
            raise pytest.UsageError(clash)
        approve_ids = _approve_ids(config.getoption("approve"))
        torch_source = config.getoption("torch_source") or None
        forced = config.getoption("force")
        if approve_ids is not None and torch_source:
            raise pytest.UsageError(
                "--approve records what ran on the installed torch, and with --torch-source nothing runs (claims "
                f"are skipped): install the torch of {torch_source} in a venv and approve there"
            )
        if forced is not None and approve_ids is None:
            raise pytest.UsageError("--force gives the reason to approve a guide anyway: use it with --approve=<id>")
        try:
            force = force_reason(forced)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        return cls(
            readings_dir=(config.rootpath / str(config.getini("readings_dir"))).resolve(),
            approve_ids=approve_ids,
            drift_report=Path(report) if report else None,
            torch_source=torch_source,
            force=force,
            fail_on=config.getoption("fail_on") or DEFAULT_FAIL_ON,
        )

    @property
    def lock_path(self) -> Path:
        return self.readings_dir / LOCK_NAME


def _approve_ids(values: list[str] | None) -> frozenset[str] | None:
    if values is None:
        return None
    ids: set[str] = set()
    for value in values:
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            if "/" in part or part.endswith(".md") or Path(part).exists():
                raise pytest.UsageError(
                    f"--approve took `{part}` as a guide id. Put paths before --approve "
                    f"(pytest {part} --approve), or name the guide: --approve=<guide-id>"
                )
            ids.add(part)
    return frozenset(ids)


class Resources:
    """Opened lazily, closed by `close`. A torch source that fails to open fails every later use the same way."""

    def __init__(self, config: pytest.Config, options: Options, display: Display) -> None:
        self.config = config
        self.lock_path = options.lock_path
        self.display = display
        self.cache = IndexCache()
        self.checks = CheckFinder(extra_paths=[config.rootpath], cache=self.cache)
        self.preview: TorchSource | None = None  # --torch-source, opened now: a bad path is a usage error
        if options.torch_source:
            try:
                self.preview = open_source(options.torch_source)
            except SourceError as exc:
                raise pytest.UsageError(str(exc)) from exc
        self._workspace: Workspace | None = None
        self._source_error: str | None = None
        self._runner: CheckRunner | None = None

    def workspace(self) -> Workspace:
        if self._workspace is None:
            if self._source_error is not None:
                raise SourceError(self._source_error)
            try:
                source = self.preview or open_source(None)
            except SourceError as exc:
                self._source_error = str(exc)
                raise
            self._workspace = Workspace(source, self.lock_path, self.cache, self.display)
        return self._workspace

    @property
    def opened(self) -> Workspace | None:
        """The workspace if some item opened it."""
        return self._workspace

    def runner(self) -> CheckRunner:
        """The ``pytest_reader_check_runner`` hook's runner, else the rank pool."""
        if self._runner is None:
            found = self.config.hook.pytest_reader_check_runner(config=self.config)
            self._runner = found if found is not None else PoolRunner(self.config)
        return self._runner

    def close(self) -> None:
        if self._workspace is not None:
            self._workspace.source.close()
        elif self.preview is not None:
            self.preview.close()


@dataclass
class Findings:
    report: SessionReport
    guides: GuideRegistry  # every guide collected, by id (a second guide with a known id is broken input)
    broken: dict[str, str] = field(default_factory=dict)  # nodeid of a guide file (or "--approve=ID") → problems
    lock_error: LockError | None = None
    written: tuple[Path, Path] | None = None  # the drift report's JSON and Markdown files
    # (guide id, claim id) → its verdict in this session: decided once (a predict question reads its claim's), or
    # given by the report hook to a claim item pytest ended before one. The report's rows, approval and the
    # progress file are all read from these.
    verdicts: dict[tuple[str, str], ClaimVerdict] = field(default_factory=dict)
    progress_problem: str | None = None  # why the results could not be recorded

    approving: frozenset[str] = frozenset()  # the guides --approve approves, once collection is done
    approvals: dict[str, GuideApproval | NotApprovable] = field(default_factory=dict)  # guide id → decision


class ReaderSession:
    """The plugin's state for one pytest session (one per ``pytest.Config``, in its stash)."""

    def __init__(self, config: pytest.Config) -> None:
        self.display = Display((config.invocation_params.dir, config.rootpath))
        self.options = Options.from_config(config)
        self.resources = Resources(config, self.options, self.display)
        report = SessionReport(None, None, "", self.display(self.options.lock_path), fail_on=self.options.fail_on)
        self.findings = Findings(report, GuideRegistry(self.display))

    def describe_torch(self) -> None:
        """Name the torch the session read (if it read one) in the report."""
        workspace = self.resources.opened
        if workspace is not None:
            source = workspace.source
            report = self.findings.report
            report.torch_version, report.torch_git = source.version, source.git_version
            report.source = f"{source.kind} at {source.location}"


SESSION = pytest.StashKey[ReaderSession]()


def session_of(config: pytest.Config) -> ReaderSession:
    return config.stash[SESSION]
