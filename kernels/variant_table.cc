#include "kernels/variant_table.h"

#include "kernels/registry.h"

namespace hgemm::kernels {

std::string FormatVariantTable() {
  std::string out =
      "| variant | accumulation | layouts | types | block | stages | smem | min SM | takes | what "
      "|\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const VariantInfo& v : Variants()) {
    const bool tiled = v.block_m > 0;
    const std::string acc = v.fp16_acc && v.fp32_acc ? "fp16, fp32" : v.fp16_acc ? "fp16" : "fp32";
    out +=
        "| `" + v.name + "` | " + acc + " | " + LayoutList(v.layouts) + " | " + TypesList(v.types) +
        (v.strided ? ", strided" : "") + (v.batched ? ", batch in one launch" : "") +
        (v.launch_grouped != nullptr ? ", group in one launch" : "") +
        (v.fused_scale ? ", fused α/β" : "") + " | " +
        (tiled ? std::to_string(v.block_m) + "×" + std::to_string(v.block_n) : "-") + " | " +
        (tiled ? std::to_string(v.stages) : "-") + " | " +
        (v.smem_bytes > 0 ? std::to_string((v.smem_bytes + 1023) / 1024) + " KB" : "-") + " | sm_" +
        std::to_string(v.min_sm) + " | " + v.constraints + " | " + v.description + " |\n";
  }
  return out;
}

}  // namespace hgemm::kernels
