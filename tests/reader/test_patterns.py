"""Code patterns match token sequences: robust to re-wrapping, blind to comments, exact about code."""

from __future__ import annotations

import pytest

from reader.source.patterns import PatternError, enclosing_statement, find, pattern_tokens

METHOD = """\
    # leading comment
    @no_type_check
    def prefetch(self, state):
        if state.x:
            _unshard(
                state, [handle],  # the all-gather
                True)
            handle._prefetched = True
        elif state.y:
            z = 1; w = 2
        return None
"""


def test_pattern_matches_across_line_breaks_and_spacing():
    (match,) = find(METHOD, "_unshard(state,[handle], True)")
    assert match.start == (5, 12) and match.end == (7, 21)
    assert enclosing_statement(METHOD, match) == (5, 7)


def test_comments_never_match_and_code_must_be_exact():
    assert find(METHOD, "the all-gather") == []
    assert find(METHOD, "handle._prefetched = False") == []
    assert len(find(METHOD, "handle._prefetched = True  # a comment in the pattern is ignored")) == 1


def test_innermost_statement_wins():
    (match,) = find(METHOD, "elif state.y")
    assert enclosing_statement(METHOD, match) == (9, 10)
    (match,) = find(METHOD, "w = 2")
    assert enclosing_statement(METHOD, match) == (10, 10)  # shares its line with `z = 1`
    (match,) = find(METHOD, "no_type_check")
    assert enclosing_statement(METHOD, match) == (2, 11)  # a decorator belongs to the def


def test_repeated_pattern_is_counted():
    assert len(find(METHOD, "state")) == 4


def test_unclosed_bracket_is_a_fine_prefix_but_junk_is_not():
    assert pattern_tokens("_unshard(") == ["_unshard", "("]
    with pytest.raises(PatternError):
        pattern_tokens('"unterminated')
    with pytest.raises(PatternError):
        pattern_tokens("   # only a comment")
