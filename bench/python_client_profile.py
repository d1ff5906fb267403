#!/usr/bin/python3
"""Where the Python client's time per GEMM goes: its own stages, gRPC Python's floor, the call.

For each shape (default: the issue-16 ones, 2048³ with A and B sent and 128x8192x8192 with B
resident) it prints, in milliseconds per GEMM:
  * offline: the client's own work with no network: prepare (checks, Spec), encode (the
    GemmRequest's bytes), decode (a GemmResponse of the right size read into C).
  * echo (with --echo_server): a plain gRPC Python unary call moving the same bytes (request
    and response sizes of the GEMM, raw bytes, no protobuf) against bench/echo_server: what any
    Python client pays to gRPC Python itself, at each --concurrency (threads, one channel each).
  * call (with --server, or --fake_server): the hgemm client's unary path, stage by stage:
    prepare, encode, rpc (the gRPC call's wall time) minus the server's own server_total_ms,
    decode; and, at each --concurrency, calls/s and client CPU per call, for unary calls, for
    one GemmStream per GEMM (gemm(mode="stream")), and for a long-lived stream per thread
    (c.stream(), "session"), one GEMM in flight per thread.
--fake_server starts a stand-in GemmService in a second Python process: it answers Gemm and
GemmStream with C of the right size (zeros) at once, so that the client's costs show on a
machine without a GPU (the CPU backend takes seconds per GEMM at these shapes), and Echo, for
the echo lines when there is no --echo_server. It is only a profiling aid: it checks nothing and
is not the server.
CPU per call is the process's user+system time (getrusage) over the calls, faults its minor page
faults: together a measure of the client's cost that does not depend on how fast the server is.

    /usr/bin/python3 bench/python_client_profile.py --echo_server=127.0.0.1:50061 \\
        --server=127.0.0.1:50051 [--shapes=2048x2048x2048:none 128x8192x8192:b] [--cprofile]
    /usr/bin/python3 bench/python_client_profile.py --fake_server
"""
import argparse
import cProfile
import io
import os
import pstats
import resource
import sys
import threading
import time

import numpy as np

try:  # an installed package, or one on PYTHONPATH (e.g. an older checkout's, to compare)
    import hgemm
except ImportError:  # run from a clone without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                    "python"))
    import hgemm
from hgemm import _resident, _results, _spec, _wire  # noqa: E402
from hgemm._proto import hgemm_pb2 as pb  # noqa: E402

DEFAULT_SHAPES = ["2048x2048x2048:none", "128x8192x8192:b"]


def parse_shape(text):
    shape, resident = text.split(":")
    m, n, k = (int(x) for x in shape.split("x"))
    if resident not in ("none", "b"):
        raise ValueError(f"shape {text!r}: resident none|b")
    return m, n, k, resident


class Usage:
    """Process CPU time (ms) and minor page faults between start and stop."""

    def __enter__(self):
        self.r0 = resource.getrusage(resource.RUSAGE_SELF)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        self.wall_s = time.perf_counter() - self.t0
        self.cpu_ms = 1e3 * (r1.ru_utime - self.r0.ru_utime + r1.ru_stime - self.r0.ru_stime)
        self.faults = r1.ru_minflt - self.r0.ru_minflt


def median_ms(samples):
    return 1e3 * float(np.median(samples))


def unary_stages(a, b, reps, rpc):
    """The unary path stage by stage, as medians over reps (ms): prepare, encode, rpc (its wall
    time less the server's server_total_ms), decode, server_total_ms; and the CPU time and page
    faults per GEMM. rpc(request bytes) returns the _wire.GemmResponse (gRPC runs the
    deserializer inside the call)."""
    samples = []
    with Usage() as u:
        for _ in range(reps):
            t0 = time.perf_counter()
            spec = _spec.Spec(a, b)
            t1 = time.perf_counter()
            request = spec.unary_request()
            t2 = time.perf_counter()
            raw = rpc(request)
            t3 = time.perf_counter()
            r = _results.unary_result(None, spec, raw, True, False, time.monotonic())
            t4 = time.perf_counter()
            server = r.timing.server_total_ms / 1e3
            samples.append((t1 - t0, t2 - t1, t3 - t2 - server, t4 - t3, server))
            del request, raw, r
    return [median_ms(x) for x in zip(*samples)] + [u.cpu_ms / reps, u.faults / reps]


