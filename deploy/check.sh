#!/usr/bin/env bash
# Static checks of deploy/ for CI: no Docker engine and no cluster needed. Exits non-zero on any
# problem. About 15 s of CPU with --no-self-test once the npm packages are cached; the
# self-test runs the checks again on each of its copies, as many at a time as there are cores
# (about 8 s of CPU each: TypeScript's check only where a breakage needs it).
#
#   1. yamllint (strict, deploy/.yamllint.yaml) over every YAML file under deploy/.
#   2. npm ci of deploy/package-lock.json into a cache outside the work tree (Bazel must not see
#      node_modules), re-run only when the lock file changes.
#   3. node deploy/check/check.js: renders every kustomization, and the allowed combinations of
#      the components (deploy/README.md, "Combining components"), with the pinned kustomize, and
#      validates every manifest, patch and rendered object against the Kubernetes schema
#      (kubernetes-models, plus TypeScript for unknown fields) and the service's own rules
#      (see the header of check.js).
#   4. Self-test: copies of deploy/ broken in 41 ways must each fail step 3 with the expected
#      message, so that the checks cannot pass vacuously.
#
# Needs: yamllint (Debian package yamllint; installed here when missing and running as root),
# node >= 18 and npm, and the npm registry the first time.
# Environment: HGEMM_DEPLOY_CHECK_CACHE (default ~/.cache/hgemm-serve/deploy-check),
# KEEP_WORK=1 to keep the rendered output and generated files, HGEMM_DEPLOY_CHECK_KUBECTL=0
# to skip the second rendering with kubectl's kustomize.
set -euo pipefail

deploy=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$deploy/.." && pwd)
cache=${HGEMM_DEPLOY_CHECK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hgemm-serve/deploy-check}

if ! command -v yamllint >/dev/null; then
  if ((EUID == 0)) && command -v apt-get >/dev/null; then
    echo "check.sh: installing yamllint" >&2
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends yamllint >&2
  else
    echo "check.sh: yamllint is missing (Debian package yamllint)" >&2
    exit 1
  fi
fi
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "check.sh: $tool is missing" >&2; exit 1; }
done

echo "== yamllint"
mapfile -t yamls < <(cd "$repo" && find deploy -name '*.yaml' -o -name '*.yml' | sort)
(cd "$repo" && yamllint --strict -c deploy/.yamllint.yaml "${yamls[@]}")
echo "ok    yamllint: ${#yamls[@]} files"
passed=1 failed=0 status=0

echo "== npm packages"
# shellcheck source=tools/npm_cache.sh
source "$repo/tools/npm_cache.sh"
npm_ci_cached "$deploy" "$cache"
echo "ok    npm ci ($cache)"

echo "== format"
# check.js in Prettier's format at 100 columns (package.json "prettier"): the lines a reader
# can take in without scrolling, as clang-format keeps the C++.
if "$cache/node_modules/.bin/prettier" --config "$deploy/package.json" --check \
  "$deploy/check/check.js"; then
  echo "ok    prettier --check check/check.js"
  ((passed += 1))
else
  echo "FAIL  check/check.js is not in Prettier's format (prettier --write it)"
  ((failed += 1))
  status=1
fi

echo "== render and validate"
work=$(mktemp -d "${TMPDIR:-/tmp}/hgemm-deploy-check.XXXXXX")
out=$(NODE_PATH="$cache/node_modules" node "$deploy/check/check.js" --repo "$repo" \
  --work "$work/main" 2>&1) || status=$?
