"""The value checks' first address: every name this module offered, re-exported from where it lives.

Owns: nothing of its own. The value rules a column's value passes (`COLUMN_RULES`, `check_id`,
`check_count`, `check_number`, `is_uid`, `is_finite`, JSON encoding and decoding, lone
surrogates replaced) are part of the data dictionary in hermes_state_common, so a write checks
its values without leaving that module; `check_scalar`, `strip_surrogates`, `shown` and SQLite's
integer range live in hermes_state_base. Does not own: anything a new caller should import from
here; import these names from hermes_state_common.
"""
from __future__ import annotations

from hermes_state_common import (COLUMN_RULES, INT_MAX, INT_MIN, check_count, check_id, check_number, check_scalar,
                                 decode_json, encode_json, has_surrogate, is_finite, is_uid, replace_surrogates, shown,
                                 strip_surrogates)

__all__ = ["COLUMN_RULES", "INT_MAX", "INT_MIN", "check_count", "check_id", "check_number", "check_scalar",
           "decode_json", "encode_json", "has_surrogate", "is_finite", "is_uid", "replace_surrogates", "shown",
           "strip_surrogates"]
