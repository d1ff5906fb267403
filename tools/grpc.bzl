"""C++ message and gRPC service code from .proto files: protoc + grpc_cpp_plugin (Debian)."""

_PLUGIN = "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin"

def _outs(stem):
    return [stem + ext for ext in [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]]

def _grpc_cc(name, outs, protoc_args, srcs, deps, includes, **kwargs):
    native.genrule(
        name = name + "_codegen",
        srcs = srcs,
        outs = outs,
        cmd = "/usr/bin/protoc %s %s" % (_PLUGIN, protoc_args),
        message = "protoc " + name,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        includes = includes,
        deps = deps + ["@system//:grpc"],
        **kwargs
    )

def cc_grpc_library(name, src, deps = [], **kwargs):
    """Code for one .proto file of this package.

    Generated headers are included as "<package>/<stem>.pb.h" and "<package>/<stem>.grpc.pb.h".
    """
    _grpc_cc(
        name,
        _outs(src.rsplit(".", 1)[0]),
        "--proto_path=. --cpp_out=$(GENDIR) --grpc_out=$(GENDIR) $(location %s)" % src,
        [src],
        deps,
        [],
        **kwargs
    )

def system_cc_grpc_library(name, proto, proto_root = "/usr/share/grpc-proto", **kwargs):
    """Code for a .proto installed on the system (e.g. grpc/health/v1/health.proto).

    Generated headers are included by the proto's own path ("grpc/health/v1/health.pb.h").
    """
    _grpc_cc(
        name,
        _outs(proto.rsplit(".", 1)[0]),
        "--proto_path=%s --cpp_out=$(RULEDIR) --grpc_out=$(RULEDIR) %s" % (proto_root, proto),
        [],
        [],
        ["."],
        **kwargs
    )
