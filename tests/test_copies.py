"""hermes_state_copies: a message copied into a generation keeps the fields its stored row knows."""
from __future__ import annotations

import pytest

import hermes_state_copies as copies
import hermes_state_messages as messages
from hermes_state import SessionDB


def test_message_list_refuses_one_uid_twice_and_what_is_not_a_list():
    uid = "0" * 32
    assert copies.message_list([{"role": "user"}]) == [{"role": "user"}]
    with pytest.raises(ValueError, match="same message_uid"):
        copies.message_list([{"message_uid": uid}, {"message_uid": uid}])
    with pytest.raises(ValueError, match="list of message dicts"):
        copies.message_list({"role": "user"})


def test_with_stored_fields_fills_what_a_conversation_dict_drops(tmp_path):
    with SessionDB(tmp_path / "state.db") as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "hi", timestamp=123.0, finish_reason="stop")
        uid = db.get_messages("s")[0]["message_uid"]
        with db.transaction() as txn:
            filled = copies.with_stored_fields(txn.conn, "s", [{"message_uid": uid, "content": "hi again"}])
    assert filled[0]["timestamp"] == 123.0 and filled[0]["finish_reason"] == "stop"
    assert filled[0]["content"] == "hi again"  # the dict's own keys win


def test_messages_offers_the_same_names():
    assert messages.message_list is copies.message_list and messages.with_stored_fields is copies.with_stored_fields
