"""Fingerprints: what each hash ignores and what it sees, as examples and as hypothesis properties."""

from __future__ import annotations

import ast
import io
import itertools
import keyword
import textwrap
import tokenize

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from reader.source.fingerprint import SnippetSyntaxError, fingerprint, normalize, parse_snippet

CORPUS = [
    textwrap.dedent('''\
        # Prefetch is issued from the hooks.
        @no_type_check
        def _prefetch_handle(state, current_handle: "FlatParamHandle | None", mode: int = 0) -> None:
            """Prefetch the next handle if needed."""
            if not current_handle:
                return
            handle = _get_handle_to_prefetch(state, current_handle)
            if not handle:
                return
            prev = handle._training_state
            _unshard(state, handle, state._unshard_stream, state._pre_unshard_stream)
            handle._training_state = prev
            handle._prefetched = True
        '''),
    textwrap.indent(
        textwrap.dedent('''\
        def unshard(self, *args: int, padded: bool = False, **kwargs) -> "Tensor":
            """Run the unshard logic.

            Multi-line docstring with a less indented line:
        see above.
            """
            unsharded = self._alloc_padded_unsharded_flat_param()
            padded_unsharded_flat_param = self._all_gather_flat_param(unsharded)
            for i, (a, b) in enumerate(zip(args, kwargs.values())):
                if i % 2 == 0 and a > b:
                    continue
                elif a is None:
                    break
                else:
                    padded = not padded
            self._use_unsharded_flat_param(padded_unsharded_flat_param)
            return [x * 2 for x in args if x] or {k: v for k, v in kwargs.items()}
        '''),
        "    ",
    ),
    textwrap.dedent('''\
        class ExecOrderData(Base, metaclass=Meta):
            """Tracks the execution order."""

            warn_status: int = 0
            handles_pre_forward_order: list[int]

            def __init__(self, debug_level: int, backward_prefetch_limit: int) -> None:
                self._checking_order = debug_level == 1
                self.limit = backward_prefetch_limit
                try:
                    with open("x") as f, lock:
                        data = f.read()
                except (OSError, ValueError) as exc:
                    raise RuntimeError(f"bad {exc!r}") from exc
                finally:
                    self.limit -= 1

            async def poll(self, timeout: float = 1.5):
                while await self.ready(timeout):
                    yield lambda x, y=3: (x + y) ** 2
        '''),
    "_PREFETCH_LIMIT: int = 2\n",
    "HOOKS, ORDER = (\n    'pre',\n    'post',\n), 3\n",
]


# --- examples -----------------------------------------------------------------------------------------------


def test_comments_docstrings_blank_lines_and_formatting_are_cosmetic():
    base = CORPUS[0]
    reformatted = (
        base.replace("# Prefetch is issued from the hooks.\n", "")
        .replace('    """Prefetch the next handle if needed."""\n', '    """Rewritten docs."""\n\n')
        .replace(
            "_unshard(state, handle, state._unshard_stream, state._pre_unshard_stream)",
            "_unshard(\n        state,\n        handle,\n"
            "        state._unshard_stream,\n        state._pre_unshard_stream,\n    )  # c",
        )
    )
    a, b = fingerprint(base), fingerprint(reformatted)
    assert a.exact != b.exact
    assert (a.normalized, a.annotations, a.signature) == (b.normalized, b.annotations, b.signature)


def test_annotations_are_hashed_separately():
    a = fingerprint(CORPUS[0])
    b = fingerprint(CORPUS[0].replace('current_handle: "FlatParamHandle | None"', "current_handle: Handle"))
    assert a.normalized == b.normalized and a.signature == b.signature
    assert a.annotations != b.annotations
    added = fingerprint("x: int = 1\n")
    assert added.normalized == fingerprint("x = 1\n").normalized
    assert added.annotations != fingerprint("x = 1\n").annotations


