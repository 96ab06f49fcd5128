"""A backend outage is logged once, with a count, not once per failed request."""

import asyncio
import logging

import pytest

from service.batching import MicroBatcher
from service.outage_log import OutageLog


def test_an_outage_is_logged_once_then_summarised_and_closed(caplog, monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("service.outage_log.time.monotonic", lambda: clock[0])
    outage = OutageLog(logging.getLogger("test.outage"), "searches", summary_every_s=60, quiet_s=30)
    caplog.set_level(logging.INFO, logger="test.outage")
    for second in range(10_000):  # 10,000 failures over 100 s
        clock[0] = 100.0 + second / 100
        outage.failed(ConnectionError("milvus is down"))
    clock[0] = 205.0
    outage.succeeded()
    outage.succeeded()
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert messages == [
        ("ERROR", "searches failed: milvus is down"),
        ("ERROR", "searches still failing: 6001 failures in 60 s (last: milvus is down)"),
        ("WARNING", "searches recovered after 10000 failures in 105 s"),
    ]
    assert caplog.records[0].exc_info is not None  # the first one has its traceback
    caplog.clear()
    clock[0] = 300.0
    outage.failed(ValueError("another"))
    clock[0] = 400.0  # quiet for longer than quiet_s: the next failure is a new outage
    outage.failed(ValueError("again"))
    assert [r.getMessage() for r in caplog.records] == [
        "searches failed: another",
        "searches ended after 1 failures in 0 s",
        "searches failed: again",
    ]


@pytest.mark.parametrize("alone", [True, False])
def test_a_batcher_whose_backend_is_down_logs_once(caplog, alone: bool) -> None:
    """1,000 searches against a failing backend: every caller gets the error, the log gets one
    traceback; the first success logs the recovery."""
    down = [True]

    def process(items: list[int]) -> list[int]:
        if down[0]:
            raise ConnectionError("backend unreachable")
        return items

    async def run() -> None:
        batcher = MicroBatcher(process, max_size=8, max_wait_s=0, name="searches",
                               inline_when_alone=alone)  # fmt: skip
        await batcher.start()
        try:
            results = await asyncio.gather(
                *(batcher.submit(i, alone=alone) for i in range(1000)), return_exceptions=True
            )
            assert all(isinstance(r, ConnectionError) for r in results)
            down[0] = False
            assert await batcher.submit(7, alone=alone) == 7
        finally:
            await batcher.stop()

    caplog.set_level(logging.INFO, logger="service.batching")
    asyncio.run(run())
    records = [r for r in caplog.records if r.name == "service.batching"]
    assert len(records) == 2, [r.getMessage() for r in records]
    assert records[0].getMessage() == "searches: a batch failed: backend unreachable"
    assert records[1].getMessage().startswith("searches: a batch recovered after ")


def test_an_unhandled_error_answers_500_and_is_logged_once_not_per_request(
    server, client, caplog, monkeypatch
) -> None:
    """A bug or a backend failing in a way no handler knows: every request gets the JSON 500,
    the log one traceback (uvicorn used to log one per request, re-raised by Starlette)."""

    def broken(text: str) -> None:
        raise RuntimeError("a backend failing in a way nobody handled")

    monkeypatch.setattr(server.services.searcher, "check_text", broken)
    caplog.set_level(logging.INFO)
    answers = [client.post("/search/text", json={"text": f"a red circle {i}"}) for i in range(200)]
    assert {a.status_code for a in answers} == {500}
    assert {a.json()["error"] for a in answers} == {"internal_error"}
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1, [r.getMessage() for r in tracebacks[:3]]
    assert not [r for r in caplog.records if r.name.startswith("uvicorn")]