def _wire_response(m, n) -> bytes:
    return pb.GemmResponse(m=m, n=n, c=bytes(2 * m * n), request_id="profile",
                           timing=pb.Timing(kernel_ms=1.0),
                           execution=pb.Execution(kernel="k", backend="cuda")).SerializeToString()


def closed_loop(call, concurrency, duration_s, warmup_s):
    """Calls `call(i)` from `concurrency` threads: warmup_s, then duration_s measured on the same
    threads (a thread's malloc arena grows to its size in the warm-up): (calls/s, CPU ms and
    faults per call)."""
    count = [0] * concurrency
    phase = threading.Barrier(concurrency + 1)
    start = time.monotonic()
    stops = [start + warmup_s, start + warmup_s + duration_s]

    def worker(i):
        while time.monotonic() < stops[0]:
            call(i)
        phase.wait()  # all warm
        phase.wait()  # measuring
        while time.monotonic() < stops[1]:
            call(i)
            count[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    phase.wait()
    stops[1] = time.monotonic() + duration_s
    with Usage() as u:
        phase.wait()
        for t in threads:
            t.join()
    calls = max(sum(count), 1)
    return calls / u.wall_s, u.cpu_ms / calls, u.faults / calls


def echo_floor(target, up, down, concurrency, duration_s, warmup_s):
    """Raw unary calls of `up` bytes answered by `down` bytes (bench/echo.proto's Echo)."""
    payload = bytes(up)
    request = b"".join([b"\x0a", _wire.varint(up), payload, b"\x10", _wire.varint(down)])
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
               ("grpc.use_local_subchannel_pool", 1)]
    import grpc
    channels = [grpc.insecure_channel(target, options=options) for _ in range(concurrency)]
    calls = [ch.unary_unary("/hgemm.bench.EchoService/Echo") for ch in channels]
    try:
        return closed_loop(lambda i: calls[i](request, timeout=60), concurrency, duration_s,
                           warmup_s)
    finally:
        for ch in channels:
            ch.close()


# The stand-in server (--fake_server), in its own process.

def _key(field, wire_type):
    return _wire.varint(field << 3 | wire_type)


def _bytes_field(field, data):
    return b"".join([_key(field, 2), _wire.varint(len(data)), data])


class FakeService:
    """GemmService answering at once with zeros; what it receives is counted, not checked."""

    def __init__(self):
        self._responses = {}
        self._lock = threading.Lock()
        self._uploads = 0
        self._done = pb.GemmDone(timing=pb.Timing(server_total_ms=0.0),
                                 execution=pb.Execution(kernel="fake", backend="fake"))

    def gemm(self, raw, context):
        m = n = 0
        for number, value, _, _ in _wire.fields(raw):
            if number == 1:
                m = value
            elif number == 2:
                n = value
        with self._lock:
            response = self._responses.get((m, n))
            if response is None:
                response = self._responses[(m, n)] = pb.GemmResponse(
                    m=m, n=n, c=bytes(2 * m * n), timing=self._done.timing,
                    execution=self._done.execution).SerializeToString()
        return response

    def echo(self, raw, context):
        """bench/echo.proto's Echo: EchoReply{payload: reply_bytes zeros}."""
        reply_bytes = 0
        for number, value, _, _ in _wire.fields(raw):
            if number == 2:
                reply_bytes = value
        with self._lock:
            response = self._responses.get(reply_bytes)
            if response is None:
                response = self._responses[reply_bytes] = _bytes_field(1, bytes(reply_bytes))
        return response

    def gemm_stream(self, requests, context):
        pending = {}  # gemm_id → [operand bytes still to come, C bytes]
        for raw in requests:
            number, value, _, _ = next(_wire.fields(raw))
            if number == 1:
                h = pb.GemmStreamRequest.FromString(raw).header
                need = (0 if h.a_handle else 2 * h.m * h.k) + (0 if h.b_handle else 2 * h.k * h.n)
                pending[h.gemm_id] = [need, 2 * h.m * h.n]
                gemm_id = h.gemm_id
            else:
                gemm_id, size = 0, 0
                for field, v, _, _ in _wire.fields(raw, *value):
                    if field == 1:
                        gemm_id = v
                    elif field == 4:
                        size = v[1] - v[0]
                pending[gemm_id][0] -= size
            if pending[gemm_id][0] == 0:
                yield from self._answer(gemm_id, pending.pop(gemm_id)[1])

    def _answer(self, gemm_id, c_bytes):
        head = _key(1, 0) + _wire.varint(gemm_id) if gemm_id else b""
        chunk = 1 << 20
        zeros = bytes(min(chunk, c_bytes))
        for offset in range(0, c_bytes, chunk):
            data = memoryview(zeros)[:min(chunk, c_bytes - offset)]
            inner = b"".join([_key(1, 0) + _wire.varint(offset) if offset else b"",
                              _bytes_field(2, data)])
            yield b"".join([head, _bytes_field(2, inner)])
        yield head + _bytes_field(3, self._done.SerializeToString())

    def upload(self, requests, context):
        header = pb.UploadMatrixRequest.FromString(next(requests)).header
        for _ in requests:
            pass
        with self._lock:
            self._uploads += 1
            handle = f"m-fake-{self._uploads}"
        return pb.MatrixInfo(handle=handle, rows=header.rows, cols=header.cols,
                             bytes=2 * header.rows * header.cols, device_id=-1)


