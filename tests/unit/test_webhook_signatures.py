"""Webhook signatures (app.webhooks): what the service signs, the README's verification snippet
accepts, and nothing else."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.webhooks import signature, verify

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def readme_verify() -> Any:
    section = README.split("\n## Webhooks\n", 1)[1].split("\n## ", 1)[0]
    (snippet,) = re.findall(r"```python\n(.*?)```", section, re.S)
    namespace: dict[str, Any] = {}
    exec(snippet, namespace)
    return namespace["verify"]


@given(secret=st.text(min_size=1, max_size=40), body=st.binary(max_size=200), skew=st.integers(-299, 299))
def test_the_readme_snippet_and_verify_accept_what_is_signed(secret: str, body: bytes, skew: int) -> None:
    now = int(time.time())
    header = signature(secret, now + skew, body)
    assert verify(secret, header, body, now=now)
    assert readme_verify()(secret, header, body)


@given(secret=st.text(min_size=1, max_size=40), body=st.binary(min_size=1, max_size=200))
def test_another_secret_body_or_time_is_refused(secret: str, body: bytes) -> None:
    now = int(time.time())
    header = signature(secret, now, body)
    check = readme_verify()
    assert not verify(secret + "x", header, body, now=now) and not check(secret + "x", header, body)
    assert not verify(secret, header, body + b"x", now=now) and not check(secret, header, body + b"x")
    stale = signature(secret, now - 600, body)
    assert not verify(secret, stale, body, now=now) and not check(secret, stale, body)
    assert not verify(secret, "v1=abc", body, now=now) and not check(secret, "v1=abc", body)
