#!/usr/bin/python3
"""Generates hgemm/_proto/hgemm_pb2{,_grpc}.py from proto/hgemm.proto.

The stubs are committed, so that `pip install ./client/python` needs neither protoc nor the
repository's proto/ folder. They come from Debian's `protoc` and `grpc_python_plugin` (package
protobuf-compiler-grpc); Debian's grpc_tools (1.14) is too old for `optional` fields.

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
OUT = HERE / "hgemm" / "_proto"
FILES = ("hgemm_pb2.py", "hgemm_pb2_grpc.py")


def generate(out_dir: pathlib.Path) -> None:
    protoc = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if not protoc or not plugin:
        sys.exit("gen_stubs: protoc and grpc_python_plugin are needed "
                 "(apt-get install protobuf-compiler protobuf-compiler-grpc)")
    subprocess.run([protoc, f"-I{PROTO.parent}", f"--python_out={out_dir}",
                    f"--grpc_out={out_dir}", f"--plugin=protoc-gen-grpc={plugin}", PROTO.name],
                   check=True)
    # The plugin imports the messages as a top-level module; inside the package it is relative.
    grpc_file = out_dir / "hgemm_pb2_grpc.py"
    text = grpc_file.read_text()
    fixed = text.replace("\nimport hgemm_pb2 as hgemm__pb2\n", "\nfrom . import hgemm_pb2 as hgemm__pb2\n")
    if fixed == text:
        sys.exit("gen_stubs: the generated gRPC stub's import line was not found")
    grpc_file.write_text(fixed)


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
            print("gen_stubs: stubs match proto/hgemm.proto")
            return 0
        OUT.mkdir(parents=True, exist_ok=True)
        for f in FILES:
            shutil.copyfile(tmp_dir / f, OUT / f)
        print(f"gen_stubs: wrote {', '.join(str(OUT / f) for f in FILES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