def serve_fake():
    """Runs the stand-in server on a free port of 127.0.0.1, printing the port; until killed."""
    import concurrent.futures
    import grpc
    service = FakeService()
    raw = dict(request_deserializer=None, response_serializer=None)
    handlers = {
        "Gemm": grpc.unary_unary_rpc_method_handler(service.gemm, **raw),
        "GemmStream": grpc.stream_stream_rpc_method_handler(service.gemm_stream, **raw),
        "UploadMatrix": grpc.stream_unary_rpc_method_handler(
            service.upload, response_serializer=pb.MatrixInfo.SerializeToString),
        "ReleaseMatrix": grpc.unary_unary_rpc_method_handler(
            lambda r, ctx: pb.ReleaseMatrixResponse(),
            request_deserializer=pb.ReleaseMatrixRequest.FromString,
            response_serializer=pb.ReleaseMatrixResponse.SerializeToString),
        "GetServerInfo": grpc.unary_unary_rpc_method_handler(
            lambda r, ctx: pb.ServerInfo(version="fake", backend="fake", limits=pb.Limits(
                max_message_bytes=1 << 30, stream_chunk_bytes=1 << 20)),
            request_deserializer=pb.GetServerInfoRequest.FromString,
            response_serializer=pb.ServerInfo.SerializeToString),
    }
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=64),
                         options=[("grpc.max_receive_message_length", -1),
                                  ("grpc.max_send_message_length", -1)])
    echo = {"Echo": grpc.unary_unary_rpc_method_handler(service.echo, **raw)}
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("hgemm.v1.GemmService", handlers),
         grpc.method_handlers_generic_handler("hgemm.bench.EchoService", echo)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


