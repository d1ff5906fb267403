"""The choice of core (hgemm.info(), $HGEMM_TRANSPORT, $HGEMM_NATIVE_LIB) and what only the
native core does. The rest of the suite runs against both cores (tools/test_python.sh)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import hgemm
from conftest import FP32_TOLERANCE, fp16, rel_error

_INFO = "import hgemm, json; print(json.dumps(hgemm.info()))"


def _info_in_child(**env) -> dict:
    import json
    out = subprocess.run([sys.executable, "-c", _INFO], env={**os.environ, **env},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_info_reports_the_core_new_clients_use(server):
    info = hgemm.info()
    assert info["core"] in ("native", "grpcio")
    with hgemm.Client(server.address) as c:
        assert (c._calls.native is not None) == (info["core"] == "native")
    if info["core"] == "native":
        assert info["abi_version"] == 1 and os.path.exists(info["library"])
        assert info["reason"] is None
    else:
        assert info["library"] is None and info["reason"]


def test_grpcio_is_the_fallback_when_the_library_is_missing():
    info = _info_in_child(HGEMM_TRANSPORT="auto", HGEMM_NATIVE_LIB="/nonexistent/libhgemm.so")
    assert info["core"] == "grpcio"
    assert "/nonexistent/libhgemm.so" in info["reason"]
    assert _info_in_child(HGEMM_TRANSPORT="grpcio")["core"] == "grpcio"


def test_forcing_native_without_the_library_raises():
    code = "import hgemm; hgemm.Client('127.0.0.1:1')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "HGEMM_TRANSPORT": "native",
                              "HGEMM_NATIVE_LIB": "/nonexistent/libhgemm.so"})
    assert out.returncode != 0 and "OSError" in out.stderr, out.stderr


def test_channel_options_keep_a_client_on_grpcio(server):
    with hgemm.Client(server.address, channel_options=[("grpc.enable_retries", 0)]) as c:
        assert c._calls.native is None


def test_native_threads_share_one_client(server, rng):
    if hgemm.info()["core"] != "native":
        pytest.skip("the native core is not in use: " + str(hgemm.info()["reason"]))
    import concurrent.futures
    pairs = [(fp16(rng, 96 + i, 64), fp16(rng, 64, 80)) for i in range(16)]
    with hgemm.Client(server.address, timeout=60) as c, \
            concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: c.gemm(*p, mode="stream" if p[0].shape[0] % 2 else
                                                   "unary"), pairs))
    for (a, b), out in zip(pairs, results):
        assert out.dtype == np.float16 and not out.flags.writeable
        assert rel_error(out, a, b) < FP32_TOLERANCE
