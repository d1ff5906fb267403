#!/usr/bin/python3
"""Server CPU per byte of the parallel-parts data plane (is each copy gone?): against a
running hgemm_server (its pid given, to read its CPU time from /proc), uploads one matrix by
UploadPart in 1 MiB chunks and downloads it whole with DownloadMatrix, `--rounds` times, and
prints the server's CPU milliseconds per MiB of each direction (user + system, from
/proc/PID/stat, mean over the rounds), with the client's wall time (median). The client sends
pre-serialized requests and takes raw responses, so that its own protobuf work stays off the
numbers it prints.
  bench/server_copies.py --server 127.0.0.1:50391 --pid PID [--mib 64] [--rounds 8]
"""
import argparse
import os
import statistics
import sys
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "client", "python"))
from hgemm._proto import hgemm_pb2 as pb  # noqa: E402

SERVICE = "/hgemm.v1.GemmService/"
CHUNK = 1 << 20


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid`, in seconds."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    channel = grpc.insecure_channel(args.server, options=[
        ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
    create = channel.unary_unary(SERVICE + "CreateUpload",
                                 request_serializer=pb.UploadCreateRequest.SerializeToString,
                                 response_deserializer=pb.MatrixInfo.FromString)
    part = channel.stream_unary(SERVICE + "UploadPart",
                                response_deserializer=pb.PartResponse.FromString)
    download = channel.unary_stream(SERVICE + "DownloadMatrix",
                                    request_serializer=pb.DownloadMatrixRequest.SerializeToString)
    release = channel.unary_unary(SERVICE + "ReleaseMatrix",
                                  request_serializer=pb.ReleaseMatrixRequest.SerializeToString,
                                  response_deserializer=pb.ReleaseMatrixResponse.FromString)
    nbytes = args.mib << 20
    data = os.urandom(CHUNK)
    chunk = pb.PartRequest(chunk=data).SerializeToString()
    up_cpu, up_wall, down_cpu, down_wall = [], [], [], []
    for _ in range(args.rounds):
        info = create(pb.UploadCreateRequest(
            header=pb.MatrixHeader(rows=args.mib * 512, cols=1024)))
        assert info.bytes == nbytes, info
        header = pb.PartRequest(header=pb.PartHeader(handle=info.handle, offset=0, length=nbytes))
        messages = [header.SerializeToString()] + [chunk] * (nbytes // CHUNK)
        cpu, wall = cpu_seconds(args.pid), time.perf_counter()
        assert part(iter(messages)).missing_bytes == 0
        up_cpu.append(cpu_seconds(args.pid) - cpu)
        up_wall.append(time.perf_counter() - wall)
        cpu, wall = cpu_seconds(args.pid), time.perf_counter()
        got = sum(len(m) for m in download(pb.DownloadMatrixRequest(handle=info.handle)))
        down_cpu.append(cpu_seconds(args.pid) - cpu)
        down_wall.append(time.perf_counter() - wall)
        assert got > nbytes, got  # the data plus each chunk's few bytes of framing
        release(pb.ReleaseMatrixRequest(handle=info.handle))
    # /proc counts CPU time in ticks (10 ms): the mean over every round resolves finer.
    for name, cpu, wall in (("UploadPart", up_cpu, up_wall),
                            ("DownloadMatrix", down_cpu, down_wall)):
        print(f"{name}: {args.mib} MiB x {args.rounds}: "
              f"server CPU {1e3 * sum(cpu) / len(cpu) / args.mib:.3f} "
              f"ms/MiB (mean), client wall {1e3 * statistics.median(wall):.1f} ms (median; "
              f"{args.mib / 1024 / statistics.median(wall):.2f} GB/s)")


if __name__ == "__main__":
    main()
