"""pytest plugin: ``readings/**/*.md`` guides become items.

- ``readings/04-forward-prefetch.md::anchor[prefetch]`` passes while the anchor's live torch source is the
  approved one (unchanged, moved, or only cosmetically changed: reported as a note) and fails otherwise, with
  the drift class, a diff approved → current, both locations and the approve command.
- ``readings/04-forward-prefetch.md::claim[forward-order]`` runs its check on the rank pool and passes only if
  the check passed and some anchored torch code ran on a rank (runtime evidence).

Item ids come from anchor names and claim ids, never from line numbers. Failures point at the guide's own
lines (like pytest's doctest items). A broken guide is a collection error naming file, line and fix; the other
guides still run, and the session exits 2 (0 clean, 1 drift or failed claim).

Options: ``--approve[=GUIDE_ID]``, ``--torch-source PATH``, ``--drift-report FILE``; ini ``readings_dir``.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from rich.console import Console

from reader import hookspecs
from reader.anchors import AnchorError
from reader.checkref import CheckFinder
from reader.drift import Drift, DriftKind
from reader.errors import GuideError
from reader.evidence import missing_evidence, trace_symbols
from reader.guide import AnchorSpec, ClaimSpec, Guide
from reader.index import IndexCache
from reader.lock import LockError
from reader.parse import load_guide, looks_like_guide
from reader.report import AnchorRow, ClaimRow, SessionReport, approve_commands, summary, write_drift_report
from reader.runner import CheckOutcome, CheckRunner, ClaimRequest, PoolRunner, RankPoolUnavailable
from reader.torch_source import SourceError, TorchSource, open_source
from reader.workspace import LOCK_NAME, GuideRegistry, NotApprovable, Workspace

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr
    from _pytest._io import TerminalWriter

BROKEN_INPUT = 2
PREVIEW_SKIP = "--torch-source previews anchors only; claims run against the installed torch"


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fsdp-readings", "reading guides over torch source (reader/)")
    group.addoption(
        "--approve",
        action="append",
        nargs="?",
        const="*",
        default=None,
        metavar="GUIDE_ID",
        help="record the current torch source of the collected guides' anchors (or only GUIDE_ID's; "
        "repeatable, comma-separated) in readings/anchors.lock, after re-reading the guide. "
        "Put paths before it.",
    )
    group.addoption(
        "--torch-source",
        metavar="PATH",
        default=None,
        help="read anchors from a torch wheel (read in place), site-packages dir or checkout instead of the "
        "installed torch; runs anchor items only (claims are skipped)",
    )
    group.addoption(
        "--drift-report",
        metavar="FILE",
        default=None,
        help="write the session's drift report as JSON to FILE and as Markdown next to it (FILE.md)",
    )
    parser.addini("readings_dir", "directory holding the reading guides and anchors.lock", default="readings")


STATE = pytest.StashKey["ReaderState"]()


def pytest_configure(config: pytest.Config) -> None:
    for line in (
        "gpu: needs CUDA devices and the nccl backend",
        "world_size(n): the number of ranks a check runs on",
        "slow: takes more than a few seconds",
    ):
        if not any(existing.split(":")[0] == line.split(":")[0] for existing in config.getini("markers")):
            config.addinivalue_line("markers", line)
    config.stash[STATE] = ReaderState(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None:
        state.close()


def _state(config: pytest.Config) -> ReaderState:
    return config.stash[STATE]


class ReaderState:
    """Everything the plugin keeps for one session."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.readings_dir = (config.rootpath / str(config.getini("readings_dir"))).resolve()
        self.lock_path = self.readings_dir / LOCK_NAME
        self.cache = IndexCache()
        self.checks = CheckFinder(extra_paths=[config.rootpath], cache=self.cache)
        self.registry = GuideRegistry(self.display)
        self.broken: dict[str, str] = {}  # nodeid → rendered problems
        self.items: dict[str, tuple[Guide, str, str]] = {}  # nodeid → (guide, "anchor"|"claim", name)
        self.drifts: dict[str, Drift] = {}
        self.approved_items: set[str] = set()
        self.approve_ids = _approve_ids(config.getoption("approve"))
        self.report_path = config.getoption("drift_report")
        self._runner: CheckRunner | None = None
        self._opened: Workspace | None = None
        self.source_error: str | None = None
        self.lock_error: LockError | None = None
        self.preview: TorchSource | None = None
        self.written: tuple[Path, Path] | None = None
        preview = config.getoption("torch_source")
        if preview:
            try:
                self.preview = open_source(preview)
            except SourceError as exc:
                raise pytest.UsageError(str(exc)) from exc
        self.report = SessionReport(None, None, "", self.display(self.lock_path))

    # --- lazily opened resources ---

    def workspace(self) -> Workspace:
        if self._opened is None:
            if self.source_error is not None:
                raise SourceError(self.source_error)
            try:
                source = self.preview or open_source(None)
            except SourceError as exc:
                self.source_error = str(exc)
                raise
            self._opened = Workspace(source, self.lock_path, self.cache, self.display)
            self.report.torch_version = source.version
            self.report.torch_git = source.git_version
            self.report.source = f"{source.kind} at {source.location}"
        return self._opened

    @property
    def opened(self) -> Workspace | None:
        """The workspace if some item opened it (a session that ran no guide item never reads torch)."""
        return self._opened

    def runner(self) -> CheckRunner:
        if self._runner is None:
            found = self.config.hook.pytest_reader_check_runner(config=self.config)
            self._runner = found if found is not None else PoolRunner(self.config)
        return self._runner

    def close(self) -> None:
        if self._opened is not None:
            self._opened.source.close()
        elif self.preview is not None:
            self.preview.close()

    # --- helpers ---

    def display(self, path: Path) -> str:
        for base in (self.config.invocation_params.dir, self.config.rootpath):
            try:
                return str(path.resolve().relative_to(base.resolve()))
            except ValueError:
                continue
        return str(path)

    def is_candidate(self, path: Path, session: pytest.Session) -> bool:
        if path.suffix != ".md" or not looks_like_guide(path):
            return False
        inside = self.readings_dir == path.resolve().parent or self.readings_dir in path.resolve().parents
        return inside or session.isinitpath(path)

    def approving(self, guide_id: str) -> bool:
        return self.approve_ids is not None and ("*" in self.approve_ids or guide_id in self.approve_ids)


