"""alpha/beta with a C input (issue 29) against a real hgemm_server (CPU backend):
C = alpha·op(A)·op(B) + beta·C_in, unary and streamed, fp16 and fp32 C, C_in inline or a kept
C by handle, each against float64; beta 0 never reads C_in."""
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