echo "$out"
if [[ $out =~ validate:\ ([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
  ((passed += BASH_REMATCH[1], failed += BASH_REMATCH[2])) || true
else
  ((failed += 1))
fi

# The checks must bite: each breakage below, made on a copy, must fail them with the message
# given. (Skip with --no-self-test.) The copies are checked $(nproc) at a time, each printing its
# verdict into its own file: "ok ..." or "FAIL ..." first, then what explains a failure.
bites() { # INDEX FILE SED-EXPRESSION EXPECTED-MESSAGE COMBINATIONS(0: not rendered, 1: rendered)
  local copy=$work/mutant-$1 result=$work/result-$1
  mkdir -p "$copy"
  # What check.js reads (server/ for its sources: not the fuzz corpora, thousands of files).
  local top tops=()
  for top in deploy .dockerignore tools server; do [[ -e $repo/$top ]] && tops+=("$top"); done
  tar -C "$repo" --exclude=corpus -cf - "${tops[@]}" | tar -C "$copy" -xf -
  sed -i "$3" "$copy/$2"
  if cmp -s "$repo/$2" "$copy/$2"; then
    echo "FAIL  self-test: '$3' changed nothing in $2" >"$result"
    return
  fi
  # tsc is most of a run's CPU: only the breakages that its messages name need it.
  local typescript=0
  [[ $4 == *"does not exist in type"* ]] && typescript=1
  local out rc=0
  out=$(HGEMM_DEPLOY_CHECK_KUBECTL=0 HGEMM_DEPLOY_CHECK_COMBINATIONS="$5" \
    HGEMM_DEPLOY_CHECK_TYPESCRIPT=$typescript NODE_PATH="$cache/node_modules" \
    node "$copy/deploy/check/check.js" --repo "$copy" --work "$copy/work" 2>&1) || rc=$?
  if ((rc != 0)) && grep -qF -- "$4" <<<"$out"; then
    echo "ok    self-test: $2 with '$3' fails: $4" >"$result"
    rm -rf "$copy"
  else
    { echo "FAIL  self-test: $2 with '$3' should fail with \"$4\" (exit $rc)"
      grep -E '^(FAIL| )' <<<"$out" | head -20; } >"$result"
  fi
}
if [[ ${1:-} != --no-self-test ]]; then
  echo "== self-test"
  base=deploy/k8s/base
  tls=deploy/k8s/components/tls-auth
  samehost=deploy/k8s/components/same-host
  sts=deploy/k8s/components/statefulset
  alerts=deploy/k8s/components/alerts/prometheusrule.yaml
  # selftest_case FILE SED-EXPRESSION EXPECTED-MESSAGE [combinations]: one breakage, kept as
  # FILE|SED-EXPRESSION|EXPECTED-MESSAGE[|combinations]; combinations only for breakages that the
  # renderings of combinations of components find (they are skipped otherwise, for time).
  selftest=()
  selftest_case() { local IFS='|'; selftest+=("$*"); }
  selftest_case "$base/deployment.yaml" \
    "s/terminationGracePeriodSeconds: 30/terminationGracePeriodSecond: 30/" \
    "terminationGracePeriodSecond\"' does not exist in type 'IPodSpec'"
  selftest_case "$base/deployment.yaml" \
    "s/terminationGracePeriodSeconds: 30/terminationGracePeriodSeconds: 20/" \
    "terminationGracePeriodSeconds 20 < preStop 5 s + drain deadline 20 s"
  selftest_case "$base/deployment.yaml" "s/nvidia.com\/gpu: 1/nvidia.com\/gpu: one/" \
    "must match format \"quantity\""
  selftest_case "$base/deployment.yaml" "0,/port: 50051/s//port: 50052/" \
    "startupProbe.grpc.port 50052 is not the server's port 50051"
  selftest_case "$base/deployment.yaml" \
    "s/readOnlyRootFilesystem: true/readOnlyRootFilesystem: false/" \
    "readOnlyRootFilesystem must be true"
  selftest_case "$base/deployment.yaml" \
    "s/prometheus.io\/port: \"9464\"/prometheus.io\/port: \"9465\"/" \
    "prometheus.io/port 9465 is not the metrics containerPort 9464"
  selftest_case "$base/server.env" \
    "s/^HGEMM_METRICS_LISTEN=0.0.0.0:9464/HGEMM_METRICS_LISTEN=0.0.0.0:9999/" \
    "HGEMM_METRICS_LISTEN 0.0.0.0:9999 is not on the metrics containerPort 9464"
  selftest_case "$base/server.env" "s/^HGEMM_DRAIN_DEADLINE_S=/HGEMM_DRAIN_DEADLINE=/" \
    "HGEMM_DRAIN_DEADLINE is not a server flag"
  selftest_case "$base/service-headless.yaml" "s/component: server/component: sever/" \
    "selector matches no Deployment's or StatefulSet's pods"
  selftest_case "deploy/k8s/components/multi-gpu/deployment-patch.yaml" \
    "s/memory: 32Gi/memroy: 32Gi/" "resources.limits[\"memroy\"] is not a resource"
  selftest_case "deploy/k8s/components/multi-gpu/deployment-patch.yaml" \
    "s/^  template:/  templates:/" "templates\"' does not exist in type 'IDeploymentSpec'"
  selftest_case "deploy/docker/Dockerfile" "s/^USER 10001:10001/USER 10002:10002/" \
    "runAsUser 10001 is not the image's USER 10002"
  selftest_case ".dockerignore" "\$a tools" ".dockerignore leaves out tools/bootstrap.sh"
  selftest_case "$base/server.env" "/^HGEMM_RESIDENT_TTL_S=/d" \
    "HGEMM_RESIDENT_TTL_S is 0: resident matrices would never expire"
  selftest_case "$base/server.env" "s/^HGEMM_RESIDENT_TTL_S=3600/HGEMM_RESIDENT_TTL_S=-1/" \
    "HGEMM_RESIDENT_TTL_S=\"-1\" should be an integer in [0, 4294967295]"
  selftest_case "deploy/docker/Dockerfile" "s/HGEMM_RESIDENT_TTL_S=3600/HGEMM_RESIDENT_TTL_S=0/" \
    "must set ENV HGEMM_RESIDENT_TTL_S > 0"
  selftest_case "deploy/k8s/components/servicemonitor/servicemonitor.yaml" \
    "s/- port: metrics/- port: metric/" \
    "ServiceMonitor/hgemm: endpoint port metric is not a port of Service hgemm-metrics"
  selftest_case "deploy/k8s/components/servicemonitor/servicemonitor.yaml" \
    "s/scrapeTimeout: 10s/scrapeTimout: 10s/" "'\"scrapeTimout\"' does not exist in type"
  selftest_case "deploy/k8s/components/servicemonitor/service-metrics.yaml" \
    "s/targetPort: metrics/targetPort: grpc/" \
    "endpoint port metrics does not reach the server's metrics containerPort"
  selftest_case "$sts/statefulset-patch.yaml" "s/(POD_NAME).hgemm-headless/(POD_NAME).hgemm/" \
    "is not \$(POD_NAME).hgemm-headless.\$(POD_NAMESPACE).svc.cluster.local:50051"
  selftest_case "$sts/template/statefulset.yaml" \
    "s/podManagementPolicy: OrderedReady/podManagementPolicy: Parallel/" \
    "podManagementPolicy must be OrderedReady"
  selftest_case "$sts/template/statefulset.yaml" \
    "s/serviceName: hgemm-headless/serviceName: hgemm/" \
    "serviceName hgemm is not a rendered headless Service"
  selftest_case "$tls/deployment-patch.yaml" "/startupProbe/,/port:/s/port: 50052/port: 50051/" \
    "startupProbe.grpc.port 50051 is not the server's health-only port 50052"
  selftest_case "$tls/server.env" "/^HGEMM_HEALTH_LISTEN=/d" \
    "HGEMM_TLS_CERT without HGEMM_HEALTH_LISTEN"
  selftest_case "$tls/deployment-patch.yaml" \
    "s#mountPath: /etc/hgemm/auth#mountPath: /etc/hgemm/tokens#" \
    "HGEMM_AUTH_TOKENS_FILE /etc/hgemm/auth/tokens is under no volumeMount"
  selftest_case "$samehost/deployment-patch.yaml" "/shareProcessNamespace: true/d" \
    "needs shareProcessNamespace: true"
  selftest_case "$samehost/deployment-patch.yaml" "s/medium: Memory/medium: \"\"/" \
    "emptyDir hgemm-socket should be medium: Memory"
  selftest_case "$samehost/deployment-patch.yaml" "s#mountPath: /run/hgemm#mountPath: /run/other#" \
    "unix socket /run/hgemm/hgemm.sock is in no writable emptyDir volumeMount"
  selftest_case "$samehost/server.env" "s/^HGEMM_REGION_TTL_S=600/HGEMM_REGION_TTL_S=0/" \
    "HGEMM_REGION_TTL_S is 0"
  selftest_case "$samehost/server.env" \
    "s/^HGEMM_MAX_CONNECTION_AGE_GRACE_S=0/HGEMM_MAX_CONNECTION_AGE_GRACE_S=30/" \
    "with shared memory on: every AttachRing call"
  selftest_case "$samehost/kustomization.yaml" "s/kind: Deployment.StatefulSet/kind: Deployment/" \
    "renders differently with components/statefulset listed first and last" "1"
  selftest_case "$base/deployment.yaml" "/nodeAffinity:/,/values: \[\"0\"\]/d" \
    "no required node affinity (or nodeSelector) for Hopper GPUs"
  selftest_case "$base/deployment.yaml" "s/values: \[\"9\"\]/values: [\"8\", \"9\"]/" \
    "nvidia.com/gpu.compute.major In [8, 9] admits GPUs other than Hopper"
  selftest_case "$base/server.env" "/^HGEMM_MAX_CONNECTION_AGE_S=/d" \
    "HGEMM_MAX_CONNECTION_AGE_S is 0: clients keep their first connections"
  selftest_case "$base/server.env" "\$a HGEMM_ALLOW_CUDA_IPC=true" \
    "HGEMM_ALLOW_CUDA_IPC: no client can use CUDA IPC from another container or pod"
  selftest_case "deploy/k8s/overlays/autoscaled/kustomization.yaml" \
    "s#- ../../components/hpa#- ../../components/statefulset\n  - ../../components/hpa#" \
    "combines components/hpa with components/statefulset"
  selftest_case "deploy/k8s/overlays/secure/kustomization.yaml" \
    "\$a images: [{name: hgemm-serve, newTag: \"0.2.0\"}]" \
    "sets images: the image and its tag are named once"
  selftest_case "$alerts" "s/(hgemm_device_failed) == 1/(hgemm_device_fail) == 1/" \
    "hgemm_device_fail is not a metric the server exports" "1"
  selftest_case "$alerts" "s/code=\"UNAVAILABLE\"/code=\"UNAVAILIBLE\"/" \
    "code \"UNAVAILIBLE\" is not a value the server reports" "1"
  selftest_case "deploy/k8s/components/network-policy/networkpolicy.yaml" \
    "s/port: metrics/port: metric/" "ingress port metric is no container port of the server" "1"
  selftest_case "server/main.cc" "s/\"HGEMM_RING_SPIN_US\"/\"HGEMM_RING_SPINS_US\"/" \
    "HGEMM_RING_SPINS_US (server/main.cc) is missing from SERVER_ENV"
  for i in "${!selftest[@]}"; do
    IFS='|' read -r file expr expect combinations <<<"${selftest[i]}"
    while (($(jobs -rp | wc -l) >= $(nproc))); do wait -n; done
    bites "$i" "$file" "$expr" "$expect" "${combinations:-0}" &
  done
  wait
  for i in "${!selftest[@]}"; do
    cat "$work/result-$i" 2>/dev/null || echo "FAIL  self-test $i: no verdict"
    if [[ $(head -c 2 "$work/result-$i" 2>/dev/null) == ok ]]; then
      ((passed += 1))
    else
      ((failed += 1))
      status=1
    fi
  done
fi

if ((status != 0)) || [[ ${KEEP_WORK:-} == 1 ]]; then
  echo "check.sh: rendered output and generated files kept in $work" >&2
else
  rm -rf "$work"
fi
echo "deploy: $passed passed, $failed failed"
exit "$status"
