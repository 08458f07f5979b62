"""The ``[[anchors]]`` and ``[[claims]]`` tables of a guide's front matter → `AnchorSpec` and `ClaimSpec`.

Each table is checked field by field and every problem is recorded at its line (``reader.format.toml_fields``);
a table with a problem yields no spec, the others still do, so the author sees every mistake in one pass.
"""

from __future__ import annotations

import re
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from reader.format.errors import anchor_fix
from reader.format.guide import VIEWS, AnchorSpec, ClaimSpec, ExpectedFailure, PropertySpec
from reader.format.toml_fields import Fields, is_table_list
from reader.source.checkref import CHECK_RE, CheckFinder
from reader.source.patterns import PatternError, pattern_tokens

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
CLAIM_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MARKER_RE = re.compile(r"^[A-Za-z_]\w*$")
SYMBOL_RE = re.compile(r"^torch(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.([A-Za-z_]\w*|<locals>))*$")

ANCHOR_KEYS = ("name", "symbol", "pattern", "torch")
CLAIM_KEYS = (
    "id", "statement", "check", "kwargs", "world_size", "markers", "evidence", "timeout", "xfail", "property", "torch",
    "views",
    "backend",
)  # fmt: skip
CLAIM_BACKENDS = ("gloo", "nccl")
PROPERTY_KEYS = ("draw", "examples")
MAX_EXAMPLES = 1000
XFAIL_KEYS = ("strict", "reason", "issue", "fails_with")
REASON_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")  # a `Violation` reason: kebab-case
ISSUE_RE = re.compile(r"^https://\S+$")
XFAIL_EXAMPLE = (
    'xfail = { strict = true, reason = "pytorch#154888: ...", '
    'issue = "https://github.com/pytorch/pytorch/issues/154888", fails_with = "replicas-not-synced" }'
)


def anchor_specs(fields: Fields, raw: Any) -> tuple[list[AnchorSpec], set[str]]:
    """The valid anchors of ``[[anchors]]``, and every name written there (valid or not: directives are checked
    against those, so one bad symbol does not cascade)."""
    if not is_table_list(raw):
        fields.add(
            ("anchors",),
            "`anchors` must be an array of tables",
            "write each anchor as\n"
            '        [[anchors]]\n        name = "short-name"\n'
            '        symbol = "torch.module.path:Qual.name"',
        )
        return [], set()
    found: list[AnchorSpec] = []
    seen: dict[str, int] = {}
    declared = {t["name"] for t in raw if isinstance(t.get("name"), str)}
    for i, table in enumerate(raw):
        at = ("anchors", i)
        fields.unknown_keys(table, ANCHOR_KEYS, at, "[[anchors]]")
        name = fields.string(
            table,
            "name",
            at,
            'name = "prefetch"',
            (NAME_RE, "a letter or `_`, then letters, digits, `_`, `-`, `.`"),
        )
        symbol = fields.string(table, "symbol", at, 'symbol = "torch.distributed.fsdp._runtime_utils:_prefetch_handle"')
        if symbol is not None and not SYMBOL_RE.match(symbol):
            fields.add((*at, "symbol"), f"unknown anchor syntax `{symbol}`", _symbol_fix(symbol))
            symbol = None
        pattern = table.get("pattern")
        if pattern is not None:
            if not isinstance(pattern, str) or not pattern.strip():
                fields.add(
                    (*at, "pattern"),
                    "`pattern` must be a non-empty string of code",
                    "write the exact code of one statement inside the anchor, or remove `pattern`",
                )
                pattern = None
            else:
                pattern = _pattern(fields, pattern, (*at, "pattern"))
        versions = _torch_spec(fields, table["torch"], (*at, "torch")) if "torch" in table else None
        if name is not None and name in seen:
            fields.add(
                (*at, "name"),
                f"duplicate anchor name `{name}` (first on line {seen[name]})",
                "give every anchor of a guide its own name",
            )
        elif name is not None and symbol is not None:
            seen[name] = fields.line(*at, "name")
            found.append(AnchorSpec(name, symbol, pattern, fields.line(*at), versions))
    return found, declared


