"""torch tensors in and out (skipped without torch)."""
import numpy as np
import pytest

import hgemm
from conftest import FP32_TOLERANCE, rel_error

torch = pytest.importorskip("torch")


def test_cpu_float16_tensors_and_as_torch(client):
    a = torch.rand(33, 44, dtype=torch.float16)
    b = torch.rand(44, 55, dtype=torch.float16)
    c = client.gemm(a, b)
    assert isinstance(c, np.ndarray) and c.dtype == np.float16
    assert rel_error(c, a.numpy(), b.numpy()) < FP32_TOLERANCE
    for mode in ("unary", "stream"):
        t = client.gemm(a, b, as_torch=True, mode=mode)
        assert isinstance(t, torch.Tensor) and t.dtype == torch.float16 and t.shape == (33, 55)
        assert rel_error(t.numpy(), a.numpy(), b.numpy()) < FP32_TOLERANCE
        t += 1  # an ordinary tensor, though numpy results are read-only


def test_non_contiguous_and_grad_tensors(client):
    a = torch.rand(40, 30, dtype=torch.float16).t()  # 30x40, not contiguous
    b = torch.rand(40, 20, dtype=torch.float16, requires_grad=True)
    c = client.gemm(a, b, mode="stream")
    assert rel_error(c, a.contiguous().numpy(), b.detach().numpy()) < FP32_TOLERANCE


def test_float32_tensor_converted_with_warning(client):
    a = torch.rand(8, 9)
    b = torch.rand(9, 10, dtype=torch.float16)
    with pytest.warns(hgemm.ConversionWarning):
        c = client.gemm(a, b)
    assert rel_error(c, a.half().numpy(), b.numpy()) < FP32_TOLERANCE


def _bf16_reference(a, b):
    return a.double() @ b.double()


@pytest.mark.parametrize("c_dtype", [None, "fp32"])
def test_bfloat16_tensors_go_as_bf16(client, c_dtype):
    a = torch.rand(33, 17, dtype=torch.bfloat16) - 0.5
    w = torch.rand(9, 17, dtype=torch.bfloat16) - 0.5   # nn.Linear's weight: out x in
    c = client.gemm(a, w.t(), c_dtype=c_dtype, as_torch=True)  # w.t() goes as transpose_b
    assert c.dtype == (torch.float32 if c_dtype else torch.bfloat16) and c.shape == (33, 9)
    ref = _bf16_reference(a, w.t())
    tolerance = 1e-4 if c_dtype else 4e-3
    assert ((c.double() - ref).norm() / ref.norm()).item() < tolerance
    with client.upload(w.t().contiguous()) as hw:  # a bf16 resident matrix, k x n
        assert hw.dtype == "bf16"
        c2 = client.gemm(a, hw, c_dtype=c_dtype, as_torch=True)
        assert ((c2.double() - ref).norm() / ref.norm()).item() < tolerance


def test_bfloat16_and_float16_do_not_mix(client):
    a = torch.rand(4, 4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="mixing dtypes"):
        client.gemm(a, a.half())


def test_resident_download_as_torch(client):
    b = torch.rand(12, 13, dtype=torch.float16)
    with client.upload(b) as hb:
        t = hb.download(as_torch=True)
        assert isinstance(t, torch.Tensor) and torch.equal(t, b)


def test_cuda_tensors(client):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    a = torch.rand(64, 32, dtype=torch.float16, device="cuda")
    b = torch.rand(32, 16, dtype=torch.float16, device="cuda")
    c = client.gemm(a, b, as_torch="cuda")
    assert c.is_cuda
    assert rel_error(c.cpu().numpy(), a.cpu().numpy(), b.cpu().numpy()) < FP32_TOLERANCE
