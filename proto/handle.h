// The format of resident-matrix handles (proto/hgemm.proto, "Replicas"): "m-<32 hex digits>"
// from a server without --advertise_address, "m-<32 hex digits>@<replica address>" from one
// with it. The server makes them; clients read the replica part to route calls naming a handle
// to the replica that holds it. A handle given to another process keeps its route.
// Thread safety: pure functions.
#ifndef HGEMM_PROTO_HANDLE_H_
#define HGEMM_PROTO_HANDLE_H_

#include <string>
#include <string_view>

namespace hgemm {

// Between a handle's id and its replica address (no host name or port contains it).
inline constexpr char kHandleReplicaSeparator = '@';

// `id` with `replica` appended after '@', or `id` alone when `replica` is empty.
inline std::string MakeHandle(std::string_view id, std::string_view replica) {
  std::string handle(id);
  if (!replica.empty()) (handle += kHandleReplicaSeparator) += replica;
  return handle;
}

// The replica address a handle names (what follows its last '@'); empty when it names none.
inline std::string_view HandleReplica(std::string_view handle) {
  const size_t at = handle.rfind(kHandleReplicaSeparator);
  return at == std::string_view::npos ? std::string_view() : handle.substr(at + 1);
}

}  // namespace hgemm

#endif  // HGEMM_PROTO_HANDLE_H_