def claim_specs(
    fields: Fields, raw: Any, anchors: list[AnchorSpec], declared: set[str], checks: CheckFinder | None
) -> list[ClaimSpec]:
    """The valid claims of ``[[claims]]``; ``checks`` (when given) confirms each check function exists."""
    if not is_table_list(raw):
        fields.add(
            ("claims",),
            "`claims` must be an array of tables",
            "write each claim as\n        [[claims]]\n"
            '        id = "short-id"\n        statement = "One sentence."\n'
            '        check = "checks.module:fn"\n        world_size = 2',
        )
        return []
    names = declared
    valid = {a.name for a in anchors}
    scoped_anchors = {a.name: str(a.torch) for a in anchors if a.torch is not None}
    found: list[ClaimSpec] = []
    seen: dict[str, int] = {}
    for i, table in enumerate(raw):
        at = ("claims", i)
        fields.unknown_keys(table, CLAIM_KEYS, at, "[[claims]]")
        cid = fields.string(
            table,
            "id",
            at,
            'id = "backward-pre-order"',
            (CLAIM_ID_RE, "letters, digits, `-`, `_`, `.`; stable: item ids and reports use it"),
        )
        statement = fields.string(table, "statement", at, 'statement = "One sentence the check proves."')
        check = fields.string(
            table, "check", at, 'check = "checks.guides.g04_forward_prefetch:no_prefetch_in_iteration_1"'
        )
        if check is not None and not CHECK_RE.match(check):
            fields.add(
                (*at, "check"),
                f'`check = "{check}"` is not `module:function`',
                'write it as `check = "checks.guides.g04_forward_prefetch:no_prefetch_in_iteration_1"`',
            )
            check = None
        elif check is not None and checks is not None:
            missing = checks.problem(check)
            if missing:
                fields.add((*at, "check"), *missing)
                check = None
        kwargs = table.get("kwargs", {})
        if not isinstance(kwargs, dict):
            fields.add((*at, "kwargs"), "`kwargs` must be a table", 'write `kwargs = { mode = "BACKWARD_PRE" }`')
            kwargs = {}
        world_size = table.get("world_size")
        if world_size is None:
            fields.add(at, "missing `world_size`", "add `world_size = 2` (the number of ranks the check runs on)")
        elif type(world_size) is not int or world_size < 1:
            fields.add(
                (*at, "world_size"),
                f"`world_size` must be a positive integer, not {world_size!r}",
                "write `world_size = 2`",
            )
            world_size = None
        markers = _markers(fields, table.get("markers", []), (*at, "markers"))
        evidence = tuple(
            n for n in _evidence(fields, table.get("evidence", []), (*at, "evidence"), names) if n in valid
        )
        timeout = table.get("timeout")
        if timeout is not None and (type(timeout) not in (int, float) or timeout <= 0):
            fields.add(
                (*at, "timeout"),
                f"`timeout` must be a positive number of seconds, not {timeout!r}",
                "write `timeout = 120`, or remove it to use the pool's default",
            )
            timeout = None
        xfail = _xfail(fields, table["xfail"], (*at, "xfail")) if "xfail" in table else None
        drawn = _property(fields, table["property"], (*at, "property"), checks) if "property" in table else None
        if drawn is not None and "example" in kwargs:
            fields.add((*at, "kwargs"), "`example` is the drawn value a property passes", "rename that kwarg")
        versions = _torch_spec(fields, table["torch"], (*at, "torch")) if "torch" in table else None
        written_for = _claim_backends(fields, table["backend"], (*at, "backend")) if "backend" in table else ()
        views = _views(fields, table.get("views", []), (*at, "views"))
        scoped = [n for n in evidence if n in scoped_anchors]
        if versions is None and evidence and len(scoped) == len(evidence):
            fields.add(
                (*at, "evidence"),
                f"every evidence anchor of this claim is scoped to some torch releases ({', '.join(scoped)}), "
                "but the claim is not: elsewhere it would have nothing to prove",
                f'give the claim the same range (`torch = "{scoped_anchors[scoped[0]]}"`), or name an anchor '
                "every release has",
            )
        if cid is not None and cid in seen:
            fields.add(
                (*at, "id"),
                f"duplicate claim id `{cid}` (first on line {seen[cid]})",
                "give every claim of a guide its own id",
            )
        elif None not in (cid, statement, check, world_size):
            assert cid is not None and statement is not None and check is not None and world_size is not None
            seen[cid] = fields.line(*at, "id")
            found.append(
                ClaimSpec(
                    cid,
                    statement,
                    check,
                    kwargs,
                    world_size,
                    markers,
                    evidence,
                    float(timeout) if timeout is not None else None,
                    fields.line(*at),
                    xfail,
                    drawn,
                    versions,
                    written_for,
                    views,
                )
            )
    return found


