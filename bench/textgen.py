"""Deterministic, chat-like message text, shared by the seeder, the load generator and the
token scenario so every run sends the same bytes."""

from __future__ import annotations

import random

_VOCABULARY = (
    "the a an this that our your my their its we you they it I he she project service database "
    "query index memory summary window message conversation user assistant context token cost "
    "latency throughput request response error retry timeout deploy release branch commit test "
    "suite coverage schema migration table column row lock transaction commit rollback cache "
    "client server worker queue job task thread process core replica region cluster node disk "
    "budget deadline meeting customer invoice order payment refund shipping address account "
    "password email report chart metric alert dashboard incident outage postmortem runbook "
    "should could would will can may might must need want like prefer suggest explain compare "
    "check verify measure improve reduce increase avoid keep drop add remove update rename move "
    "is are was were be been being has have had do does did make made get got use used run "
    "quickly slowly carefully roughly exactly probably usually often never always again later "
    "new old large small fast slow simple complex stable flaky safe risky cheap expensive "
    "because although unless while after before since until when where which what how why "
    "and or but so then also only just still even more less most least very quite rather "
    "Monday Tuesday Friday March April Berlin Paris Tokyo Alice Bob Carol Postgres Python "
    "one two three four five ten twenty hundred thousand percent hours minutes seconds days"
)
_WORDS = _VOCABULARY.split()


def sentence(rng: random.Random, min_words: int = 6, max_words: int = 18) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(min_words, max_words))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), str(rng.randint(2, 9999)))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice(".....?!")


def message(rng: random.Random, role: str) -> str:
    """A user turn is 1-3 sentences, an assistant turn 2-7 (roughly 30-60 and 60-180 tokens)."""
    count = rng.randint(1, 3) if role == "user" else rng.randint(2, 7)
    return " ".join(sentence(rng) for _ in range(count))


def round_messages(rng: random.Random) -> list[dict[str, str]]:
    """One round: a user message and the assistant's answer."""
    return [
        {"role": "user", "content": message(rng, "user")},
        {"role": "assistant", "content": message(rng, "assistant")},
    ]


def rng_for(*key: object) -> random.Random:
    """A generator seeded by a stable key (``hash()`` of str is salted per process)."""
    return random.Random("|".join(str(k) for k in key))
