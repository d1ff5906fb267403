// Region registration on a core as a test or fuzz target makes it: GemmCore::RegisterRegion
// answers on an upload thread, and these wait for that answer. Test-only.
// Thread safety: any thread but the core's upload threads (which must be free to answer).
#ifndef HGEMM_SERVER_TESTING_CORE_REGIONS_H_
#define HGEMM_SERVER_TESTING_CORE_REGIONS_H_

#include <absl/status/status.h>

#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "server/resident/region_store.h"
#include "server/session/gemm_core.h"
#include "server/session/gemm_spec.h"

namespace hgemm {

// RegisterRegion of `owner` over a Unix socket, waited for: its status (code and message), and
// the region in `*info` on OK.
inline absl::Status RegisterRegionNow(GemmCoreInterface& core, const std::string& owner,
                                      const RegionSpec& spec,
                                      std::optional<RegisteringProcess> process, RegionInfo* info) {
  // The status crosses threads as plain values: a copy of an absl::Status shares its message
  // through a refcount in Debian's uninstrumented absl, which TSan would take for a race.
  struct Answer {
    absl::StatusCode code;
    std::string message;
    RegionInfo info;
  };
  auto answer = std::make_shared<std::promise<Answer>>();
  std::future<Answer> answered = answer->get_future();
  core.RegisterRegion(owner, /*over_unix_socket=*/true, spec, std::move(process),
                      [answer](const absl::Status& s, const RegionInfo& region) {
                        answer->set_value({s.code(), std::string(s.message()), region});
                      });
  Answer a = answered.get();
  *info = std::move(a.info);
  return absl::Status(a.code, a.message);
}

// The memfd at `path` (of `bytes`), registered as `owner`'s region by `process`.
inline absl::Status RegisterMemfdNow(GemmCoreInterface& core, const std::string& owner,
                                     const RegisteringProcess& process, const std::string& path,
                                     int64_t bytes, const std::string& label, RegionInfo* info) {
  return RegisterRegionNow(
      core, owner, {.path = path, .byte_size = uint64_t(bytes), .label = label}, process, info);
}

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_CORE_REGIONS_H_