def _views(fields: Fields, raw: Any, at: tuple[Any, ...]) -> tuple[str, ...]:
    """``views = ["timeline", "memory"]``: each one of `VIEWS`, once, in that order."""
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        fields.add(at, "`views` must be a list of view names", f"write `views = [{', '.join(map(repr, VIEWS))}]`")
        return ()
    unknown = [v for v in raw if v not in VIEWS]
    if unknown or len(set(raw)) != len(raw):
        what = f"unknown view(s) {', '.join(unknown)}" if unknown else "a view named twice"
        fields.add(at, f"`views`: {what}", f"use each of {', '.join(VIEWS)} at most once")
        return ()
    return tuple(v for v in VIEWS if v in raw)


def _xfail(fields: Fields, raw: Any, at: tuple[Any, ...]) -> ExpectedFailure | None:
    """``xfail = { strict, reason, issue, fails_with }``: every field but ``strict`` (default true) is required,
    because an expected failure that names no issue cannot be re-checked, and one that accepts any failure
    would hide a crash."""
    if not isinstance(raw, dict):
        fields.add(at, "`xfail` must be a table", f"write `{XFAIL_EXAMPLE}`")
        return None
    fields.unknown_keys(raw, XFAIL_KEYS, at, "xfail")
    reason = fields.string(raw, "reason", at, 'reason = "pytorch#154888: one line on why it fails today"')
    issue = fields.string(raw, "issue", at, 'issue = "https://github.com/pytorch/pytorch/issues/154888"')
    if issue is not None and not ISSUE_RE.match(issue):
        fields.add((*at, "issue"), f"`issue = {issue!r}` is not a URL", "link the tracking issue: `https://...`")
        issue = None
    fails_with = fields.string(
        raw,
        "fails_with",
        at,
        'fails_with = "replicas-not-synced"',
        (REASON_RE, "the kebab-case `Violation` reason the check raises while the bug is there"),
    )
    strict = raw.get("strict", True)
    if type(strict) is not bool:
        fields.add((*at, "strict"), f"`strict` must be true or false, not {strict!r}", "write `strict = true`")
        return None
    if None in (reason, issue, fails_with):
        return None
    assert reason is not None and issue is not None and fails_with is not None
    return ExpectedFailure(reason, issue, fails_with, strict)


