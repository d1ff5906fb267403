#include "proto/grpc_args.h"

#include <gtest/gtest.h>

namespace hgemm {
namespace {

TEST(GrpcArgs, ParsesNameEqualsInteger) {
  GrpcArg arg;
  EXPECT_EQ(ParseGrpcArg("grpc.http2.max_frame_size=16777215", &arg), "");
  EXPECT_EQ(arg, (GrpcArg{"grpc.http2.max_frame_size", 16777215}));
  EXPECT_EQ(ParseGrpcArg("grpc.http2.bdp_probe=-1", &arg), "");
  EXPECT_EQ(arg.value, -1);
}

TEST(GrpcArgs, RefusesWhatGrpcWouldIgnoreOrMisread) {
  for (const char* text : {"grpc.http2.bdp_probe", "http2.bdp_probe=0", "grpc.=1", "=1",
                           "grpc.http2.bdp_probe=", "grpc.http2.bdp_probe=1x",
                           "grpc.http2.bdp_probe=4294967296", "grpc.x=1.5"}) {
    GrpcArg arg{"untouched", 7};
    EXPECT_NE(ParseGrpcArg(text, &arg), "") << text;
    EXPECT_EQ(arg, (GrpcArg{"untouched", 7})) << text;
  }
}

TEST(GrpcArgs, TheFlagRepeatsAndRejectsABadOne) {
  std::vector<GrpcArg> args;
  CLI::App app;
  AddGrpcArgFlag(&app, &args);
  const char* good[] = {"prog", "--grpc_arg=grpc.http2.bdp_probe=0", "--grpc_arg",
                        "grpc.http2.lookahead_bytes=8388608"};
  app.parse(4, good);
  EXPECT_EQ(args, (std::vector<GrpcArg>{{"grpc.http2.bdp_probe", 0},
                                        {"grpc.http2.lookahead_bytes", 8388608}}));
  CLI::App strict;
  std::vector<GrpcArg> none;
  AddGrpcArgFlag(&strict, &none);
  const char* bad[] = {"prog", "--grpc_arg=bdp_probe=0"};
  EXPECT_THROW(strict.parse(2, bad), CLI::ValidationError);
}

}  // namespace
}  // namespace hgemm
