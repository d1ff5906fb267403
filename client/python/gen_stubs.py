#!/usr/bin/python3
"""Generates hgemm/_proto/hgemm_pb2{,_grpc}.py from proto/hgemm.proto, and status_pb2.py and
error_details_pb2.py from the google.rpc messages it sends errors in (proto/google/rpc).

The stubs are committed, so that `pip install ./client/python` needs neither protoc nor the
repository's proto/ folder. They come from Debian's `protoc` and `grpc_python_plugin` (package
protobuf-compiler-grpc); Debian's grpc_tools (1.14) is too old for `optional` fields. The
google.rpc modules sit beside hgemm_pb2 (imported relatively), so that the package needs no
googleapis-common-protos.

    client/python/gen_stubs.py           rewrite the stubs
    client/python/gen_stubs.py --check   exit 1 if the committed stubs differ from fresh ones (CI)
"""
import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
PROTO = HERE.parent.parent / "proto" / "hgemm.proto"
GOOGLE_RPC = ("google/rpc/status.proto", "google/rpc/error_details.proto")
OUT = HERE / "hgemm" / "_proto"
FILES = ("hgemm_pb2.py", "hgemm_pb2_grpc.py", "status_pb2.py", "error_details_pb2.py")


def make_relative(path: pathlib.Path, top_level: str, relative: str) -> None:
    """Replaces the import line `top_level` of a generated module by `relative` (the modules
    are top-level for protoc; inside the package they are imported relatively)."""
    text = path.read_text()
    fixed = text.replace(f"\n{top_level}\n", f"\n{relative}\n")
    if fixed == text:
        sys.exit(f"gen_stubs: {top_level!r} was not found in {path.name}")
    path.write_text(fixed)


def generate(out_dir: pathlib.Path) -> None:
    protoc = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if not protoc or not plugin:
        sys.exit("gen_stubs: protoc and grpc_python_plugin are needed "
                 "(apt-get install protobuf-compiler protobuf-compiler-grpc)")
    subprocess.run([protoc, f"-I{PROTO.parent}", f"--python_out={out_dir}",
                    f"--grpc_out={out_dir}", f"--plugin=protoc-gen-grpc={plugin}", PROTO.name,
                    *GOOGLE_RPC], check=True)
    for proto in GOOGLE_RPC:
        module = pathlib.Path(proto).stem + "_pb2.py"
        (out_dir / proto).with_name(module).rename(out_dir / module)
    shutil.rmtree(out_dir / "google")
    make_relative(out_dir / "hgemm_pb2_grpc.py", "import hgemm_pb2 as hgemm__pb2",
                  "from . import hgemm_pb2 as hgemm__pb2")
    make_relative(out_dir / "hgemm_pb2.py",
                  "from google.rpc import status_pb2 as google_dot_rpc_dot_status__pb2",
                  "from . import status_pb2 as google_dot_rpc_dot_status__pb2")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed stubs instead of writing them")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = pathlib.Path(tmp)
        generate(tmp_dir)
        if args.check:
            stale = [f for f in FILES if not (OUT / f).exists() or
                     (OUT / f).read_bytes() != (tmp_dir / f).read_bytes()]
            if stale:
                print(f"gen_stubs: {', '.join(stale)} differ from {PROTO.name}; "
                      f"run client/python/gen_stubs.py and commit", file=sys.stderr)
                return 1
            print("gen_stubs: stubs match proto/")
            return 0
        OUT.mkdir(parents=True, exist_ok=True)
        for f in FILES:
            shutil.copyfile(tmp_dir / f, OUT / f)
        print(f"gen_stubs: wrote {', '.join(str(OUT / f) for f in FILES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