def _property(fields: Fields, raw: Any, at: tuple[Any, ...], checks: CheckFinder | None) -> PropertySpec | None:
    """``property = { draw = "module:function", examples = N }``."""
    example = 'property = { draw = "checks.models.flat_param_draws:units", examples = 12 }'
    if not isinstance(raw, dict):
        fields.add(at, "`property` must be a table", f"write `{example}`")
        return None
    fields.unknown_keys(raw, PROPERTY_KEYS, at, "property")
    draw = fields.string(raw, "draw", at, 'draw = "checks.models.flat_param_draws:units"')
    if draw is not None and not CHECK_RE.match(draw):
        fields.add((*at, "draw"), f'`draw = "{draw}"` is not `module:function`', f"write `{example}`")
        draw = None
    elif draw is not None and checks is not None:
        missing = checks.problem(draw)
        if missing:
            fields.add((*at, "draw"), *missing)
            draw = None
    examples = raw.get("examples")
    if type(examples) is not int or not 1 <= examples <= MAX_EXAMPLES:
        fields.add(
            (*at, "examples"),
            f"`examples` must be an integer from 1 to {MAX_EXAMPLES}, not {examples!r}",
            "write `examples = 12` (each example is one run on the pool; put larger runs behind `slow`)",
        )
        return None
    return PropertySpec(draw, examples) if draw is not None else None


def _claim_backends(fields: Fields, raw: Any, at: tuple[Any, ...]) -> tuple[str, ...]:
    """``backend = "gloo"`` (or a list): a run on another backend is skipped with the reason."""
    named = [raw] if isinstance(raw, str) else raw
    if not isinstance(named, list) or not named or not all(b in CLAIM_BACKENDS for b in named):
        fields.add(at, f"`backend` must name {' or '.join(CLAIM_BACKENDS)}, not {raw!r}",
                   'write `backend = "gloo"` for a claim about gloo, or remove it')  # fmt: skip
        return ()
    return tuple(named)


def _torch_spec(fields: Fields, raw: Any, at: tuple[Any, ...]) -> SpecifierSet | None:
    """A table's ``torch = "<spec>"``: the releases a claim describes, or an anchor's code exists on."""
    fix = 'write a specifier such as `torch = "<2.14.1"` or `torch = ">=2.14.1"`'
    if not isinstance(raw, str) or not raw.strip():
        fields.add(at, "`torch` must be a PEP 440 version specifier string", fix)
        return None
    try:
        return SpecifierSet(raw)
    except InvalidSpecifier:
        fields.add(at, f'`torch = "{raw}"` is not a PEP 440 version specifier', fix)
        return None


def _markers(fields: Fields, raw: Any, at: tuple[Any, ...]) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(m, str) and MARKER_RE.match(m) for m in raw):
        fields.add(
            at,
            "`markers` must be a list of marker names",
            'write `markers = ["slow"]` or `markers = ["gpu", "slow"]`',
        )
        return ()
    if "world_size" in raw:
        fields.add(
            at,
            "`world_size` is not set through `markers`",
            "remove it from `markers`; `world_size = n` adds the world_size(n) marker",
        )
        return ()
    return tuple(raw)


def _evidence(fields: Fields, raw: Any, at: tuple[Any, ...], names: set[str]) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        fields.add(at, "`evidence` must be a list of anchor names", 'write `evidence = ["prefetch"]`')
        return ()
    unknown = [n for n in raw if n not in names]
    for name in unknown:
        fields.add(at, f"`evidence` names `{name}`, which is not an anchor of this guide", anchor_fix(name, names))
    return tuple(raw)


def _pattern(fields: Fields, pattern: str, at: tuple[Any, ...] | int) -> str | None:
    try:
        pattern_tokens(pattern)
    except PatternError as exc:
        fields.add(
            at,
            f"pattern `{pattern}` is not Python code: {exc}",
            "copy the code exactly from torch's source (comments are ignored)",
        )
        return None
    return pattern


def _symbol_fix(symbol: str) -> str:
    if ":" not in symbol and "." in symbol:
        module, _, name = symbol.rpartition(".")
        return f"separate module and name with `:`, e.g. `{module}:{name}` (for a method: `module:Class.method`)"
    if not symbol.startswith("torch"):
        return (
            "anchors read torch's own source: the symbol must start with `torch.`, e.g. "
            "`torch.distributed.fsdp._flat_param:FlatParamHandle.unshard`"
        )
    return "write `package.module:Name`, `package.module:Class.method` or `package.module:outer.<locals>.inner`"
