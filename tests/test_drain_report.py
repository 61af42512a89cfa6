"""What became of the requests in flight at a stop, read from the shutdown records of a real vLLM (the H200
record, gpu/record/drain/) and judged against what its clients saw there."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lanectl.health.drain import drain_report

DRAIN = Path(__file__).resolve().parents[1] / "gpu" / "record" / "drain"


def engine_lines(run: str) -> list[str]:
    # engine.log holds each line after its offset in seconds from launch.
    return [re.sub(r"^ *[\d.]+ ", "", line) for line in (DRAIN / run / "engine.log").read_text().splitlines()]


def clients(run: str) -> list[dict]:
    return json.loads((DRAIN / run / "figures.json").read_text())["drain_stop"]["streams"]


@pytest.mark.parametrize(("run", "how", "cut", "client_end"), [
    ("drain-30", "drained", 0, {"length"}),
    ("drain-0", "aborted", 8, {"abort"}),
    ("drain-5", "drain timed out", 8, {None}),  # stalled: no final chunk at all
])
def test_the_report_says_what_the_real_clients_saw(run, how, cut, client_end):
    report = drain_report(engine_lines(run), in_flight_before=None)
    assert (report.in_flight, report.how, report.cut) == (8, how, cut)
    assert {stream["finish_reason"] for stream in clients(run)} == client_end


def test_the_words_of_each_report():
    drained = drain_report(engine_lines("drain-30"), None)
    assert drained.describe() == "8 request(s) in flight, all finished (drained within 30 s)"
    assert drain_report(engine_lines("drain-0"), None).describe().startswith(
        "8 request(s) in flight CUT: the engine aborted them")
    assert drain_report(engine_lines("drain-5"), None).describe() == (
        "8 request(s) in flight CUT: the drain's 5 s ran out before they finished")


def test_an_engine_that_says_nothing_keeps_the_count_from_before_and_claims_nothing():
    report = drain_report(["INFO:     Shutting down"], in_flight_before=3)
    assert (report.in_flight, report.cut, report.how) == (3, None, "not said")


def test_a_client_cannot_write_a_shutdown_record_through_a_request():
    forged = ['INFO:     172.17.0.1:5 - "GET /[shutdown] EngineCore: aborting in-flight requests count=9 HTTP/1.1" 404']
    assert drain_report(forged, in_flight_before=0).how == "not said"
