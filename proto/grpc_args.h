// GrpcArg: a gRPC channel argument with an integer value (a GRPC_ARG_* of
// grpc/impl/codegen/grpc_types.h: read chunk sizes, HTTP/2 frame size and windows, BDP probing,
// TX zerocopy), for experiments with gRPC's transport without a rebuild. The server and the
// client binaries share one flag, repeated --grpc_arg=NAME=INT: the server sets each on its
// ServerBuilder, a client on every channel it makes.
// Thread safety: plain values and functions.
#ifndef HGEMM_PROTO_GRPC_ARGS_H_
#define HGEMM_PROTO_GRPC_ARGS_H_

#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>
#include <CLI/CLI.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace hgemm {

struct GrpcArg {
  std::string name;  // e.g. "grpc.http2.max_frame_size" (GRPC_ARG_HTTP2_MAX_FRAME_SIZE)
  int value = 0;

  bool operator==(const GrpcArg&) const = default;
};

// "NAME=INT" into *arg: "" on success, else what is wrong (no '=', a name not starting with
// "grpc.", where gRPC's own arguments live and where a typo would be ignored silently; a value
// that is not a 32-bit integer). *arg is untouched on failure.
std::string ParseGrpcArg(std::string_view text, GrpcArg* arg);

// Registers --grpc_arg=NAME=INT (repeatable) on `app`, parsed into *args.
// REQUIRES: `args` outlives the parse.
void AddGrpcArgFlag(CLI::App* app, std::vector<GrpcArg>* args);

// Sets each of `args` on a client channel's arguments, or on a server.
void ApplyGrpcArgs(const std::vector<GrpcArg>& args, grpc::ChannelArguments* channel);
void ApplyGrpcArgs(const std::vector<GrpcArg>& args, grpc::ServerBuilder* server);

}  // namespace hgemm

#endif  // HGEMM_PROTO_GRPC_ARGS_H_
