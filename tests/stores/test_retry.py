"""The retry room (wds_cloud/stores/retry.py) on its own: the policy's delays, the attempt loop's
budget of failures in a row, its sync and async waits, the per-store table and the HTTP statuses.

(The same loop against real servers behind a fault-injecting proxy: test_cloudstores.py and
test_faults.py.)"""

from __future__ import annotations

import asyncio
import logging
import random
import subprocess
import sys
import time

import pytest

from wds_cloud.errors import AccessDeniedError, OpenError, ShardNotFoundError, TransferError
from wds_cloud.settings import Settings
from wds_cloud.stores.retry import (
    TRANSIENT_BY_STORE,
    Retrier,
    RetryableError,
    RetryPolicy,
    io_stats,
    is_transient,
    reset_io_stats,
    status_error,
    transient_errors,
)

FAST = RetryPolicy(retries=3, backoff=0.001, backoff_max=0.002, timeout=5)


@pytest.fixture(autouse=True)
def _fresh_stats() -> None:
    reset_io_stats()


# -- the policy -------------------------------------------------------------------------------

def test_the_policy_defaults_are_the_settings_defaults() -> None:
    assert RetryPolicy() == RetryPolicy.from_settings(Settings())
    custom = Settings(retries=2, retry_backoff=0.5, retry_backoff_max=4.0, timeout=7.0)
    assert RetryPolicy.from_settings(custom) == RetryPolicy(2, 0.5, 4.0, 7.0)
    with pytest.raises(AttributeError):
        RetryPolicy().retries = 1  # type: ignore[misc]


def test_delays_are_full_jitter_doubling_up_to_the_cap() -> None:
    policy = RetryPolicy(retries=10, backoff=0.1, backoff_max=1.0)
    rng = random.Random(5)
    for failures, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        delays = [policy.delay(failures, rng) for _ in range(2000)]
        assert all(0 <= d <= cap for d in delays)
        assert max(delays) > 0.9 * cap and min(delays) < 0.1 * cap  # the whole range is used


def test_delays_come_from_the_generator_given() -> None:
    policy = RetryPolicy()
    first = [policy.delay(n, random.Random(1)) for n in range(1, 6)]
    assert first == [policy.delay(n, random.Random(1)) for n in range(1, 6)]


# -- the attempt loop -------------------------------------------------------------------------

def test_the_budget_is_failures_in_a_row() -> None:
    retrier = Retrier(FAST, url="s3://b/k")
    for _ in range(10):  # far more than 3 failures in all, never more than 3 in a row
        for _ in range(3):
            assert 0 <= retrier.failed(ConnectionResetError("reset")) <= FAST.backoff_max
        retrier.succeeded()
    assert io_stats()["retries"] == 30
    for _ in range(3):
        retrier.failed(TimeoutError())
    with pytest.raises(TransferError) as info:
        retrier.failed(ConnectionResetError("reset by peer"))
    err = info.value
    assert str(err) == ("cannot read s3://b/k at byte 0: connection reset; gave up after 3 "
                        "retries (4 attempts in a row failed)")
    assert isinstance(err.__cause__, ConnectionResetError)
    assert io_stats()["retries"] == 33 and io_stats()["failures"] == 1


def test_a_read_gives_up_with_url_offset_and_attempts_without_secrets() -> None:
    retrier = Retrier(RetryPolicy(retries=0), url="https://h/k?sig=s3cr3t",
                      resolved_url="http://proxy/k?sig=s3cr3t")
    retrier.attempt()
    retrier.attempt(resume=True)
    retrier.offset = 1234
    with pytest.raises(TransferError) as info:
        retrier.failed(RetryableError("HTTP 503 reading https://h/k?sig=s3cr3t", status=503))
    err = info.value
    assert str(err) == ("cannot read https://h/k?sig=*** (http://proxy/k?sig=***) at byte "
                        "1234: HTTP 503 reading https://h/k?sig=***; gave up after 0 retries "
                        "(1 attempt in a row failed)")
    assert (err.url, err.resolved_url) == ("https://h/k?sig=***", "http://proxy/k?sig=***")
    assert err.offset == 1234 and err.attempts == 2 and "s3cr3t" not in str(err)
    assert io_stats()["requests"] == 2 and io_stats()["resumes"] == 1


def test_retries_are_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="wds_cloud.stores")
    retrier = Retrier(FAST, url="gs://b/k", doing="write")
    retrier.failed(RetryableError("HTTP 503"), "part 2")
    retrier.offset = 7
    Retrier(FAST, url="gs://b/k").failed(ConnectionResetError())
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert lines[0].startswith("retry 1/3 of part 2 for gs://b/k in ")
    assert lines[0].endswith(" s after HTTP 503")  # a bare RetryableError's own words
    assert lines[1].startswith("retry 1/3 of gs://b/k at byte 0 in ")
    assert lines[1].endswith(" s after connection reset")


