"""Verdicts and statuses are StrEnums: the code names them, while records, JSON output
and the lines printed keep the very words they had, and a record read back from disk
(plain strings) still parses and compares equal."""

from __future__ import annotations

import json
from dataclasses import asdict
from enum import StrEnum

import pytest

from gpuserve.fleet.rolling import WorkerStatus, parse_workers
from gpuserve.host.fabric import FabricState, judge
from gpuserve.launch.bench import RunState, parse_status
from gpuserve.measure.gates import GateStatus, GateVerdict
from gpuserve.measure.health import Verdict
from gpuserve.memory.planner import FitVerdict
from gpuserve.monitor.live_judge import LiveKind
from gpuserve.tune.outcome import LoadStatus, Outcome, OutcomeStatus, from_dict

ENUMS = (GateStatus, FitVerdict, Verdict, LiveKind, OutcomeStatus, LoadStatus, FabricState,
         RunState, WorkerStatus)


@pytest.mark.parametrize("enum", ENUMS, ids=lambda e: e.__name__)
def test_each_member_prints_and_serialises_as_its_word(enum: type[StrEnum]) -> None:
    for member in enum:
        assert isinstance(member, str) and f"{member}" == member.value == str(member)
        assert json.dumps({"status": member}) == json.dumps({"status": member.value})
        assert enum(member.value) is member  # a word read back from disk


def test_a_gate_verdict_record_is_byte_identical_and_reads_back() -> None:
    verdict = GateVerdict("all_reduce_busbw", GateStatus.FAIL, "below the limit", 20.0, 25.0)
    as_words = {**asdict(verdict), "status": "fail"}
    assert json.dumps(asdict(verdict)) == json.dumps(as_words)
    assert not verdict.passed
    back = GateVerdict(**json.loads(json.dumps(asdict(verdict))))
    assert back.status == GateStatus.FAIL and not back.passed


def test_a_stored_tune_outcome_parses_to_its_status() -> None:
    outcome = Outcome("c1", "one-knob", {"mfs": "0.85"}, OutcomeStatus.PRUNED)
    doc = json.loads(json.dumps(outcome.to_dict("t")))
    assert doc["status"] == "pruned"
    back = from_dict(doc)
    assert back is not None and back.status is OutcomeStatus.PRUNED and not back.loaded
    assert from_dict({**doc, "status": "exploded"}) is None


def test_host_answers_parse_to_members() -> None:
    workers = parse_workers(json.dumps({"workers": [
        {"url": "http://10.0.0.21:30000/", "status": "ready", "is_healthy": True}]}))
    assert workers[0].status is WorkerStatus.READY and workers[0].ready
    assert parse_status('{"state": "done", "done": 3}').state is RunState.DONE
    assert parse_status("not json").state is RunState.FAILED
    assert judge([{"state": "Completed", "status": "Success"}]).state is FabricState.READY
    assert FitVerdict.TIGHT.starts and not FitVerdict.NO_KV.starts