def test_signature_separates_parameter_changes_from_body_changes():
    a = fingerprint(CORPUS[0])
    body = fingerprint(CORPUS[0].replace("handle._prefetched = True", "handle._prefetched = False"))
    param = fingerprint(CORPUS[0].replace("mode: int = 0", "mode: int = 1"))
    assert body.normalized != a.normalized and body.signature == a.signature
    assert param.signature != a.signature
    klass = fingerprint(CORPUS[2])
    assert fingerprint(CORPUS[2].replace("(Base, metaclass=Meta)", "(Base)")).signature != klass.signature
    assert fingerprint(CORPUS[3]).signature is None


def test_block_structure_is_kept():
    """Moving a statement out of its block changes the normalized hash (an indentation-blind hash would
    not)."""
    inside = "def f(x):\n    if x:\n        a()\n        b()\n"
    outside = "def f(x):\n    if x:\n        a()\n    b()\n"
    assert fingerprint(inside).normalized != fingerprint(outside).normalized


def test_indented_and_elif_snippets_parse():
    assert isinstance(parse_snippet(CORPUS[1])[0], ast.FunctionDef)
    assert isinstance(parse_snippet("        elif x:\n            y = 1\n")[0], ast.If)
    assert parse_snippet("    # comment\n    x = 1\n")[0].lineno == 2
    with pytest.raises(SnippetSyntaxError):
        parse_snippet("def broken(:\n")
    with pytest.raises(SnippetSyntaxError):
        parse_snippet("# only a comment\n")


def test_normalize_drops_docstrings_and_annotations():
    assert normalize(CORPUS[0]).startswith("@no_type_check\ndef _prefetch_handle(state, current_handle, mode=0):\n")
    assert '"""' not in normalize(CORPUS[1])
    assert normalize('def f():\n    """only a docstring"""\n') == "def f():\n    pass\n"


# --- properties ---------------------------------------------------------------------------------------------

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEXT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz ,.:()[]-_0123456789", min_size=0, max_size=30)


def _tokens(source: str) -> list[tokenize.TokenInfo]:
    return list(tokenize.generate_tokens(io.StringIO(source).readline))


def _offset(source: str, position: tuple[int, int]) -> int:
    lines = source.split("\n")
    return sum(len(line) + 1 for line in lines[: position[0] - 1]) + position[1]


