#!/usr/bin/env bash
# Whether every C++ and CUDA file of the tree is as clang-format (.clang-format) writes it: prints
# the files that are not and the line "format: N passed, N failed" (tools/test.sh counts it).
# Fix with: git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | xargs clang-format -i
set -uo pipefail
cd "$(dirname "$0")/.."
passed=0 failed=0
while IFS= read -r file; do
  if clang-format --dry-run --Werror "$file" >/dev/null 2>&1; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "not formatted: $file (clang-format -i $file)"
  fi
done < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
echo "format: $passed passed, $failed failed"
((failed == 0))