def start_fake():
    """The stand-in server as a child process (its allocator tuned, so that it stays fast):
    (process, address)."""
    import subprocess
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(32 << 20),
               MALLOC_TRIM_THRESHOLD_=str(256 << 20))
    process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve_fake"],
                               stdout=subprocess.PIPE, text=True, env=env)
    return process, f"127.0.0.1:{process.stdout.readline().strip()}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument("--server", help="hgemm_server to run the client against (e.g. the CPU backend)")
    p.add_argument("--fake_server", action="store_true",
                   help="run the client against a stand-in server in a child process")
    p.add_argument("--serve_fake", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--echo_server", help="bench/echo_server, for gRPC Python's own cost")
    p.add_argument("--shapes", nargs="*", default=DEFAULT_SHAPES, help="MxNxK:none|b")
    p.add_argument("--concurrency", default="1,16", help="threads for the echo and call loops")
    p.add_argument("--reps", type=int, default=20, help="GEMMs per offline/stage measurement")
    p.add_argument("--warmup_s", type=float, default=5.0, help="warm-up of each closed loop")
    p.add_argument("--duration_s", type=float, default=10.0, help="measured part of each loop")
    p.add_argument("--cprofile", action="store_true",
                   help="print cProfile's top functions (offline)")
    args = p.parse_args()
    if args.serve_fake:
        return serve_fake()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    fake = None
    if args.fake_server:
        fake, args.server = start_fake()
        args.echo_server = args.echo_server or args.server
    try:
        return profile(args, concurrencies)
    finally:
        if fake is not None:
            fake.kill()
            fake.wait()


def profile(args, concurrencies):
    client = hgemm.Client(args.server, timeout=600, client_id="profile") if args.server else None

    for text in args.shapes:
        m, n, k, resident = parse_shape(text)
        rng = np.random.default_rng(1)
        a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
        b_array = rng.uniform(-1, 1, (k, n)).astype(np.float16)
        up = 2 * m * k + (0 if resident == "b" else 2 * k * n)
        print(f"{m}x{n}x{k} resident={resident}: {up / 2**20:.1f} MiB up, "
              f"{2 * m * n / 2**20:.1f} MiB down")
        b_offline = (_resident.ResidentMatrix(None, pb.MatrixInfo(handle="m-profile", rows=k,
                                                                  cols=n))
                     if resident == "b" else b_array)
        response = _wire_response(m, n)
        canned = lambda request: _wire.GemmResponse(response)  # noqa: E731
        unary_stages(a, b_offline, 3, canned)  # warm up the allocator
        prep, enc, parse, dec, _, cpu, faults = unary_stages(a, b_offline, args.reps, canned)
        print(f"  offline: prepare {prep:.3f}  encode {enc:.3f}  decode {parse + dec:.3f} ms  "
              f"(CPU {cpu:.2f} ms, {faults:.0f} faults per GEMM)")
        if args.cprofile:
            profiler = cProfile.Profile()
            profiler.enable()
            unary_stages(a, b_offline, args.reps, canned)
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(8)
            print("\n".join("    " + line for line in out.getvalue().splitlines()[4:]))
        if args.echo_server:
            for conc in concurrencies:
                rate, cpu, faults = echo_floor(args.echo_server, up, 2 * m * n, conc,
                                               args.duration_s, args.warmup_s)
                print(f"  echo c={conc}: {rate:.1f} calls/s, CPU {cpu:.2f} ms, {faults:.0f} faults "
                      f"per call")
        if client is not None:
            b = client.upload(b_array) if resident == "b" else b_array
            client.gemm(a, b, mode="unary")
            prep, enc, transport, dec, server, cpu, faults = unary_stages(
                a, b, max(3, args.reps // 4),
                lambda request: client._stub.Gemm(request, timeout=600))
            print(f"  call: prepare {prep:.3f}  encode {enc:.3f}  rpc - server {transport:.2f}  "
                  f"decode {dec:.3f} ms  (server_total {server:.2f} ms; CPU {cpu:.2f} ms, "
                  f"{faults:.0f} faults per GEMM)")
            modes = ["unary", "stream"] + (["session"] if hasattr(hgemm.Client, "stream") else [])
            for mode in modes:
                for conc in concurrencies:
                    clients = [hgemm.Client(args.server, timeout=600, client_id="profile")
                               for _ in range(conc)]
                    if mode == "session":
                        streams = [c.stream() for c in clients]
                        call = lambda i: streams[i].gemm(a, b)  # noqa: E731
                    else:
                        call = lambda i: clients[i].gemm(a, b, mode=mode)  # noqa: E731
                    rate, cpu, faults = closed_loop(call, conc, args.duration_s, args.warmup_s)
                    print(f"  {mode} c={conc}: {rate:.1f} calls/s, CPU {cpu:.2f} ms, "
                          f"{faults:.0f} faults per call")
                    if mode == "session":
                        for st in streams:
                            st.close()
                    for c in clients:
                        c.close()
            if resident == "b":
                b.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
