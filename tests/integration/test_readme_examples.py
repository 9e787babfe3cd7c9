"""The README's example of sending a context to a model runs as written, against a real service
and the fake OpenAI server."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.fakellm import FakeLLM
from tests.integration.conftest import Launch

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"


def example(section: str, index: int = 0) -> str:
    """The ``index``-th python block of a README section."""
    text = README.read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"```python\n(.*?)```", body, re.S)
    assert len(found) > index, f"no python example {index} under {section}"
    return str(found[index])


def three_rounds(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        for n in range(3):
            round_ = [{"role": "user", "content": f"Q{n}?"}, {"role": "assistant", "content": f"A{n}."}]
            client.post("/conversations/trip-7/messages", json={"messages": round_}).raise_for_status()


def run(code: str, env: dict[str, str]) -> None:
    """Run a README example in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_openai_example_runs(launch: Launch, llm: FakeLLM) -> None:
    server = launch()
    three_rounds(server.url)
    code = example("Contexts for your model", 0).replace("http://127.0.0.1:8000", server.url)
    env = {**os.environ, "OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "sk-test"}
    run(code, env)
    with httpx.Client(base_url=server.url) as client:
        stored = client.get("/conversations/trip-7/messages").json()["messages"]
    assert stored[-2]["content"] == "And what about Osaka?"
    # The model got the context (the summary as a system message, then the rounds) and the question.
    asked = [
        c.body["messages"] for c in llm.calls if c.body["messages"][-1]["content"] == "And what about Osaka?"
    ]
    assert len(asked) == 1 and asked[0][0]["role"] == "system"


def test_the_anthropic_example_runs(launch: Launch, llm: FakeLLM) -> None:
    """Against a fake Messages endpoint; the request it got is valid for the SDK's types and
    alternates from the user."""
    from anthropic.types import MessageParam
    from pydantic import TypeAdapter

    server = launch()
    three_rounds(server.url)
    code = example("Contexts for your model", 1).replace("http://127.0.0.1:8000", server.url)
    base = llm.base_url.removesuffix("/v1")
    env = {**os.environ, "ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": "sk-ant-test"}
    run(code, env)
    (request,) = llm.anthropic_requests
    TypeAdapter(list[MessageParam]).validate_python(request["messages"])
    roles = [m["role"] for m in request["messages"]]
    assert roles[0] == "user" and all(a != b for a, b in itertools.pairwise(roles))
    with httpx.Client(base_url=server.url) as client:
        stored = client.get("/conversations/trip-7/messages").json()["messages"]
    assert stored[-1]["content"] == "A fake Claude answer."
