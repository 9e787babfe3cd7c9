"""The JSON log formatter: one line per record, whatever the message or traceback holds."""

from __future__ import annotations

import json
import logging
import sys

from app import logs


def test_the_json_formatter_keeps_a_traceback_on_the_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("app.test").makeRecord(
            "app.test", logging.WARNING, __file__, 1, "failed %s", ("here\nthere",), exc_info=sys.exc_info()
        )
    with logs.bound(request_id="r-1", memory_id=7):
        text = logs.formatter("json").format(record)
    assert "\n" not in text
    line = json.loads(text)
    assert line["message"] == "failed here\nthere"
    assert (line["level"], line["logger"], line["request_id"], line["memory_id"]) == (
        "WARNING",
        "app.test",
        "r-1",
        7,
    )
    assert "ValueError: boom" in line["exception"]
    assert json.loads(logs.formatter("json").format(record))["request_id"] is None
