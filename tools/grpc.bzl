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

def cc_grpc_library(name, src, deps = [], imports = [], **kwargs):
    """Code for one .proto file of this package.

    Generated headers are included as "<package>/<stem>.pb.h" and "<package>/<stem>.grpc.pb.h".
    imports: the .proto files `src` imports by their path under this package (as
    cc_proto_messages names them: "google/rpc/status.proto"); deps holds their code.
    """
    _grpc_cc(
        name,
        _outs(src.rsplit(".", 1)[0]),
        "--proto_path=. --proto_path=%s --cpp_out=$(GENDIR) --grpc_out=$(GENDIR) $(location %s)" % (
            native.package_name(),
            src,
        ),
        [src] + imports,
        deps,
        [],
        **kwargs
    )

def cc_proto_messages(name, srcs, **kwargs):
    """Message code (no services) for .proto files named by their path under this package, as
    other .proto files import them and as their public copies are named: srcs
    "google/rpc/status.proto" makes "google/rpc/status.pb.h", included by that path.
    """
    native.genrule(
        name = name + "_codegen",
        srcs = srcs,
        outs = [s.rsplit(".", 1)[0] + ext for s in srcs for ext in [".pb.h", ".pb.cc"]],
        cmd = "/usr/bin/protoc --proto_path=%s --cpp_out=$(RULEDIR) %s" % (
            native.package_name(),
            " ".join(srcs),
        ),
        message = "protoc " + name,
    )
    native.cc_library(
        name = name,
        srcs = [s.rsplit(".", 1)[0] + ".pb.cc" for s in srcs],
        hdrs = [s.rsplit(".", 1)[0] + ".pb.h" for s in srcs],
        includes = ["."],
        deps = ["@system//:protobuf"],
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
