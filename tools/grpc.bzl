"""cc_grpc_library: protoc + grpc_cpp_plugin from Debian's packages, wrapped in a cc_library."""

def cc_grpc_library(name, src, deps = [], **kwargs):
    """C++ message and gRPC service code for one .proto file.

    Args:
      name: the cc_library's name.
      src: the .proto file (in this package); generated headers are included as
        "<package>/<stem>.pb.h" and "<package>/<stem>.grpc.pb.h".
      deps: further cc deps.
      **kwargs: passed to the cc_library.
    """
    stem = src.rsplit(".", 1)[0]
    outs = [stem + ext for ext in [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]]
    native.genrule(
        name = name + "_codegen",
        srcs = [src],
        outs = outs,
        cmd = " ".join([
            "/usr/bin/protoc",
            "--proto_path=.",
            "--cpp_out=$(GENDIR)",
            "--grpc_out=$(GENDIR)",
            "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin",
            "$(location %s)" % src,
        ]),
        message = "protoc %s" % src,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:grpc"],
        **kwargs
    )
