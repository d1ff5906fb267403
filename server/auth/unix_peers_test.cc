#include "server/auth/unix_peers.h"

#include <gtest/gtest.h>

namespace hgemm {
namespace {

TEST(UnixPeers, FindsTheCredentialsOfAnFdPeer) {
  UnixPeers peers;
  peers.Add(12, {.uid = 1000, .gid = 100, .pid = 42});
  ASSERT_TRUE(peers.Find(UnixPeers::PeerName(12)).has_value());
  EXPECT_EQ(peers.Find("fd:12")->uid, 1000u);
  EXPECT_EQ(peers.Find("fd:12")->gid, 100u);
  EXPECT_FALSE(peers.Find("fd:13").has_value());
  for (const char* other : {"unix:", "unix:/tmp/x.sock", "ipv4:127.0.0.1:12", "fd:", "fd:12x",
                            "fd:-1", "fd:99999999999999999999", ""}) {
    EXPECT_FALSE(peers.Find(other).has_value()) << other;
  }
}

TEST(UnixPeers, AReusedDescriptorHasItsNewConnectionsCredentials) {
  UnixPeers peers;
  peers.Add(7, {.uid = 1000});
  peers.Add(7, {.uid = 1001});
  EXPECT_EQ(peers.Find("fd:7")->uid, 1001u);
}

}  // namespace
}  // namespace hgemm
