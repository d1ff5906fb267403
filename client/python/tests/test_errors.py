"""hgemm.Error's details (docs/errors.md, "Details"): the field, the limit and the retry delay
the server sends, read alike by both cores (this suite runs once per HGEMM_TRANSPORT), on unary
calls and on a stream's GEMMs; and the retry policy's use of RetryInfo."""
import numpy as np
import pytest

import hgemm
from hgemm import _errors, _retry
from hgemm._proto import error_details_pb2, status_pb2

from conftest import Server, fp16


@pytest.fixture(scope="module")
def strict_server():
    """A server that queues no GEMM (each one: queue full) and keeps 1 KiB of matrices a client."""
    s = Server("--cpu_workers=1", "--max_queued_requests=0", "--resident_quota_bytes=1024")
    yield s
    s.stop()


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_invalid_argument_names_the_field(client, rng, mode):
    with pytest.raises(hgemm.InvalidArgument) as caught:
        client.gemm(fp16(rng, 4, 8), fp16(rng, 8, 4), kernel="no_such_kernel", mode=mode)
    err = caught.value
    assert (err.reason, err.domain) == ("INVALID_FIELD", "hgemm")
    # GemmRequest.options.kernel; on a stream, GemmHeader's (GemmStreamRequest.header).
    field = "options.kernel" if mode == "unary" else "header.options.kernel"
    assert [v.field for v in err.field_violations] == [field], err
    assert "no_such_kernel" in err.field_violations[0].description
    assert err.quota_violations == () and err.retry_delay is None
    assert err.rpc_status.code == err.code.value[0]


def test_a_streamed_gemm_alone_carries_its_details(client, rng):
    """One GEMM of gemm_many failing on its own: its GemmDone.status becomes its Error's."""
    a, b = fp16(rng, 4, 8), fp16(rng, 8, 4)
    gone = client.upload(b)
    client.release(gone)
    results = client.gemm_many([(a, b), (a, gone)], return_exceptions=True)
    assert isinstance(results[0], np.ndarray)
    err = results[1]
    assert isinstance(err, hgemm.NotFound), err
    assert (err.reason, err.domain) == ("NOT_FOUND", "hgemm")
    assert err.field_violations == () and err.retry_delay is None


def test_resource_exhausted_names_the_limit(strict_server, rng):
    with hgemm.Client(strict_server.address, timeout=60) as c:
        with pytest.raises(hgemm.ResourceExhausted) as caught:
            c.upload(fp16(rng, 32, 32))  # 2048 bytes, over the 1024-byte quota
    err = caught.value
    assert err.reason == "OVER_LIMIT"
    assert [v.subject for v in err.quota_violations] == ["resident_quota_bytes"], err
    assert err.field_violations == ()


def test_queue_full_says_when_to_retry(strict_server, rng):
    with hgemm.Client(strict_server.address, timeout=60, retries=1) as c:
        with pytest.raises(hgemm.Unavailable) as caught:
            c.gemm(fp16(rng, 4, 8), fp16(rng, 8, 4))
    err = caught.value
    assert err.reason == "QUEUE_FULL"
    assert err.retry_delay == pytest.approx(0.05)
    assert _errors.unavailable_not_run(err)


def test_features_say_what_the_server_offers(client):
    features = client.info().features
    assert features.error_details and features.parallel_parts
    assert not (features.shared_memory or features.tls or features.authentication)


def status_with(*details) -> bytes:
    status = status_pb2.Status(code=14, message="busy")
    for d in details:
        status.details.add().Pack(d)
    return status.SerializeToString()


def test_details_are_read_from_grpcios_trailer():
    class Failed(Exception):
        def code(self):
            return hgemm.StatusCode.UNAVAILABLE

        def details(self):
            return "busy"

        def trailing_metadata(self):
            retry = error_details_pb2.RetryInfo()
            retry.retry_delay.FromMilliseconds(1500)
            return (("grpc-status-details-bin", status_with(retry)),)

    err = _errors.from_rpc_error(Failed())
    assert isinstance(err, hgemm.Unavailable)
    assert err.retry_delay == pytest.approx(1.5)
    assert _errors.unavailable_not_run(err), "a RetryInfo says that nothing ran"


def test_backoff_is_at_least_the_retry_delay():
    retry = error_details_pb2.RetryInfo()
    retry.retry_delay.FromMilliseconds(700)
    err = _errors.from_code(14, "busy", rpc_status=_errors.parse_status(status_with(retry)))
    policy = _retry.RetryPolicy(initial_backoff_s=0.001)
    assert policy.delay(0, [err]) == pytest.approx(0.7)
    assert policy.delay(0) < 0.01


def test_errors_without_details_have_none():
    err = _errors.from_code(3, "k: must be at least 1", rpc_status=_errors.parse_status(b"\xff"))
    assert err.reason is None and err.field_violations == () and err.rpc_status is None
