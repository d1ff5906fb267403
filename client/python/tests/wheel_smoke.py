"""The native core of an installed hgemm wheel, used through its C ABI (client/c/hgemm.h) with
ctypes alone: for a Python that has the wheel and nothing else (no numpy, grpcio or protobuf, so
`import hgemm` is out of reach), run by test_wheel.py. Loads libhgemm_client.so from where the
package is installed, asks the server at TARGET for its info and runs one GEMM, checked exactly
(small integers: fp16 and fp32 accumulation represent every sum). Prints the library's path, the
server's backend and the shared libraries that loading and using it mapped into the process, as
JSON; exits non-zero on any failure.

    python wheel_smoke.py TARGET          # e.g. 127.0.0.1:50051
"""
import ctypes
import importlib.util
import json
import os
import struct
import sys

M, N, K = 3, 4, 5
TIMEOUT_MS = 30000


def load() -> ctypes.CDLL:
    # find_spec locates the package without importing it (its __init__ needs numpy).
    package_dir = importlib.util.find_spec("hgemm").submodule_search_locations[0]
    lib = ctypes.CDLL(os.path.join(package_dir, "libhgemm_client.so"))
    lib.hgemm_client_options_create.restype = ctypes.c_void_p
    lib.hgemm_client_options_set_timeout_ms.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.hgemm_client_options_destroy.argtypes = [ctypes.c_void_p]
    lib.hgemm_client_create.restype = ctypes.c_void_p
    lib.hgemm_client_create.argtypes = [ctypes.c_char_p, ctypes.c_void_p,
                                        ctypes.POINTER(ctypes.c_int),
                                        ctypes.POINTER(ctypes.c_char_p)]
    lib.hgemm_client_destroy.argtypes = [ctypes.c_void_p]
    lib.hgemm_server_info_json.restype = ctypes.c_void_p  # freed with hgemm_free
    lib.hgemm_server_info_json.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                           ctypes.POINTER(ctypes.c_int),
                                           ctypes.POINTER(ctypes.c_char_p)]
    lib.hgemm_gemm.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                               ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p,
                               ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
                               ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                               ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_char_p)]
    lib.hgemm_free.argtypes = [ctypes.c_void_p]
    return lib


def mapped() -> set:
    """The files of the shared libraries mapped into this process: what the loader really
    loaded, where ldd only predicts it."""
    with open("/proc/self/maps") as maps:
        fields = [line.split(None, 5) for line in maps]
    return {f[5].strip() for f in fields if len(f) == 6 and ".so" in f[5]}


def check(what: str, code: ctypes.c_int, err: ctypes.c_char_p) -> None:
    if code.value != 0:
        sys.exit(f"{what} failed: code {code.value}: {err.value.decode(errors='replace')}")


def main(target: str) -> None:
    before = mapped()
    lib = load()
    if lib.hgemm_abi_version() != 1:
        sys.exit(f"ABI version {lib.hgemm_abi_version()}, not 1")
    code, err = ctypes.c_int(0), ctypes.c_char_p()
    options = lib.hgemm_client_options_create()
    lib.hgemm_client_options_set_timeout_ms(options, TIMEOUT_MS)
    client = lib.hgemm_client_create(target.encode(), options, ctypes.byref(code),
                                     ctypes.byref(err))
    lib.hgemm_client_options_destroy(options)
    check("hgemm_client_create", code, err)
    try:
        raw = lib.hgemm_server_info_json(client, None, ctypes.byref(code), ctypes.byref(err))
        check("hgemm_server_info_json", code, err)
        server_info = json.loads(ctypes.string_at(raw).decode())
        lib.hgemm_free(raw)

        a = [float((i % 7) - 3) for i in range(M * K)]  # row-major M×K
        b = [float((i % 5) - 2) for i in range(K * N)]  # row-major K×N
        a_bytes, b_bytes = struct.pack(f"<{M * K}e", *a), struct.pack(f"<{K * N}e", *b)
        c = ctypes.create_string_buffer(2 * M * N)
        lib.hgemm_gemm(client, None, M, N, K, a_bytes, len(a_bytes), b_bytes, len(b_bytes), c,
                       len(c), None, ctypes.byref(code), ctypes.byref(err))
        check("hgemm_gemm", code, err)
        got = list(struct.unpack(f"<{M * N}e", c.raw))
        want = [sum(a[i * K + p] * b[p * N + j] for p in range(K))
                for i in range(M) for j in range(N)]
        if got != want:
            sys.exit(f"C = {got}, expected {want}")
    finally:
        lib.hgemm_client_destroy(client)
    print(json.dumps({"library": lib._name, "backend": server_info["backend"],
                      "loaded": sorted(mapped() - before)}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: wheel_smoke.py TARGET")
    main(sys.argv[1])
