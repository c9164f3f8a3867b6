"""Values a caller hands in: the checks every API applies, JSON encoding and lone surrogates.

Owns: the validators (`check_count`, `check_number`, `check_id`, `check_scalar`, ...), the named
column rules (`COLUMN_RULES`) the data dictionary refers to, `shown` (a bad value quoted cut
short), and the JSON and surrogate helpers. Does not own: columns or tables
(hermes_state_common), any SQL. Imports only the standard library; hermes_state_common
re-exports every public name, so callers import them from there.
"""
from __future__ import annotations

import json
import math
import re
import reprlib
from typing import Any, Callable, cast


# --- JSON and text --------------------------------------------------------------------

_SURROGATES = re.compile("[\ud800-\udfff]")


def strip_surrogates(text: str | None) -> str | None:
    """Remove lone surrogates (sqlite3 cannot bind them); leave everything else byte for byte."""
    if text is None or not isinstance(text, str):
        return text
    return _SURROGATES.sub("", text) if _SURROGATES.search(text) else text


def replace_surrogates(text: str | None) -> str | None:
    """Replace each lone surrogate with U+FFFD (sqlite3 cannot bind one); leave everything else as it is.

    Stored text keeps a visible mark where the unstorable code point was, so scraped text
    with one bad character is kept rather than refused.
    """
    if text is None or not isinstance(text, str) or text.isascii():
        return text
    return _SURROGATES.sub("\ufffd", text) if _SURROGATES.search(text) else text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not standard JSON")


def _model_dump(obj: Any) -> Any:
    # Provider SDK objects (pydantic models such as the openai package's tool calls) dump
    # themselves; duck-typed, so the library imports neither the SDK nor pydantic.
    dump = getattr(obj, "model_dump", None)
    if callable(dump) and not isinstance(obj, type):
        return dump(mode="json", exclude_none=True)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def encode_json(value: Any, field: str) -> str | None:
    """Serialise `value` for a JSON column; raise ValueError naming `field` when it cannot be.

    A str that parses as (standard) JSON is taken as already serialised and stored as it is,
    since callers pass provider payloads pre-encoded; so "123" reads back as the int 123. Any
    other str is encoded as a JSON string, so it reads back as that same str. Objects with a
    `model_dump()` method (pydantic models, e.g. provider SDK types), at any depth, are stored
    as their JSON dump without None fields.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            json.loads(value, parse_constant=_reject_constant)  # NaN/Infinity are not JSON text
        except ValueError:
            return replace_surrogates(json.dumps(value, ensure_ascii=False))
        except RecursionError as exc:
            raise ValueError(f"{field} is nested too deeply to store as JSON") from exc
        return replace_surrogates(value)
    try:
        return replace_surrogates(json.dumps(value, ensure_ascii=False, default=_model_dump))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field} is not JSON-serialisable: {exc}") from exc
    except RecursionError as exc:
        raise ValueError(f"{field} is nested too deeply to store as JSON") from exc


def decode_json(text: Any) -> Any:
    """Decode a JSON column; return the text itself when it is not valid JSON."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past what Python can decode
        return text


# --- value checks ------------------------------------------------------------------------------
# One small family of validators, so every API refuses the same bad numbers the same way.

# SQLite's INTEGER is a signed 64-bit value; Python ints outside it fail at bind time.
INT_MIN, INT_MAX = -2**63, 2**63 - 1

# Error messages quote the bad value, cut short: a plain repr() of a deeply nested list raises
# RecursionError, and one of a huge string floods the message.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 3, 60, 60


def shown(value: Any) -> str:
    """Return a short repr of `value` for an error message; never raises, however deep or large the value."""
    try:
        return _SHOWN.repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not replace the error being reported
        return f"<{type(value).__name__}>"


def is_finite(value: Any) -> bool:
    """Return True for an int or float that is a finite number (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def check_count(name: str, value: Any) -> int:
    """Return `value` when it is a non-negative 64-bit integer, else raise ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, not {shown(value)}")
    if value > INT_MAX:
        raise ValueError(f"{name} = {value} is out of range: SQLite integers are signed 64-bit")
    return value


def check_number(name: str, value: Any, *, positive: bool = False) -> float:
    """Return `value` as a float when it is finite and >= 0 (> 0 with `positive`), else raise ValueError."""
    if not is_finite(value) or value < 0 or (positive and value == 0):
        kind = "a positive" if positive else "a non-negative"
        raise ValueError(f"{name} must be {kind} finite number, not {shown(value)}")
    return float(value)


def has_surrogate(text: str) -> bool:
    """Return True when `text` holds a lone surrogate (SQLite cannot store or look it up)."""
    return not text.isascii() and _SURROGATES.search(text) is not None


def check_id(name: str, value: Any, *, optional: bool = False) -> Any:
    """Return `value` when it is a non-empty string SQLite can store (or None, when `optional`), else raise ValueError."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, not {shown(value)}")
    if has_surrogate(value):
        raise ValueError(f"{name} contains a lone surrogate (U+D800..U+DFFF), which cannot be stored")
    return value


def check_scalar(name: str, value: Any) -> Any:
    """Return `value` if SQLite stores it faithfully (None, str, bool, 64-bit int, non-NaN float)."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise ValueError(f"{name} = {value} is out of range: SQLite integers are signed 64-bit")
        return value
    if isinstance(value, float):
        if math.isnan(value):
            raise ValueError(f"{name} cannot be NaN (SQLite would store NULL)")
        return value
    raise ValueError(f"{name} must be a str, int, float, bool or None, not {type(value).__name__}")


# The rules a caller's value for a column passes (Column.rule names one). Each returns the value
# as stored or raises ValueError naming the column; None never reaches them (it stores NULL).

def _as_text(name: str, value: Any) -> str:
    if type(value) is str and value.isascii():
        return value  # the common case: a C-speed scan, and only non-ASCII text can hold a lone surrogate
    if isinstance(value, str):
        return cast(str, replace_surrogates(value))  # text in, text out
    raise ValueError(f"{name} must be a string or None, not {type(value).__name__}")


def _as_platform_id(name: str, value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # platforms hand out numeric ids; the column is TEXT
    return _as_text(name, value)


def _as_time(name: str, value: Any) -> float:
    if not is_finite(value):
        raise ValueError(f"{name} must be a finite number of epoch seconds, not {shown(value)}")
    return float(value)


def _as_flag(name: str, value: Any) -> int:
    if value not in (0, 1) or not isinstance(value, (bool, int)):
        raise ValueError(f"{name} must be a bool (or 0/1), not {shown(value)}")
    return int(value)


def _as_json_text(name: str, value: Any) -> str | None:
    # Text is kept as given (the caller's own serialisation); anything else is encoded.
    return value if isinstance(value, str) else encode_json(value, name)


def _as_uid(name: str, value: Any) -> str:
    text = _as_text(name, value)
    if not is_uid(text):
        raise ValueError(f"{name} must be 32 lowercase hex digits, not {shown(text)}")
    return text


COLUMN_RULES: dict[str, Callable[[str, Any], Any]] = {
    "text": _as_text, "platform_id": _as_platform_id, "uid": _as_uid, "flag": _as_flag,
    "count": check_count, "number": check_number, "time": _as_time,
    "json": lambda name, value: encode_json(value, name), "json_text": _as_json_text,
}

_UID = re.compile(r"[0-9a-f]{32}")


def is_uid(value: Any) -> bool:
    """Tell whether `value` has the form of a message uid (32 lowercase hex digits)."""
    return isinstance(value, str) and _UID.fullmatch(value) is not None
