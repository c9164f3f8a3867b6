"""Lock holder strings (hermes_state_lockowners): who a holder names, and whether that process is alive."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import hermes_state_compression as compression
import hermes_state_lockowners as holders


def _exited_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_holder_string_is_parsed_field_by_field():
    assert holders.parse_holder("pid=12 host=box pidns=7 token=ab") == (12, "box", "7")
    assert holders.parse_holder("host=box") == (None, "box", None)


def test_a_lock_holds_until_it_expires_or_its_holder_is_provably_gone():
    me = compression.new_holder()
    assert holders.lock_is_live(me, expires_at=200.0, now=100.0)
    assert not holders.lock_is_live(me, expires_at=100.0, now=100.0)  # expired
    gone = f"pid={_exited_pid()} host={socket.gethostname()} pidns={holders.own_pidns()} token=t"
    if os.name == "posix" and holders.own_pidns() != holders.UNKNOWN_PIDNS:
        assert holders.holder_is_gone(gone) and not holders.lock_is_live(gone, expires_at=200.0, now=100.0)
    elsewhere = f"pid={_exited_pid()} host=not-{socket.gethostname()} pidns={holders.own_pidns()} token=t"
    assert holders.lock_is_live(elsewhere, expires_at=200.0, now=100.0)  # another host: no proof, alive

