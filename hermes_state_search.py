"""Read-side queries over sessions and messages: lineage, titles, listings, statistics, search.

Owns: recursive-CTE lineage walks (cycle-safe), title uniqueness/lineage numbering and
resolution, `list_sessions` with previews in one query, usage statistics, the idle
auto-archive sweep, and `search_messages` over the FTS indexes (hermes_state_fts).
Does not own: writing message rows (hermes_state_sessions) or FTS maintenance.

Transaction contract: functions run on the caller's connection; writers among them run inside
the caller's write transaction and never commit; readers run under the caller's lock.
"""
from __future__ import annotations
