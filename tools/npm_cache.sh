# shellcheck shell=bash
# npm_ci_cached PACKAGE_DIR CACHE_DIR: `npm ci` of PACKAGE_DIR's package.json and
# package-lock.json into CACHE_DIR, a folder outside the work tree (Bazel must not see
# node_modules), re-run only when either file changes. Sourced by deploy/check.sh and
# tools/curl_check.sh (after `set -euo pipefail`).
npm_ci_cached() {
  local package=$1 cache=$2 lock_sum
  lock_sum=$(cat "$package/package.json" "$package/package-lock.json" | sha256sum | cut -d' ' -f1)
  if [[ ! -f $cache/.lock-sum || $(cat "$cache/.lock-sum") != "$lock_sum" ]]; then
    rm -rf "$cache"
    mkdir -p "$cache"
    cp "$package/package.json" "$package/package-lock.json" "$cache/"
    (cd "$cache" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
    echo "$lock_sum" >"$cache/.lock-sum"
  fi
}
