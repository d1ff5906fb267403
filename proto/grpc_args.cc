#include "proto/grpc_args.h"

#include <charconv>

namespace hgemm {

std::string ParseGrpcArg(std::string_view text, GrpcArg* arg) {
  const size_t equals = text.find('=');
  if (equals == std::string_view::npos) return "expected NAME=INT, e.g. grpc.http2.bdp_probe=0";
  const std::string_view name = text.substr(0, equals), value = text.substr(equals + 1);
  if (name.rfind("grpc.", 0) != 0 || name.size() == 5) {
    return "the name must be a gRPC channel argument, \"grpc.NAME\" (got \"" + std::string(name) +
           "\")";
  }
  int parsed = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
  if (value.empty() || error != std::errc() || end != value.data() + value.size()) {
    return "the value of " + std::string(name) + " must be a 32-bit integer (got \"" +
           std::string(value) + "\")";
  }
  *arg = GrpcArg{std::string(name), parsed};
  return "";
}

void AddGrpcArgFlag(CLI::App* app, std::vector<GrpcArg>* args) {
  app->add_option_function<std::vector<std::string>>(
         "--grpc_arg",
         [args](const std::vector<std::string>& texts) {
           args->clear();
           for (const std::string& text : texts) ParseGrpcArg(text, &args->emplace_back());
         },
         "a gRPC channel argument NAME=INT (repeatable), e.g. "
         "grpc.experimental.tcp_max_read_chunk_size=16777216: for transport experiments")
      ->check([](const std::string& text) {
        GrpcArg arg;
        return ParseGrpcArg(text, &arg);
      });
}

void ApplyGrpcArgs(const std::vector<GrpcArg>& args, grpc::ChannelArguments* channel) {
  for (const GrpcArg& arg : args) channel->SetInt(arg.name, arg.value);
}

void ApplyGrpcArgs(const std::vector<GrpcArg>& args, grpc::ServerBuilder* server) {
  for (const GrpcArg& arg : args) server->AddChannelArgument(arg.name, arg.value);
}

}  // namespace hgemm
