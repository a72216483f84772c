"""Argument checks that fail early with one clear message naming the config key and the valid values."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def check_int_range(key: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """Return ``value`` as int if it is an integer in [low, high]; else raise ``ValueError`` naming ``key``."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if not is_int or (low is not None and value < low) or (high is not None and value > high):
        lo = "-inf" if low is None else str(low)
        hi = "inf" if high is None else str(high)
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}]; got {value!r}")
    return int(value)


def check_choice(key: str, value: Any, choices: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``; else raise ``ValueError`` listing them."""
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{key} must be one of {choices}; got {value!r}")
    return value
