"""Lineage walks on a bare connection: the compression edge, parent links, and cycles planted by bad data."""
from __future__ import annotations

import pytest

import hermes_state_lineage as lineage


def _session(conn, sid, parent=None, *, started=0.0, ended=None, reason=None):
    conn.execute("INSERT INTO sessions (id, source, started_at, ended_at, end_reason, parent_session_id) "
                 "VALUES (?, 'cli', ?, ?, ?, ?)", (sid, started, ended, reason, parent))


@pytest.fixture
def chain(conn):
    # root -compression-> mid -compression-> tip; mid also has a later branch; root a reset child.
    _session(conn, "root", started=1.0, ended=10.0, reason=lineage.COMPRESSION_END_REASON)
    _session(conn, "mid", "root", started=10.0, ended=20.0, reason=lineage.COMPRESSION_END_REASON)
    _session(conn, "tip", "mid", started=20.0)
    _session(conn, "branch", "mid", started=30.0)
    return conn


def test_the_compression_walks_follow_only_the_compression_edge(chain):
    assert lineage.compression_successor_id(chain, "root") == "tip"
    assert lineage.compression_successor_id(chain, "tip") == "tip"
    assert lineage.compression_successor_id(chain, "branch") == "branch"
    assert lineage.compression_successor_id(chain, "ghost") is None
    assert lineage.compression_ancestor_ids(chain, "tip") == ["root", "mid"]
    assert lineage.compression_ancestor_ids(chain, "branch") == []  # a later child is not the edge
    assert lineage.compression_chain_ids(chain, "mid") == ["root", "mid", "tip"]
    assert lineage.live_continuation(chain, "root") == "tip"
    assert lineage.live_continuation(chain, "tip") is None


def test_the_parent_link_walks_see_every_child(chain):
    assert [r["id"] for r in lineage.get_lineage(chain, "branch")] == ["root", "mid", "branch"]
    assert lineage.get_lineage(chain, "ghost") == []
    assert sorted(r["id"] for r in lineage.get_descendants(chain, "root")) == ["branch", "mid", "tip"]
    assert lineage.get_descendants(chain, "tip") == []


def test_a_parent_cycle_ends_every_walk(conn):
    _session(conn, "a", started=1.0, ended=2.0, reason=lineage.COMPRESSION_END_REASON)
    _session(conn, "b", "a", started=2.0, ended=3.0, reason=lineage.COMPRESSION_END_REASON)
    conn.execute("UPDATE sessions SET parent_session_id = 'b' WHERE id = 'a'")  # a <-> b
    assert lineage.compression_successor_id(conn, "a") == "b"
    assert lineage.compression_ancestor_ids(conn, "b") == ["a"]
    assert lineage.compression_ancestor_ids(conn, "a") == []  # b started before a ended: no edge back
    assert [r["id"] for r in lineage.get_lineage(conn, "a")] == ["b", "a"]  # stops at the repeat
    assert [r["id"] for r in lineage.get_descendants(conn, "a")] == ["b"]

