"""A ratio as the guide writes it (``3/2``, ``1``): how the checks word a figure they compare with a row."""

from __future__ import annotations

from fractions import Fraction


def ratio(value: Fraction) -> str:
    """``3/2``, or ``1`` for a whole number: a ratio as the guide writes it."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