def _docstring_nodes(source: str) -> list[ast.Constant]:
    found = []
    for node in ast.walk(ast.parse("if True:\n" + source if source[0] in " \t" else source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.append(first.value)
    return found


def _docstring_token_starts(source: str) -> set[tuple[int, int]]:
    shift = 1 if source[0] in " \t" else 0
    return {(n.lineno - shift, n.col_offset) for n in _docstring_nodes(source)}


@st.composite
def cosmetic_edit(draw: st.DrawFn, source: str) -> str:
    """One edit of comments, docstrings or whitespace, at a position where it cannot change the code."""
    tokens = _tokens(source)
    kind = draw(st.sampled_from(["comment_line", "trailing_comment", "blank_line", "space", "wrap", "docstring"]))
    pick = draw(st.integers(min_value=0, max_value=10_000))
    text = draw(TEXT)
    if kind in ("comment_line", "blank_line"):
        ends = [t for t in tokens if t.type in (tokenize.NEWLINE, tokenize.NL)]
        at = _offset(source, ends[pick % len(ends)].end) if ends[pick % len(ends)].string else None
        if at is None:
            return source
        indent = " " * draw(st.integers(min_value=0, max_value=12))
        insert = f"{indent}# {text}\n" if kind == "comment_line" else "\n"
        return source[:at] + insert + source[at:]
    if kind == "trailing_comment":
        ends = [t for t in tokens if t.type in (tokenize.NEWLINE, tokenize.NL) and t.string]
        at = _offset(source, ends[pick % len(ends)].start)
        return source[:at] + f"  # {text}" + source[at:]
    if kind in ("space", "wrap"):
        depth = 0
        candidates = []
        for left, right in itertools.pairwise(tokens):
            if left.type == tokenize.OP and left.string in "([{":
                depth += 1
            elif left.type == tokenize.OP and left.string in ")]}":
                depth -= 1
            same_line = left.end[0] == right.start[0] and right.type not in (
                tokenize.NEWLINE,
                tokenize.NL,
                tokenize.COMMENT,
            )
            if same_line and left.type not in (tokenize.INDENT, tokenize.DEDENT) and (kind == "space" or depth):
                candidates.append(left.end)
        if not candidates:
            return source
        at = _offset(source, candidates[pick % len(candidates)])
        filler = " " if kind == "space" else "\n" + " " * draw(st.integers(min_value=0, max_value=16))
        return source[:at] + filler + source[at:]
    docstrings = [t for t in tokens if t.type == tokenize.STRING and t.start in _docstring_token_starts(source)]
    if not docstrings:
        return source
    token = docstrings[pick % len(docstrings)]
    start, end = _offset(source, token.start), _offset(source, token.end)
    return source[:start] + f'"""{text.strip() or "doc"}"""' + source[end:]


@st.composite
def edited(draw: st.DrawFn) -> tuple[str, str]:
    source = draw(st.sampled_from(CORPUS))
    current = source
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        current = draw(cosmetic_edit(current))
    return source, current


@PROPERTY
@given(edited())
def test_normalization_is_idempotent(pair: tuple[str, str]):
    source = pair[1]
    once = normalize(source)
    assert normalize(once) == once
    assert fingerprint(once).normalized == fingerprint(source).normalized


@PROPERTY
@given(edited())
def test_cosmetic_edits_never_change_the_normalized_fingerprint(pair: tuple[str, str]):
    original, changed = pair
    ast.parse("if True:\n" + changed if changed[0] in " \t" else changed)  # the edit kept it valid Python
    before, after = fingerprint(original), fingerprint(changed)
    assert after.normalized == before.normalized
    assert after.annotations == before.annotations
    assert after.signature == before.signature


def _annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    shift = 1 if source[0] in " \t" else 0
    tree = ast.parse("if True:\n" + source if shift else source)
    spans = []
    for node in ast.walk(tree):
        annotations = []
        if isinstance(node, ast.arg) and node.annotation is not None:
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        spans += [((a.lineno - shift, a.col_offset), (a.end_lineno - shift, a.end_col_offset)) for a in annotations]
    return spans


def _code_tokens(source: str) -> list[tokenize.TokenInfo]:
    docstrings = _docstring_token_starts(source)
    annotations = _annotation_spans(source)
    found = []
    for token in _tokens(source):
        if any(start <= token.start and token.end <= end for start, end in annotations):
            continue
        if (
            (
                token.type == tokenize.NAME
                and not keyword.iskeyword(token.string)
                and token.string not in ("match", "case", "type", "_")
            )
            or token.type == tokenize.NUMBER
            or (token.type == tokenize.STRING and token.start not in docstrings)
            or (token.type == tokenize.OP and token.string in ("+", "-", "*", "<", ">", "==", "%"))
        ):
            found.append(token)
    return found


SWAP = {"+": "-", "-": "+", "*": "//", "<": ">", ">": "<", "==": "!=", "%": "//"}


def _changed_token(token: tokenize.TokenInfo) -> str:
    if token.type == tokenize.NAME:
        return token.string + "_renamed"
    if token.type == tokenize.NUMBER:
        return repr(ast.literal_eval(token.string) + 1)
    if token.type == tokenize.STRING:
        quote = token.string[-3:] if token.string.endswith(('"""', "'''")) else token.string[-1]
        return token.string[: -len(quote)] + "z" + quote
    return SWAP[token.string]


@PROPERTY
@given(st.sampled_from(CORPUS), st.integers(min_value=0, max_value=10_000))
def test_a_single_token_code_change_always_changes_the_normalized_fingerprint(source: str, pick: int):
    tokens = _code_tokens(source)
    token = tokens[pick % len(tokens)]
    start, end = _offset(source, token.start), _offset(source, token.end)
    changed = source[:start] + _changed_token(token) + source[end:]
    try:
        parse_snippet(changed)
    except SnippetSyntaxError:
        assume(False)  # e.g. `%` → `//` inside an f-string spec; not a code change
    assert fingerprint(changed).normalized != fingerprint(source).normalized, (token, changed)
