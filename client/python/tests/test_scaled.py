"""alpha/beta with a C input against a real hgemm_server (CPU backend):
C = alpha·op(A)·op(B) + beta·C_in, unary and streamed, fp16 and fp32 C, C_in inline or a kept
C by handle, and gemm_batched (strided-batched), each against float64; beta 0 never reads
C_in."""
import numpy as np
import pytest

from conftest import FP32_TOLERANCE, fp16
from hgemm._spec import Spec


def error64(c, expected) -> float:
    return float(np.linalg.norm(c.astype(np.float64) - expected) / np.linalg.norm(expected))


def scaled64(alpha, a, b, beta, c_in):
    return alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c_in.astype(np.float64)


@pytest.mark.parametrize("mode", ["unary", "stream"])
@pytest.mark.parametrize("c_dtype", [None, "fp32"])
def test_alpha_beta_match_float64(client, rng, mode, c_dtype):
    m, n, k = 37, 29, 53
    a, w = fp16(rng, m, k), fp16(rng, n, k)
    c_in = rng.uniform(-1, 1, (m, n)).astype(np.float32 if c_dtype else np.float16)
    c = client.gemm(a, w.T, alpha=0.5, beta=-1.25, c=c_in, mode=mode, c_dtype=c_dtype)
    assert c.shape == (m, n) and c.dtype == (np.float32 if c_dtype else np.float16)
    assert error64(c, scaled64(0.5, a, w.T, -1.25, c_in)) < (1e-5 if c_dtype else FP32_TOLERANCE)


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_beta_zero_never_reads_c(client, rng, mode):
    a, b = fp16(rng, 9, 7), fp16(rng, 7, 5)
    nan = np.full((9, 5), np.nan, dtype=np.float16)
    c = client.gemm(a, b, alpha=-2, c=nan, mode=mode)
    assert np.isfinite(c).all()
    assert error64(c, -2 * (a.astype(np.float64) @ b.astype(np.float64))) < FP32_TOLERANCE
    assert Spec(a, b, alpha=-2, c=nan).c_in is None  # not even sent


def test_kept_fp32_c_accumulates_by_handle(client, rng):
    a, b = fp16(rng, 8, 12), fp16(rng, 12, 6)
    with client.gemm(a, b, c_dtype="fp32", keep_c=True) as kept:
        first = kept.download()
        a2, b2 = fp16(rng, 8, 4), fp16(rng, 4, 6)
        c = client.gemm(a2, b2, beta=1, c=kept, c_dtype="fp32")
        assert error64(c, scaled64(1, a2, b2, 1, first)) < 1e-5


def test_scale_mistakes_are_refused_locally(rng):
    a, b = fp16(rng, 3, 4), fp16(rng, 4, 2)
    with pytest.raises(ValueError, match="beta"):
        Spec(a, b, beta=1)
    with pytest.raises(ValueError, match="m x n"):
        Spec(a, b, beta=1, c=np.zeros((2, 3), np.float16))


def test_kernels_say_which_take_alpha_beta(client):
    for k in client.kernels():
        assert ("bf16", "fp32") in k.scaled_types, k
        assert k.fused_scale, k  # the CPU backend's sgemm applies them in the same call


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_gemm_batched_matches_float64(client, rng, mode):
    batch, m, n, k = 5, 11, 7, 9
    a = np.stack([fp16(rng, m, k) for _ in range(batch)])
    w = np.stack([fp16(rng, n, k) for _ in range(batch)])
    b = [x.T for x in w]  # transposed views are packed (copied) as stored k x n
    c_in = rng.uniform(-1, 1, (batch, m, n)).astype(np.float32)
    c = client.gemm_batched(a, b, alpha=2, beta=0.5, c=c_in, c_dtype="fp32", mode=mode)
    assert c.shape == (batch, m, n) and c.dtype == np.float32
    for i in range(batch):
        assert error64(c[i], scaled64(2, a[i], b[i], 0.5, c_in[i])) < 1e-5, i
    plain = client.gemm_batched(a, b, mode=mode)
    assert plain.shape == (batch, m, n) and plain.dtype == np.float16
    for i in range(batch):
        assert error64(plain[i], a[i].astype(np.float64) @ b[i].astype(np.float64)) < FP32_TOLERANCE


def test_gemm_batched_mistakes_are_refused_locally(client, rng):
    a = np.stack([fp16(rng, 3, 4)] * 2)
    with pytest.raises(ValueError, match="batch"):
        client.gemm_batched(a, np.stack([fp16(rng, 4, 2)] * 3))
    with pytest.raises(ValueError, match="for each of the batch of 2"):
        client.gemm_batched(a, np.stack([fp16(rng, 4, 2)] * 2), beta=1,
                            c=np.zeros((3, 2), np.float16))
