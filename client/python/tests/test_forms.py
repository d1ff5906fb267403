"""Layouts and types against a real hgemm_server (CPU backend): transposed views go
as stored with transpose_a / transpose_b, fp32 C, unary and streamed, each against float64."""
import numpy as np
import pytest

from conftest import FP32_TOLERANCE, fp16
from hgemm._spec import Spec


def error64(c, a, b) -> float:
    ref = a.astype(np.float64) @ b.astype(np.float64)
    return float(np.linalg.norm(c.astype(np.float64) - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("mode", ["unary", "stream"])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("c_dtype", [None, "fp32"])
def test_transposed_views_and_fp32_c(client, rng, mode, ta, tb, c_dtype):
    m, n, k = 37, 29, 53
    a = fp16(rng, k, m).T if ta else fp16(rng, m, k)  # a view: op(A) = stored.T
    b = fp16(rng, n, k).T if tb else fp16(rng, k, n)
    c = client.gemm(a, b, mode=mode, c_dtype=c_dtype)
    assert c.shape == (m, n) and c.dtype == (np.float32 if c_dtype else np.float16)
    assert error64(c, a, b) < (1e-5 if c_dtype else FP32_TOLERANCE)


def test_transposed_view_is_sent_as_stored_not_copied(rng):
    w = fp16(rng, 9, 17)  # nn.Linear's weight layout: out x in
    spec = Spec(fp16(rng, 5, 17), w.T)
    assert spec.b.transposed and not spec.a.transposed
    assert np.shares_memory(spec.b.array, w)  # w itself goes, as stored
    assert (spec.m, spec.n, spec.k) == (5, 9, 17)


def test_gemm_many_mixes_layouts(client, rng):
    a, w = fp16(rng, 8, 12), fp16(rng, 6, 12)
    c1, c2 = client.gemm_many([(a, w.T), (a, np.ascontiguousarray(w.T), {"c_dtype": "fp32"})])
    assert error64(c1, a, w.T) < FP32_TOLERANCE and c2.dtype == np.float32
    assert error64(c2, a, w.T) < 1e-5


def test_kept_fp32_c_downloads_as_float32(client, rng):
    a, w = fp16(rng, 8, 12), fp16(rng, 6, 12)
    with client.gemm(a, w.T, c_dtype="fp32", keep_c=True) as hc:
        assert hc.dtype == "fp32" and hc.bytes == 4 * 8 * 6
        c = hc.download()
        assert c.dtype == np.float32 and error64(c, a, w.T) < 1e-5
        with pytest.raises(ValueError, match="mixing dtypes"):  # refused before sending
            client.gemm(hc, fp16(rng, 6, 3))


def test_kernels_say_layouts_and_types(client):
    for k in client.kernels():
        assert set(k.layouts) == {"NN", "NT", "TN", "TT"}, k
        assert ("bf16", "fp32") in k.types and ("fp16", "fp16") in k.types, k


def test_bad_c_dtype_is_refused_locally(client, rng):
    with pytest.raises(ValueError, match="c_dtype"):
        client.gemm(fp16(rng, 2, 2), fp16(rng, 2, 2), c_dtype="bf16")
