"""Reading a /metrics scrape in tests: samples by name and labels, and differences between two
scrapes (the in-process tests share one registry, so they compare before and after)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

Key = tuple[str, frozenset[tuple[str, str]]]


class Scrape:
    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[Key, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def value(self, name: str, **labels: str) -> float:
        """The sample with exactly these labels (0 when absent: a series not yet counted)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def has(self, name: str, **labels: str) -> bool:
        return (name, frozenset(labels.items())) in self.samples

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples named ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)

    def labels_of(self, name: str) -> list[Mapping[str, str]]:
        return [dict(ls) for (n, ls) in self.samples if n == name]

    def __sub__(self, before: Scrape) -> Delta:
        return Delta(self, before)


class Delta:
    def __init__(self, after: Scrape, before: Scrape) -> None:
        self.after = after
        self.before = before

    def value(self, name: str, **labels: str) -> float:
        return self.after.value(name, **labels) - self.before.value(name, **labels)

    def total(self, name: str, **labels: str) -> float:
        return self.after.total(name, **labels) - self.before.total(name, **labels)
