"""Config checks: one home for "is this value valid?", one message format for every failure.

Every check raises ``ValueError`` with ``<key> must be <what>; got <value!r>``, where ``key`` is the full
config key as a Hydra override would spell it (``canonicalization.dropout``, ``prediction.width``,
``model.label_smoothing``), or a plain argument name where a value comes from code rather than a config.
A passing value is returned in its normalised type (``int``, ``float``, ``bool``), so a check can sit in an
assignment. bools are not numbers here: ``num_layers=true`` is a config typo, not 1. With ``optional=True``
``None`` (a config's ``null``) passes through and the message says "null or …".
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def _fail(key: str, what: str, value: Any, optional: bool = False) -> None:
    raise ValueError(f"{key} must be {'null or ' if optional else ''}{what}; got {value!r}")


def _fmt(bound: float) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def _range(low: float | None, high: float | None, low_inclusive: bool, high_inclusive: bool) -> str:
    """`` >= 1``, `` > 0``, `` <= 3``, `` in [0, 1)`` or nothing."""
    if low is not None and high is not None:
        return f" in {'[' if low_inclusive else '('}{_fmt(low)}, {_fmt(high)}{']' if high_inclusive else ')'}"
    if low is not None:
        return f" {'>=' if low_inclusive else '>'} {_fmt(low)}"
    if high is not None:
        return f" {'<=' if high_inclusive else '<'} {_fmt(high)}"
    return ""


def _in_range(value: float, low: float | None, high: float | None, low_inclusive: bool, high_inclusive: bool) -> bool:
    # written so that NaN is in no range with a bound
    if low is not None and not (value >= low if low_inclusive else value > low):
        return False
    return high is None or (value <= high if high_inclusive else value < high)


def check_int(key: str, value: Any, low: int | None = None, high: int | None = None, *,
              optional: bool = False) -> int | None:
    """``value`` as int if it is an integer in [low, high] (either bound may be None); else ``ValueError``."""
    if optional and value is None:
        return None
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if not is_int or not _in_range(value, low, high, True, True):
        _fail(key, "an integer" + _range(low, high, True, True), value, optional)
    return int(value)


def check_number(key: str, value: Any, low: float | None = None, high: float | None = None, *,
                 low_inclusive: bool = True, high_inclusive: bool = True, finite: bool = False,
                 optional: bool = False) -> float | None:
    """``value`` as float if it is a real number (int or float, not bool) in the range; else ``ValueError``.

    ``finite=True`` also rejects ±inf and NaN; a bounded range never holds NaN.
    """
    if optional and value is None:
        return None
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if (not is_number or not _in_range(value, low, high, low_inclusive, high_inclusive)
            or (finite and not math.isfinite(value))):
        what = ("a finite number" if finite else "a number") + _range(low, high, low_inclusive, high_inclusive)
        _fail(key, what, value, optional)
    return float(value)


def check_positive(key: str, value: Any, *, optional: bool = False) -> float | None:
    """A number > 0 (learning rates, widths, temperatures, step sizes)."""
    return check_number(key, value, low=0, low_inclusive=False, optional=optional)


def check_fraction(key: str, value: Any) -> float:
    """A number in [0, 1) (dropout rates, leaky-ReLU slopes, label smoothing, intensity thresholds)."""
    return check_number(key, value, low=0, high=1, high_inclusive=False)


def check_bool(key: str, value: Any) -> bool:
    """``value`` if it is a bool; else ``ValueError`` (1 and "true" are not bools)."""
    if not isinstance(value, bool):
        _fail(key, "true or false", value)
    return value


def check_choice(key: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices``; else ``ValueError`` listing them."""
    choices = list(choices)
    if value not in choices:
        _fail(key, f"one of {choices}", value)
    return value


class ConfigError(ValueError):
    """A composed config that cannot run; raised before anything is built or written."""
