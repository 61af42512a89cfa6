"""What `lanectl pin check` found: per lane and for the release as a whole, each finding with its verdict."""

from __future__ import annotations

from dataclasses import field
from enum import StrEnum
from typing import Any

from lanectl.records import frozen


class Verdict(StrEnum):
    BREAKS = "breaks"  # something must change before the pin moves (exit 1)
    NOTE = "note"  # true and worth knowing, handled or harmless
    OK = "ok"  # checked and fine


@frozen
class Finding:
    topic: str  # patch, startup rule, serve flag, cache, first start, build, dev routes, answers, compile cache
    verdict: Verdict
    text: str
    where: str = ""  # the recipe's file:line, or the release's file:line that says so

    def to_json(self) -> dict[str, str]:
        return {"topic": self.topic, "verdict": str(self.verdict), "text": self.text, "where": self.where}


@frozen
class LaneReport:
    lane: str
    recipe: str
    pinned: str
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"lane": self.lane, "recipe": self.recipe, "pinned": self.pinned,
                "findings": [finding.to_json() for finding in self.findings]}


@frozen
class PinReport:
    version: str
    flashinfer: str | None
    release: list[Finding]
    lanes: list[LaneReport]
    not_checked: list[str]  # lanes with no image.vllm, named with why

    @property
    def breaking(self) -> list[Finding]:
        return [f for f in [*self.release, *(f for lane in self.lanes for f in lane.findings)]
                if f.verdict == Verdict.BREAKS]

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "flashinfer": self.flashinfer, "breaks": len(self.breaking),
                "release": [finding.to_json() for finding in self.release],
                "lanes": [lane.to_json() for lane in self.lanes], "not_checked": self.not_checked}
