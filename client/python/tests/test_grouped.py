"""Grouped GEMM (gemm_grouped) and bf16 with a transposed B against a real
hgemm_server (CPU backend), each against float64; run on both cores by tools/test_python.sh
(gemm_grouped goes through grpcio on either: the C ABI has no groups)."""
import asyncio

import numpy as np
import pytest

import hgemm
from conftest import FP32_TOLERANCE, fp16

# A bf16 C carries 8 significant bits: its rounding alone is ~2e-3 relative.
BF16_TOLERANCE = 4e-3


def bf16(rng, rows, cols):
    """(bf16 bit patterns as uint16, the same values as float64): random values in [-1, 1)."""
    bits = (rng.uniform(-1, 1, (rows, cols)).astype(np.float32).view(np.uint32) >> 16)
    bits = bits.astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def error64(c, expected) -> float:
    return float(np.linalg.norm(np.asarray(c, dtype=np.float64) - expected)
                 / np.linalg.norm(expected))


@pytest.mark.parametrize("c_dtype", [None, "fp32"])
def test_bf16_transpose_b_passes_the_check(client, rng, c_dtype):
    # The Python equivalent of
    #   hgemm_client --dtype=bf16 --transpose_b --shape=MxNxK --check
    # (README, "The GEMM users call"), at 96x80x112 against the CPU server.
    m, n, k = 96, 80, 112
    a_bits, a = bf16(rng, m, k)
    w_bits, w = bf16(rng, n, k)  # B stored n x k (nn.Linear's weight)
    r = client.gemm(a_bits, w_bits, dtype="bf16", transpose_b=True, c_dtype=c_dtype,
                    details=True)
    assert r.c.shape == (m, n) and r.c.dtype == np.float32  # a bf16 C widened, exactly
    assert error64(r.c, a @ w.T) < (1e-5 if c_dtype else BF16_TOLERANCE)
    assert r.execution.backend == "cpu"
    # The transposed view says the same: the same bytes go, the same C comes back.
    assert np.array_equal(client.gemm(a_bits, w_bits.T, dtype="bf16", c_dtype=c_dtype), r.c)


def test_dtype_and_transpose_mistakes_are_refused_locally(client, rng):
    a_bits, _ = bf16(rng, 4, 3)
    with pytest.raises(TypeError, match="dtype='bf16' takes uint16"):
        client.gemm(fp16(rng, 4, 3), fp16(rng, 3, 2), dtype="bf16")
    with pytest.raises(ValueError, match="dtype must be"):
        client.gemm(a_bits, a_bits, dtype="int8")
    with pytest.raises(ValueError, match="A's columns must equal B's rows"):
        client.gemm(a_bits, a_bits, dtype="bf16")  # 4x3 · 4x3 without transpose_b
    assert client.gemm(a_bits, a_bits, dtype="bf16", transpose_b=True).shape == (4, 4)


PROBLEMS = [(7, 5, 3), (1, 1, 1), (33, 17, 65), (61, 2, 93), (3, 40, 1)]


@pytest.mark.parametrize("c_dtype", [None, "fp32"])
def test_gemm_grouped_matches_float64(client, rng, c_dtype):
    pairs = [(fp16(rng, m, k), fp16(rng, k, n)) for m, n, k in PROBLEMS]
    c_in = [rng.uniform(-1, 1, (m, n)).astype(np.float32 if c_dtype else np.float16)
            for m, n, _ in PROBLEMS]
    r = client.gemm_grouped(pairs, alpha=0.5, beta=-1.5, c=c_in, c_dtype=c_dtype, details=True)
    assert len(r.c) == len(PROBLEMS)
    for (a, b), c, c0 in zip(pairs, r.c, c_in):
        assert c.shape == (a.shape[0], b.shape[1])
        assert c.dtype == (np.float32 if c_dtype else np.float16)
        expected = 0.5 * (a.astype(np.float64) @ b.astype(np.float64)) - 1.5 * c0
        assert error64(c, expected) < (1e-5 if c_dtype else FP32_TOLERANCE)
    assert r.execution.backend == "cpu" and r.timing.tflops > 0


def test_gemm_grouped_bf16_transposed_and_mixed_views(client, rng):
    bits = [(bf16(rng, m, k), bf16(rng, n, k)) for m, n, k in PROBLEMS]
    # transpose_b for all: each B given stored n x k.
    cs = client.gemm_grouped([(a[0], w[0]) for a, w in bits], dtype="bf16", transpose_b=True,
                             c_dtype="fp32")
    for (a, w), c in zip(bits, cs):
        assert error64(c, a[1] @ w[1].T) < 1e-5
    # Some Bs as transposed views, some not: one layout goes, the views copied into it.
    mixed = [(a[0], w[0].T if i % 2 else np.ascontiguousarray(w[0].T))
             for i, (a, w) in enumerate(bits)]
    for c, expected in zip(client.gemm_grouped(mixed, dtype="bf16", c_dtype="fp32"), cs):
        assert np.array_equal(c, expected)


def test_gemm_grouped_mistakes_are_refused(client, server, rng):
    a, b = fp16(rng, 3, 4), fp16(rng, 4, 2)
    with pytest.raises(ValueError, match="at least one"):
        client.gemm_grouped([])
    with pytest.raises(ValueError, match="needs c: one C_in per pair"):
        client.gemm_grouped([(a, b)], beta=1.0)
    a_bits, _ = bf16(rng, 3, 4)
    with pytest.raises(TypeError, match="uint16"):  # bf16 bits need dtype="bf16"
        client.gemm_grouped([(a, b), (a_bits, a_bits.T)])
    with pytest.raises(ValueError, match="pair 1: A is 4x3"):
        client.gemm_grouped([(a, b), (a.T, b)])
    with client.upload(b) as hb:
        with pytest.raises(ValueError, match="not resident matrices"):
            client.gemm_grouped([(a, hb)])
    # The server's limit (1024 problems by default): its refusal, and it keeps serving.
    one = fp16(rng, 1, 1)
    with pytest.raises(hgemm.ResourceExhausted, match="group has 1025 problems"):
        client.gemm_grouped([(one, one)] * 1025)
    assert error64(client.gemm_grouped([(a, b)])[0],
                   a.astype(np.float64) @ b.astype(np.float64)) < FP32_TOLERANCE
    assert client.info().limits.max_group_problems == 1024
    assert all(k.grouped for k in client.kernels())


def test_aio_gemm_grouped(server, rng):
    pairs = [(fp16(rng, m, k), fp16(rng, k, n)) for m, n, k in PROBLEMS]

    async def main():
        async with hgemm.aio.Client(server.address, timeout=120) as c:
            return await c.gemm_grouped(pairs)
    for (a, b), c in zip(pairs, asyncio.run(main())):
        assert error64(c, a.astype(np.float64) @ b.astype(np.float64)) < FP32_TOLERANCE
