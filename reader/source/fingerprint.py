"""Fingerprints of an anchor's source text, computed from the text alone.

- ``exact``: SHA-256 of the text as it stands (comments, formatting, everything).
- ``normalized``: SHA-256 of the AST with docstrings and type annotations removed. An AST has no comments,
  blank lines, parentheses, trailing commas, quote styles or line breaks, but it does keep block structure:
  moving a statement out of an ``if`` changes it (an indentation-stripping text hash would miss exactly that).
- ``annotations``: SHA-256 of every annotation in order, so annotation-only edits get their own drift class.
- ``signature``: SHA-256 of a def's name and parameters (names, kinds, defaults; no annotations), or a class's
  name and bases, so "the call changed" is told apart from "the body changed". None for other statements.

Because fingerprints derive from text, the lock's approved source can be re-fingerprinted whenever
``ALGORITHM`` changes; stored fingerprints are never trusted across algorithm versions.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import asdict, dataclass

ALGORITHM = 1


@dataclass(frozen=True)
class Fingerprints:
    exact: str
    normalized: str
    annotations: str
    signature: str | None

    def cosmetic_to(self, other: Fingerprints) -> bool:
        """The same code and annotations: only comments, docstrings or formatting may differ."""
        return self.normalized == other.normalized and self.annotations == other.annotations

    def to_json(self) -> dict[str, str | None]:
        return asdict(self)


class SnippetSyntaxError(ValueError):
    pass


def fingerprint(text: str) -> Fingerprints:
    # Two parses instead of a deepcopy: parsing a snippet is about three times cheaper than copying its tree.
    normalized = [_Normalizer().visit(s) for s in parse_snippet(text)]
    return Fingerprints(
        exact=_sha(_with_final_newline(text)),
        normalized=_sha(ast.dump(ast.Module(body=normalized, type_ignores=[]))),
        annotations=_sha(repr(_annotations(parse_snippet(text)))),
        signature=_signature(normalized),
    )


def normalize(text: str) -> str:
    """The normalized code itself (what ``normalized`` hashes), for people and property tests."""
    statements = [_Normalizer().visit(s) for s in parse_snippet(text)]
    return ast.unparse(ast.fix_missing_locations(ast.Module(body=statements, type_ignores=[]))) + "\n"


def parse_snippet(text: str) -> list[ast.stmt]:
    """Parse an anchor's text: a top-level or indented definition, or one statement cut out of a block.
    Line numbers in the result are the snippet's own (1-based).

    An indented snippet is parsed under ``if True:`` rather than dedented, because dedenting rewrites the
    contents of multi-line strings whose lines are less indented. A snippet cut at an ``elif`` is parsed as
    ``if``.
    """
    lines = text.split("\n")
    code_lines = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not code_lines:
        raise SnippetSyntaxError("no code")
    head = code_lines[0]
    indented = head[: len(head) - len(head.lstrip())] != ""
    if head.lstrip().startswith("elif "):
        index = lines.index(head)
        lines[index] = head.replace("elif ", "if ", 1)
    source = "\n".join(lines)
    try:
        tree = ast.parse("if True:\n" + source if indented else source)
    except SyntaxError as exc:
        raise SnippetSyntaxError(f"{exc.msg} (snippet line {(exc.lineno or 1) - indented})") from exc
    if indented:
        ast.increment_lineno(tree, -1)  # line numbers refer to the snippet's own lines
        body = tree.body[0]
        assert isinstance(body, ast.If)
        return body.body
    return tree.body


class _Normalizer(ast.NodeTransformer):
    """Drop docstrings and annotations; keep every other node (and so the block structure)."""

    def _strip_docstring(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        # Leading string statements are all removed so that normalizing twice is the same as once.
        while node.body and _is_docstring(node.body[0]):
            node.body.pop(0)
        if not node.body:
            node.body.append(ast.Pass())

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        return self._function(node)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        self._strip_docstring(node)
        node.returns = None
        node.type_comment = None
        for arg in _all_args(node.args):
            arg.annotation = None
            arg.type_comment = None
        self.generic_visit(node)
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        self._strip_docstring(node)
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        self.generic_visit(node)
        if node.value is not None:  # `x: int = 1` is `x = 1` plus an annotation
            return ast.copy_location(ast.Assign(targets=[node.target], value=node.value, type_comment=None), node)
        # A bare declaration (dataclass field) stays, with its annotation erased.
        node.annotation = ast.Constant(value=Ellipsis)
        return node


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _all_args(args: ast.arguments) -> list[ast.arg]:
    found = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    found += [a for a in (args.vararg, args.kwarg) if a is not None]
    return found


def _annotations(statements: list[ast.stmt]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for stmt in statements:
        for node in ast.walk(stmt):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [
                    (f"{node.name}({arg.arg})", ast.dump(arg.annotation))
                    for arg in _all_args(node.args)
                    if arg.annotation is not None
                ]
                if node.returns is not None:
                    found.append((f"{node.name}->", ast.dump(node.returns)))
            elif isinstance(node, ast.AnnAssign):
                found.append((ast.dump(node.target), ast.dump(node.annotation)))
    return found


def _signature(normalized: list[ast.stmt]) -> str | None:
    """From the normalized tree, whose parameters already carry no annotations."""
    if len(normalized) != 1:
        return None
    node = normalized[0]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        kind = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
        return _sha(f"{kind} {node.name} {ast.dump(node.args)}")
    if isinstance(node, ast.ClassDef):
        return _sha(f"class {node.name} {[ast.dump(b) for b in node.bases]} {[ast.dump(k) for k in node.keywords]}")
    return None


def _with_final_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
