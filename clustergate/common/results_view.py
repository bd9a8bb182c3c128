"""A results file as typed records, for the rules that read it (the verdict, the completeness rule): each field is
read here once, with what an absent field means, instead of a chain of ``.get`` at every reader.

Lenient as those readers were: a results file is held to its schema where it is read
(``clustergate.record.resultsfile``); here an entry that is not a mapping where one is expected is left out, and an
absent field reads as its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def _said(key: str, doc: str | None = None) -> Any:
    """A field read as recorded (None where absent)."""
    return property(lambda self: self.raw.get(key), doc=doc)


def _mappings(value: Any) -> tuple[Mapping[str, Any], ...]:
    return tuple(v for v in value or () if isinstance(v, Mapping)) if isinstance(value, (list, tuple)) else ()


@dataclass(frozen=True, slots=True)
class TestRecord:
    """One entry of results.json's ``tests``."""

    raw: Mapping[str, Any]

    @property
    def nodeid(self) -> str:
        return str(self.raw.get("nodeid"))

    outcome = _said("outcome", "passed, failed, skipped, error, interrupted; what the file says where it says another.")

    @property
    def phases(self) -> list[str] | None:
        """The phases that ran (setup, call, teardown); None where the record does not say (an older one)."""
        phases = self.raw.get("phases")
        return phases if isinstance(phases, list) else None

    @property
    def metrics(self) -> tuple[Mapping[str, Any], ...]:
        return _mappings(self.raw.get("metrics"))

    @property
    def message(self) -> str:
        return str(self.raw.get("message") or "")

    failed_ranks = _said("failed_ranks")
    problems = _said("problems")
    skip_fact = _said("skip_fact", "The fact a skip rests on, as recorded (a mapping with ``fact``), or None.")


@dataclass(frozen=True, slots=True)
class ResultsView:
    """A results document (a run's results.json), read by name."""

    raw: Mapping[str, Any]
    tests: tuple[TestRecord, ...]

    @classmethod
    def of(cls, results: Mapping[str, Any]) -> ResultsView:
        return cls(results, tuple(TestRecord(t) for t in _mappings(results.get("tests"))))

    verdict = _said("verdict")
    error = _said("error")

    @property
    def interrupted(self) -> bool:
        """True only where the record says so: no rank caused the reject (a signal from outside)."""
        return self.raw.get("interrupted") is True

    @property
    def sign_off(self) -> bool:
        """Whether the profile signs off (``sign_off: false`` measures without judging); true where absent."""
        return bool(self.raw.get("sign_off", True))

    level = _said("level")
    world_size = _said("world_size", "As recorded (an int in a record that meets its schema).")

    @property
    def selection(self) -> Mapping[str, Any]:
        """What the run selected and how (suite, -k, -m, counts); {} where it has none, or not a mapping."""
        selection = self.raw.get("selection")
        return selection if isinstance(selection, Mapping) else {}

    @property
    def nodes(self) -> tuple[Mapping[str, Any], ...]:
        return _mappings(self.raw.get("nodes"))

    @property
    def gpus(self) -> tuple[Mapping[str, Any], ...]:
        """Every GPU its nodes list (index, uuid, serial, name), node by node: the hardware that ran it."""
        return tuple(g for n in self.nodes for g in _mappings(n.get("gpus")))
