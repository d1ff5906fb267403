// Prints the generated variant table of docs/kernels.md, with its begin and end lines.
#include <cstdio>

#include "kernels/variant_table.h"

int main() {
  std::printf("%s\n%s%s\n", hgemm::kernels::kVariantTableBegin,
              hgemm::kernels::FormatVariantTable().c_str(), hgemm::kernels::kVariantTableEnd);
  return 0;
}