def test_wait_and_wait_async_sleep_the_delay() -> None:
    policy = RetryPolicy(retries=5, backoff=0.05, backoff_max=0.1)
    rng = random.Random(3)
    expected = [policy.delay(1, rng), policy.delay(2, rng)]
    retrier = Retrier(policy, url="http://h/k", rng=random.Random(3))
    start = time.monotonic()
    retrier.wait(ConnectionResetError())
    waited = time.monotonic() - start
    start = time.monotonic()
    asyncio.run(retrier.wait_async(ConnectionResetError()))
    waited_async = time.monotonic() - start
    assert expected[0] - 0.005 <= waited < expected[0] + 0.5  # (timers may round down)
    assert expected[1] - 0.005 <= waited_async < expected[1] + 0.5
    assert retrier.failures == 2 and io_stats()["retries"] == 2


class Flaky:
    """An async request that raises each of ``errors`` in turn, then returns ``"done"``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls: list[tuple[object, ...]] = []

    async def __call__(self, *args: object, **kwargs: object) -> str:
        self.calls.append((*args, *kwargs.values()))
        await asyncio.sleep(0)
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def test_call_async_retries_transient_failures_then_returns() -> None:
    request = Flaky(RetryableError("HTTP 503", status=503), ConnectionResetError(),
                    TimeoutError(), asyncio.TimeoutError())
    retrier = Retrier(RetryPolicy(retries=4, backoff=0.001, backoff_max=0.002),
                      url="s3://b/k", doing="write")
    assert asyncio.run(retrier.call_async("part 1", request, 1, part=2)) == "done"
    assert request.calls == [(1, 2)] * 5
    assert retrier.attempts == 5 and retrier.failures == 0  # a completed request resets
    assert io_stats()["retries"] == 4 and io_stats()["requests"] == 5


def test_call_async_gives_up_when_the_budget_is_spent() -> None:
    request = Flaky(*[RetryableError(f"HTTP 50{i}", status=500 + i) for i in range(5)])
    retrier = Retrier(FAST, url="az://c/k", doing="write")
    with pytest.raises(TransferError) as info:
        asyncio.run(retrier.call_async("block 3", request))
    err = info.value
    assert str(err) == ("cannot write az://c/k: HTTP 503 on block 3; gave up after 3 retries "
                        "(4 attempts in a row failed)")
    assert err.attempts == 4 and len(request.calls) == 4
    assert io_stats()["failures"] == 1


def test_call_async_does_not_retry_what_a_retry_cannot_mend() -> None:
    for error in (AccessDeniedError("denied"), ValueError("a bug"), OpenError("HTTP 400")):
        request = Flaky(error)
        with pytest.raises(type(error)):
            asyncio.run(Retrier(FAST, url="gs://b/k", doing="write").call_async("x", request))
        assert len(request.calls) == 1
    assert io_stats()["retries"] == 0


# -- what is transient ------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "kind"), [
    (404, ShardNotFoundError), (410, ShardNotFoundError), (401, AccessDeniedError),
    (403, AccessDeniedError), (412, TransferError), (400, OpenError), (408, RetryableError),
    (429, RetryableError), (500, RetryableError), (503, RetryableError), (504, RetryableError),
])
def test_statuses(status: int, kind: type[Exception]) -> None:
    err = status_error(status, "s3://b/k?X-Amz-Signature=abc", "reading", offset=5)
    assert type(err) is kind and "abc" not in str(err)
    assert isinstance(err, RetryableError) == (status in (408, 429) or status >= 500)
    if isinstance(err, RetryableError):
        assert err.status == status


def test_a_missing_bucket_on_writing_is_not_a_missing_shard() -> None:
    err = status_error(404, "gs://b/k", "writing")
    assert type(err) is OpenError and "no such bucket" in str(err)


def test_the_table_names_each_store_and_imports_lazily() -> None:
    assert sorted(TRANSIENT_BY_STORE) == ["azure", "gcs", "http", "s3"]
    import aiohttp

    for store in TRANSIENT_BY_STORE:
        errors = transient_errors(store)
        assert ConnectionError in errors and TimeoutError in errors
        assert aiohttp.ClientPayloadError in errors and aiohttp.ClientConnectionError in errors
    with pytest.raises(ValueError, match="known"):
        transient_errors("ftp")


def test_s3_connection_errors_are_transient_missing_credentials_are_not() -> None:
    from botocore.exceptions import (
        EndpointConnectionError,
        NoCredentialsError,
        ParamValidationError,
        ReadTimeoutError,
    )

    assert is_transient(EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), "s3")
    assert is_transient(ReadTimeoutError(endpoint_url="http://127.0.0.1:9"), "s3")
    assert not is_transient(NoCredentialsError(), "s3")
    assert not is_transient(ParamValidationError(report="bad"), "s3")
    assert not is_transient(ValueError("a bug"), "s3")


def test_azure_no_answer_is_transient_an_answer_is_judged_by_status() -> None:
    from azure.core.exceptions import (
        HttpResponseError,
        IncompleteReadError,
        ServiceRequestError,
        ServiceResponseError,
    )

    assert is_transient(ServiceRequestError("refused"), "azure")
    assert is_transient(ServiceResponseError("dropped"), "azure")
    assert is_transient(IncompleteReadError("cut"), "azure")
    assert not is_transient(HttpResponseError("answered"), "azure")


def test_the_room_imports_no_library_until_asked() -> None:
    code = ("import sys, wds_cloud.stores.retry\n"
            "print(sorted(m for m in ('aiohttp', 'botocore', 'azure', 'fsspec') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