def _approve_ids(values: list[str] | None) -> set[str] | None:
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
    return ids


# --- collection ---------------------------------------------------------------------------------------------


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> GuideFile | None:
    state = _state(parent.config)
    if state.is_candidate(file_path, parent.session):
        return GuideFile.from_parent(parent, path=file_path)
    return None


class GuideFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        state = _state(self.config)
        try:
            guide = load_guide(self.path, state.checks)
            state.registry.add(guide)
        except GuideError as exc:
            rendered = exc.render(state.display(self.path))
            state.broken[self.nodeid] = rendered
            raise self.CollectError(rendered) from None
        for anchor in guide.anchors:
            item = AnchorItem.from_parent(self, name=f"anchor[{anchor.name}]", guide=guide, anchor=anchor)
            state.items[item.nodeid] = (guide, "anchor", anchor.name)
            yield item
        for claim in guide.claims:
            item = ClaimItem.from_parent(self, name=f"claim[{claim.id}]", guide=guide, claim=claim)
            state.items[item.nodeid] = (guide, "claim", claim.id)
            yield item


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> Iterator[None]:
    """Let the other guides run when every collection error is a broken guide (broken tests still abort)."""
    state = _state(session.config)
    option = session.config.option
    original = option.continue_on_collection_errors
    if session.testsfailed and session.testsfailed == len(state.broken):
        option.continue_on_collection_errors = True
    try:
        return (yield)
    finally:
        option.continue_on_collection_errors = original


# --- items --------------------------------------------------------------------------------------------------


class _GuideItem(pytest.Item):
    guide: Guide
    line: int

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.line - 1, self.name

    def where(self) -> str:
        return f"{_state(self.config).display(self.path)}:{self.line}"

    def _workspace_or_fail(self) -> Workspace:
        state = _state(self.config)
        try:
            workspace = state.workspace()
        except SourceError as exc:
            raise ItemProblem(f"{self.where()}: cannot read torch's source: {exc}") from None
        if not self.guide.applies_to(workspace.torch_version):
            version = workspace.torch_version
            pytest.skip(f"{self.guide.id} applies to torch {self.guide.torch}; this torch is {version}")
        return workspace

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str | TerminalRepr:
        if isinstance(excinfo.value, ItemProblem):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)


class ItemProblem(Exception):
    """A failure whose message is the whole report (no traceback: the problem is in the guide or torch, not
    here)."""


class AnchorDrifted(ItemProblem):
    def __init__(self, drift: Drift, approving: bool) -> None:
        self.drift = drift
        self.approving = approving
        super().__init__(drift.summary)


