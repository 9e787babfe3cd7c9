"""The text/event-stream framing of an event (app.events.server_sent_event)."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
from hypothesis import given
from hypothesis import strategies as st

from app.events import server_sent_event

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@given(data=JSON, indent=st.booleans())
def test_one_event_is_one_frame_whose_data_line_is_the_event(data: object, indent: bool) -> None:
    text = orjson.dumps(data, option=orjson.OPT_INDENT_2 if indent else 0).decode()
    created = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
    frame = server_sent_event({"event_id": 7, "type": "entry:added", "created_at": created, "data": text})
    lines = frame.decode().split("\n")
    assert lines[:2] == ["id: 7", "event: entry:added"] and lines[3:] == ["", ""]
    assert lines[2].startswith("data: ")
    assert orjson.loads(lines[2].removeprefix("data: ")) == {
        "event_id": 7,
        "type": "entry:added",
        "created_at": created.isoformat(),
        "data": data,
    }
