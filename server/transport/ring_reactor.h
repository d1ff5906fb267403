// The reactor of one AttachRing call (proto/hgemm.proto, "Submission ring"), a part of
// GemmServiceImpl's transport over a RingExecutor: the call's lifetime is the ring's. It
// attaches the ring, writes the one RingAttached message and keeps the call open; the client
// ending the call (or going away) stops the ring, and a ring that detaches itself (a protocol
// error) or a drain ends the call with the reason.
// Thread safety: gRPC, the ring thread and the service call in; the reactor serialises itself.
#ifndef HGEMM_SERVER_TRANSPORT_RING_REACTOR_H_
#define HGEMM_SERVER_TRANSPORT_RING_REACTOR_H_

#include <grpcpp/support/server_callback.h>

#include <string>

#include "proto/hgemm.grpc.pb.h"
#include "server/transport/call_services.h"

namespace hgemm {

// The reactor of an AttachRing call of `owner` (already identified). It deletes itself when
// the call is done. REQUIRES: `services`' pointees (rings included) outlive the call.
grpc::ServerWriteReactor<v1::RingEvent>* NewAttachRingReactor(const CallServices& services,
                                                              grpc::CallbackServerContext* context,
                                                              std::string owner,
                                                              const v1::AttachRingRequest& request);

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_RING_REACTOR_H_