class AnchorItem(_GuideItem):
    def __init__(self, *, guide: Guide, anchor: AnchorSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.guide = guide
        self.anchor = anchor
        self.line = anchor.line

    def runtest(self) -> None:
        state = _state(self.config)
        workspace = self._workspace_or_fail()
        try:
            workspace.lock  # noqa: B018 - load (and validate) the lock before comparing with it
        except LockError as exc:
            state.lock_error = exc
            raise ItemProblem(
                f"{state.display(exc.path)}:{exc.line}: malformed lock: {exc.message}\n"
                "    fix: restore it from version control, or delete the broken entry and re-approve"
            ) from None
        if state.approving(self.guide.id):
            try:
                approval = workspace.approve(self.guide, self.anchor)
            except NotApprovable as exc:
                state.drifts[self.nodeid] = exc.drift
                raise AnchorDrifted(exc.drift, approving=True) from None
            state.drifts[self.nodeid] = approval.drift
            state.approved_items.add(self.nodeid)
            self.user_properties.append(("approved", approval.drift.kind.value))
            state.report.approved.append(f"{self.guide.id}/{self.anchor.name} (was: {approval.drift.kind.value})")
            return
        drift = workspace.drift(self.guide, self.anchor)
        state.drifts[self.nodeid] = drift
        self.user_properties.append(("drift", drift.kind.value))
        if not drift.ok:
            raise AnchorDrifted(drift, approving=False)

    def repr_failure(  # type: ignore[override]
        self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None
    ) -> str | TerminalRepr | DriftRepr:
        if isinstance(excinfo.value, AnchorDrifted):
            return DriftRepr(self, excinfo.value.drift, excinfo.value.approving)
        return super().repr_failure(excinfo, style=style)


class DriftRepr:
    """The failure of an anchor item: class, locations, problems, hints, colored diff, approve command.

    Duck-typed like pytest's own reprs (reports call ``toterminal`` when it exists and ``str`` otherwise), so
    no private pytest class is needed at run time.
    """

    def __init__(self, item: AnchorItem, drift: Drift, approving: bool) -> None:
        self.item = item
        self.drift = drift
        self.approving = approving

    def lines(self) -> Iterator[tuple[str, dict[str, bool]]]:
        item, drift = self.item, self.drift
        verb = "cannot be approved" if self.approving else "drifted"
        anchor = item.anchor
        yield (
            f"{item.where()}: anchor `{anchor.name}` ({anchor.symbol}) {verb}: {drift.kind.value}",
            {"red": True, "bold": True},
        )
        yield f"  {drift.summary}", {}
        if drift.approved is not None:
            a = drift.approved
            yield f"  approved: {a.file}:{a.lines[0]}-{a.lines[1]} (torch {', '.join(a.approved_on)})", {}
        if drift.current is not None:
            yield f"  current:  {drift.current.location}-{drift.current.end}", {}
        elif drift.error is not None and drift.error.where:
            yield f"  current:  {drift.error.where}", {}
        for problem in drift.problems:
            yield f"  {problem}", {"yellow": True}
        for hint in drift.error.hints if drift.error else []:
            yield f"  hint: {hint}", {"cyan": True}
        if drift.diff:
            yield "", {}
            for line in drift.diff.rstrip("\n").split("\n"):
                added, removed = (
                    line.startswith("+") and not line.startswith("+++"),
                    line.startswith("-") and not line.startswith("---"),
                )
                yield line, {"green": added, "red": removed, "cyan": line.startswith("@@")}
        yield "", {}
        if drift.kind in (DriftKind.REMOVED, DriftKind.PATTERN_LOST):
            yield f"  fix the anchor at {item.where()} (or the notes above), re-read the guide, then approve:", {}
        elif drift.kind is DriftKind.UNAPPROVED:
            yield "  read the guide against this source, then approve it:", {}
        else:
            yield "  re-read the guide against the new source, then approve it:", {}
        for command in approve_commands(item.guide.id, _state(item.config).display(item.path)):
            yield f"    {command}", {"bold": True}

    def toterminal(self, tw: TerminalWriter) -> None:
        for text, markup in self.lines():
            tw.line(text, **markup)

    def __str__(self) -> str:
        return "\n".join(text for text, _ in self.lines())


class ClaimFailed(ItemProblem):
    pass


class ClaimItem(_GuideItem):
    def __init__(self, *, guide: Guide, claim: ClaimSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.guide = guide
        self.claim = claim
        self.line = claim.line
        self.add_marker(pytest.mark.world_size(claim.world_size))
        for marker in claim.markers:
            self.add_marker(getattr(pytest.mark, marker))

    def runtest(self) -> None:
        state = _state(self.config)
        if state.preview is not None:
            pytest.skip(PREVIEW_SKIP)
        workspace = self._workspace_or_fail()
        resolutions, failed = workspace.resolutions(self.guide)
        if failed:
            raise ClaimFailed(self._blocked(failed))
        request = ClaimRequest(
            target=self.claim.check,
            kwargs=self.guide.claim_kwargs(self.claim),
            world_size=self.claim.world_size,
            trace=trace_symbols(self.guide, resolutions),
            timeout=self.claim.timeout,
        )
        try:
            outcome: CheckOutcome = state.runner().run(request)
        except RankPoolUnavailable as exc:
            raise ClaimFailed(self._header("cannot run") + f"\n{exc}") from None
        if outcome.skipped:
            pytest.skip(outcome.skipped)
        executed = frozenset(outcome.executed or ())
        self.user_properties.append(("executed", sorted(executed)))
        if not outcome.ok:
            raise ClaimFailed(self._header("failed") + "\n" + (outcome.failure or "the check failed without a report"))
        missing = missing_evidence(self.claim, self.guide, resolutions, executed)
        if missing:
            raise ClaimFailed(self._header("failed") + "\n" + missing)

    def _header(self, verb: str) -> str:
        kwargs = ", ".join(f"{k}={v!r}" for k, v in self.claim.kwargs.items())
        return (
            f"{self.where()}: claim `{self.claim.id}` {verb}\n"
            f"  statement: {self.claim.statement}\n"
            f"  check:     {self.claim.check}({kwargs}) on {self.claim.world_size} rank(s)"
        )

    def _blocked(self, failed: dict[str, AnchorError]) -> str:
        lines = [self._header("cannot run: the guide's anchors do not resolve in this torch")]
        display = _state(self.config).display(self.path)
        for name, error in failed.items():
            anchor = self.guide.anchor(name)
            lines.append(f"  anchor `{name}` ({display}:{anchor.line}) {error.kind}: {error.message}")
            lines += [f"    hint: {hint}" for hint in error.hints]
        return "\n".join(lines)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str | TerminalRepr:
        if isinstance(excinfo.value, ClaimFailed):
            return str(excinfo.value)
        header = self._header("raised while running its check")
        return header + "\n" + str(super().repr_failure(excinfo, style=style))


# --- reporting ----------------------------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report: pytest.TestReport = yield
    state = item.config.stash.get(STATE, None)
    if (
        state is not None
        and report.nodeid in state.items
        and (report.when == "call" or (report.when == "setup" and not report.passed))
    ):
        _record(state, report)
    return report


def _record(state: ReaderState, report: pytest.TestReport) -> None:
    guide, kind, name = state.items[report.nodeid]
    row = state.report.guide(guide.id, state.display(guide.path), guide.title)
    outcome = "passed" if report.passed else "skipped" if report.skipped else "failed"
    message = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2])
    elif report.failed:
        message = report.longreprtext.strip().split("\n")[0]
    if kind == "anchor":
        if report.nodeid in state.approved_items and report.passed:
            outcome = "approved"
        row.anchors.append(
            AnchorRow(name, guide.anchor(name).symbol, outcome, state.drifts.get(report.nodeid), message)
        )
    else:
        claim = next(c for c in guide.claims if c.id == name)
        row.claims.append(ClaimRow(name, claim.statement, outcome, message))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(STATE, None)
    if state is None:
        return
    if state.approve_ids is not None:
        collected = {g.id for g in state.registry.guides.values()}
        for unknown in sorted(state.approve_ids - collected - {"*"}):
            known = ", ".join(sorted(collected)) or "none"
            state.broken[f"--approve={unknown}"] = (
                f"--approve={unknown}: no collected guide has this id (collected: {known})"
            )
        if state.opened is not None:
            for guide in state.registry.guides.values():
                anchors = [n for n, (g, kind, _) in state.items.items() if g is guide and kind == "anchor"]
                if state.approving(guide.id) and anchors and all(n in state.approved_items for n in anchors):
                    state.opened.prune(guide)
            state.opened.save()
    state.report.broken = list(state.broken.values())
    if state.lock_error is not None:
        state.report.broken.append(str(state.lock_error))
    if (state.broken or state.lock_error) and session.exitstatus in (
        pytest.ExitCode.OK,
        pytest.ExitCode.TESTS_FAILED,
        pytest.ExitCode.NO_TESTS_COLLECTED,
    ):
        session.exitstatus = BROKEN_INPUT
    state.report.exit_code = int(session.exitstatus)
    if state.report_path:
        state.written = write_drift_report(Path(state.report_path), state.report)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None or not (state.report.guides or state.broken):
        return
    writer = config.get_terminal_writer()
    console = Console(
        file=io.StringIO(),
        force_terminal=writer.hasmarkup,
        no_color=not writer.hasmarkup,
        width=max(writer.fullwidth, 60),
        highlight=False,
        soft_wrap=True,  # paths in the heading are printed whole, never cropped
    )
    console.print(summary(state.report))
    terminalreporter.write_sep("=", "reading guides")
    terminalreporter.write(console.file.getvalue())
    for key in [k for k in state.broken if k.startswith("--approve=")]:
        terminalreporter.write_line(state.broken[key], red=True)
    if state.written:
        json_path, md_path = state.written
        terminalreporter.write_line(f"drift report: {state.display(json_path)}, {state.display(md_path)}")
