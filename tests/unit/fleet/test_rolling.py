"""The rollout's view of the gateway (gpuserve/fleet/rolling.py), on real smg 1.13.0
answers (tests/fixtures/smg/, recorded as SOURCES.md says)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.fleet.rolling import (
    GatewayWorker,
    availability,
    parse_workers,
    take_out_refusal,
)

SMG = Path(__file__).resolve().parents[2] / "fixtures" / "smg"
A, B = "http://127.0.0.1:32001", "http://127.0.0.1:32002"


def recorded(name: str) -> list[GatewayWorker]:
    return parse_workers((SMG / f"workers-{name}.json").read_text(), name)


def test_recorded_answers() -> None:
    ready = {w.url: w for w in recorded("ready")}
    assert set(ready) == {A, B} and all(w.ready for w in ready.values())
    draining = {w.url: w for w in recorded("draining")}
    assert draining[B].status == "draining" and not draining[B].ready
    assert draining[A].ready
    assert [w.url for w in recorded("removed")] == [A]


def test_availability_counts_absent_and_draining_as_out() -> None:
    assert availability([A, B], recorded("ready")).out == ()
    assert availability([A, B + "/"], recorded("draining")).out == (B,)
    assert availability([A, B], recorded("removed")) == availability([A, B], recorded("draining"))


def test_a_host_may_leave_while_another_is_ready() -> None:
    assert take_out_refusal(B, [A, B], recorded("ready")) is None


def test_the_last_ready_worker_may_not_leave() -> None:
    why = take_out_refusal(A, [A, B], recorded("removed"))
    assert why is not None and "last ready worker" in why
    # one worker in all: never taken out, whatever max_unavailable says
    assert "last ready" in take_out_refusal(A, [A], recorded("removed"), max_unavailable=5)


def test_max_unavailable_counts_the_others_already_out() -> None:
    c = "http://127.0.0.1:32003"
    workers = [*recorded("draining"), GatewayWorker(c, "ready", True)]
    why = take_out_refusal(c, [A, B, c], workers)
    assert why is not None and "1 other worker(s) already out" in why and B in why
    assert take_out_refusal(c, [A, B, c], workers, max_unavailable=2) is None
    # the host that is out already may go on (a rerun after a cut-off rollout)
    assert take_out_refusal(B, [A, B, c], workers) is None


def test_a_host_not_in_the_group_is_refused() -> None:
    assert "not one of the gateway's workers" in take_out_refusal(
        "http://10.9.9.9:30000", [A, B], recorded("ready"))


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1"])
def test_max_unavailable_must_be_a_positive_integer(bad) -> None:
    with pytest.raises(ValueError):
        take_out_refusal(A, [A, B], recorded("ready"), max_unavailable=bad)


@pytest.mark.parametrize(("text", "field"), [
    ("[]", "workers"),
    ('{"error": {"message": "Invalid API key"}}', "workers"),  # a 401 body
    ('{"workers": [1]}', "workers[0]"),
    ('{"workers": [{"status": "ready", "is_healthy": true}]}', "workers[0].url"),
    ('{"workers": [{"url": "http://a", "status": "gone", "is_healthy": true}]}',
     "workers[0].status"),
    ('{"workers": [{"url": "http://a", "status": "ready", "is_healthy": "yes"}]}',
     "workers[0].is_healthy"),
])
def test_answers_that_are_not_a_worker_list_are_refused(text, field) -> None:
    with pytest.raises(InputError) as e:
        parse_workers(text, "gw:GET /workers")
    assert e.value.field == field and e.value.file == "gw:GET /workers"


def test_hostile_answers_are_bounded() -> None:
    with pytest.raises(InputError, match="nested too deeply"):
        parse_workers("[" * 100_000, "gw")
    with pytest.raises(InputError):
        parse_workers(json.dumps({"workers": [{"url": "x" * 5_000_000}]}), "gw")
    with pytest.raises(InputError):
        parse_workers('{"workers": [{"url": "http://a", "status": "ready", "is_healthy": NaN}]}',
                      "gw")
