"""CUDA IPC (Client.cuda_gemm, hgemm.cuda_region): torch CUDA tensors shared with the server by
cudaIpcGetMemHandle, read and written in place on their GPU. The GPU test needs torch with
CUDA and a CUDA server binary (skips otherwise); the refusals run everywhere."""
import uuid

import grpc
import numpy as np
import pytest

import hgemm
from conftest import FP32_TOLERANCE, UnixServer


def unix_client(server):
    return hgemm.Client(server.unix, client_id=f"ipc-{uuid.uuid4().hex[:8]}", timeout=120)


def test_cuda_region_takes_only_torch_cuda_tensors():
    with pytest.raises(TypeError, match="torch CUDA tensor"):
        hgemm.cuda_region(np.zeros((2, 2), np.float16))


def test_cuda_gemm_needs_the_unix_socket(server):
    with hgemm.Client(server.address) as c, pytest.raises(ValueError, match="unix"):
        c.cuda_gemm(None, None, None)


def test_cpu_server_refuses_a_cuda_ipc_region_by_name(shm_server):
    # The request a torch client sends, with a handle that is never opened: a server without
    # --allow_cuda_ipc refuses it before anything else.
    with unix_client(shm_server) as c:
        with pytest.raises(grpc.RpcError) as refused:
            c._stub.RegisterRegion(hgemm.pb.RegisterRegionRequest(
                byte_size=4096, cuda_ipc=hgemm.pb.CudaIpcMemory(
                    handle=bytes(64), device="0000:00:00.0")))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "--allow_cuda_ipc" in refused.value.details()
        c.gemm(np.ones((4, 4), np.float16), np.ones((4, 4), np.float16))  # still serving


def _cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


@pytest.fixture(scope="module")
def cuda_server():
    """hgemm_server --backend=cuda with shared memory on, over its Unix socket."""
    _cuda_torch()
    s = UnixServer("--allow_shared_memory", "--allow_cuda_ipc", backend="cuda")
    yield s
    s.stop()


@pytest.mark.parametrize("dtype,c_fp32", [("float16", False), ("bfloat16", False),
                                          ("float16", True)])
def test_torch_cuda_tensors_in_place(cuda_server, dtype, c_fp32):
    torch = _cuda_torch()
    gen = torch.Generator(device="cuda").manual_seed(31)
    t = getattr(torch, dtype)
    m, n, k = 257, 130, 96
    a = (torch.rand(m, k, generator=gen, device="cuda") * 2 - 1).to(t)
    b = (torch.rand(k, n, generator=gen, device="cuda") * 2 - 1).to(t)
    c_in = (torch.rand(m, n, generator=gen, device="cuda") * 2 - 1)
    out = c_in.clone() if c_fp32 else c_in.to(t)
    expected = 0.5 * (a.double() @ b.double()) - 1.25 * out.double()
    with unix_client(cuda_server) as c:
        assert c.cuda_gemm(a, b, out, alpha=0.5, beta=-1.25) is out
        err = float(torch.linalg.norm(out.double() - expected) / torch.linalg.norm(expected))
        assert err < (FP32_TOLERANCE if dtype == "float16" else 1e-2)
        regions = c.regions().regions
        assert regions and all(r.cuda_ipc for r in regions)
        out.fill_(float("nan"))  # poisoned: a second GEMM over the same registrations
        c.cuda_gemm(a, b, out)
        assert len(c.regions().regions) == len(regions)
        assert not torch.isnan(out).any()
