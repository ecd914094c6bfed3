// The declaration's validation, rule for rule the checks of Go's spec package (spec/parse.go's
// shape check, spec/validate.go, spec/domain.go, spec/quantity.go): the same verdict, field
// path and rule for the same input. spec/testdata/corpus holds the cases both suites run.
import { isIP } from 'node:net';

import type { Sandbox, Stack } from './gen/declaration.js';
import { definitions } from './gen/schema.js';

/** One validation problem, as Go's spec.FieldError. */
export interface FieldError {
  /** The sandbox the problem belongs to; "" when its id is bad or the problem is the stack's. */
  sandboxId: string;
  /** The field, e.g. "sandboxes[1].limits.memory". */
  path: string;
  /** The offending value as written ("" when absent or withheld). */
  value: string;
  /** A stable machine name, e.g. "quantity.syntax". */
  rule: string;
  message: string;
}

/**
 * A document that cannot be read into the declaration types (Go's spec.ParseError): an
 * unknown field, a value of the wrong type. Reported as the first one, as Go does.
 */
export interface ParseProblem {
  path: string;
  message: string;
}

/** The verdict on a declaration: a shape problem, or every field problem (none: valid). */
export interface Verdict {
  parse?: ParseProblem;
  problems: FieldError[];
}

export const apiVersion: string = definitions.Stack.properties.apiVersion.const;
export const stackKind: string = definitions.Stack.properties.kind.enum[0];
export const egressModes: readonly string[] = definitions.Egress.properties.mode.enum;
export const runtimes: readonly string[] = definitions.Sandbox.properties.runtime.enum;
const defaultEgressMode: string = definitions.Egress.properties.mode.default;
const defaultLifetime: number = definitions.Session.properties.maxLifetimeSeconds.default;
/** spec.MinMemoryBytes and spec.MinDiskBytes. */
const minBytes = 1n << 20n;

const idMessage = "an id is 1 to 64 characters of letters, digits, '_' and '-'";
const imageObjectFieldList = 'host, ref, ociLayout, tarball, dir, snapshot';

export function isValidId(id: unknown): boolean {
  return typeof id === 'string' && /^[A-Za-z0-9_-]{1,64}$/.test(id);
}

/** Validates one sandbox declaration (a plain object, as JSON would hold it). */
export function validateSandbox(doc: unknown): Verdict {
  const parse = checkShape('', doc, definitions.Sandbox);
  if (parse) return { parse, problems: [] };
  return { problems: sandboxProblems(doc as Sandbox, '', -1, undefined) };
}

/** Validates a stack: its own fields, then each sandbox in order, then each workload. */
export function validateStack(doc: unknown): Verdict {
  const parse = checkShape('', doc, definitions.Stack);
  if (parse) return { parse, problems: [] };
  const st = doc as Stack;
  const v = new Validator('');
  if ((st.apiVersion ?? '') !== apiVersion) {
    v.add('apiVersion', st.apiVersion ?? '', 'apiVersion', `apiVersion must be "${apiVersion}"`);
  }
  if (st.kind && st.kind !== stackKind) {
    v.add('kind', st.kind, 'kind', `kind must be "${stackKind}" or left out`);
  }
  const sandboxes = st.sandboxes ?? [];
  if (sandboxes.length === 0) v.add('sandboxes', '', 'sandboxes.required', 'a stack declares at least one sandbox');
  const sc: StackContext = { firstIndex: new Map(), workloads: new Set() };
  sandboxes.forEach((sb, i) => {
    const id = sb?.id ?? '';
    if (!sc.firstIndex.has(id)) sc.firstIndex.set(id, i);
  });
  for (const w of st.workloads ?? []) sc.workloads.add(w?.id ?? '');
  sandboxes.forEach((sb, i) => v.errs.push(...sandboxProblems(sb ?? ({} as Sandbox), `sandboxes[${i}]`, i, sc)));
  const firstWorkload = new Map<string, number>();
  (st.workloads ?? []).forEach((w, j) => {
    const wv = new Validator(`workloads[${j}]`);
    const id = w?.id ?? '';
    if (!isValidId(id)) wv.add('id', id, 'workload.id', 'a workload ' + idMessage);
    else if (firstWorkload.has(id)) {
      wv.add('id', id, 'id.duplicate', `the id is already used by workloads[${firstWorkload.get(id)}]; workload ids are unique in a stack`);
    } else firstWorkload.set(id, j);
    (w?.hosts ?? []).forEach((h, k) => {
      if (!sc.firstIndex.has(h)) wv.add(`hosts[${k}]`, h, 'workload.hostsUnknown', 'hosts must name sandboxes declared in the stack');
    });
    v.errs.push(...wv.errs);
  });
  return { problems: v.errs };
}

interface StackContext {
  firstIndex: Map<string, number>;
  workloads: Set<string>;
}

class Validator {
  errs: FieldError[] = [];
  sandboxId = '';
  constructor(readonly prefix: string) {}
  add(field: string, value: string, rule: string, message: string): void {
    this.errs.push({ sandboxId: this.sandboxId, path: this.prefix ? `${this.prefix}.${field}` : field, value, rule, message });
  }
}

type ImageObject = { host?: boolean; ref?: string; ociLayout?: string; tarball?: string; dir?: string; snapshot?: string };

function sandboxProblems(s: Sandbox, prefix: string, index: number, sc?: StackContext): FieldError[] {
  const v = new Validator(prefix);
  const id = s.id ?? '';
  if (isValidId(id)) v.sandboxId = id;
  if (!isValidId(id)) v.add('id', id, 'id.format', idMessage);
  else if (sc && sc.firstIndex.get(id) !== index) {
    v.add('id', id, 'id.duplicate', `the id is already used by sandboxes[${sc.firstIndex.get(id)}]; ids are unique in a stack`);
  }
  image(v, imageObject(s.image));
  limits(v, s.limits ?? {});
  egress(v, s.egress ?? {});
  session(v, s.session ?? {});
  labels(v, s.labels ?? {});
  previewPorts(v, s.previewPorts ?? []);
  env(v, s.env ?? {});
  workdir(v, s.workdir ?? '');
  if (s.runtime && !runtimes.includes(s.runtime)) {
    v.add('runtime', s.runtime, 'runtime.unknown', 'runtime must be one of ' + runtimes.map((r) => JSON.stringify(r)).join(', '));
  }
  if (sc && s.hostedBy && !sc.workloads.has(s.hostedBy)) {
    v.add('hostedBy', s.hostedBy, 'hostedBy.unknown', "hostedBy must name a workload declared in the stack's workloads");
  }
  return v.errs;
}

/** The object form of an image: spec.ImageFromString's classification of the string form. */
export function imageObject(img: Sandbox['image'] | null | undefined): ImageObject {
  if (img === undefined || img === null || img === '') return {};
  if (typeof img !== 'string') return img;
  if (img === 'host') return { host: true };
  const layout = ociLayoutPath(img);
  if (layout !== undefined) return { ociLayout: layout };
  if (img.endsWith('.tar') || img.endsWith('.tar.gz') || img.endsWith('.tgz')) return { tarball: img };
  if (img === '.' || img === '..' || img.startsWith('/') || img.startsWith('./') || img.startsWith('../')) return { dir: img };
  return { ref: img };
}

/** The path of an "oci:" / "oci-layout:" image string (both prefixes trimmed, as Go does), else undefined. */
function ociLayoutPath(s: string): string | undefined {
  if (!s.startsWith('oci-layout:') && !s.startsWith('oci:')) return undefined;
  if (s.startsWith('oci-layout:')) s = s.slice('oci-layout:'.length);
  if (s.startsWith('oci:')) s = s.slice('oci:'.length);
  return s;
}

function imageString(img: ImageObject): string {
  const parts: string[] = [];
  if (img.host) parts.push('host');
  for (const k of ['ref', 'ociLayout', 'tarball', 'dir', 'snapshot'] as const) {
    if (img[k]) parts.push(`${k}=${img[k]}`);
  }
  return parts.join(', ');
}

function image(v: Validator, img: ImageObject): void {
  const kinds = [img.host, img.ref, img.ociLayout, img.tarball, img.dir, img.snapshot].filter((x) => x).length;
  if (kinds === 0) {
    v.add('image', '', 'image.required', `image is required: "host", an OCI reference, "./dir", "x.tar", "oci:./layout", or an object with one of ${imageObjectFieldList}`);
    return;
  }
  if (kinds > 1) v.add('image', imageString(img), 'image.oneOf', `an image has exactly one source; set only one of ${imageObjectFieldList}`);
  if (img.ref && [...img.ref].some((c) => c.codePointAt(0)! <= 0x20 || c.codePointAt(0) === 0x7f)) {
    v.add('image.ref', img.ref, 'image.ref', 'an image reference has no spaces or control characters, e.g. "docker.io/library/python:3.12"');
  }
  for (const k of ['ociLayout', 'tarball', 'dir'] as const) {
    if (img[k]?.includes('\0')) v.add(`image.${k}`, img[k]!, 'image.path', 'a path may not contain a NUL byte');
  }
  if (img.snapshot && !isValidId(img.snapshot)) {
    v.add('image.snapshot', img.snapshot, 'image.snapshot', "a snapshot name is 1 to 64 characters of letters, digits, '_' and '-'");
  }
}

const maxInt64 = (1n << 63n) - 1n;
const nano = 1_000_000_000n;

function limits(v: Validator, l: NonNullable<Sandbox['limits']>): void {
  const cpu = quantityText(l.cpu);
  if (cpu !== '') {
    const n = checkedQuantity(v, 'limits.cpu', cpu);
    if (n !== undefined) {
      if (n >= maxInt64 * 1_000_000n) v.add('limits.cpu', cpu, 'quantity.tooLarge', 'cpu is too large');
      else if (n % 1_000_000n !== 0n) {
        v.add('limits.cpu', cpu, 'cpu.millicores', 'cpu is a whole number of millicores: "250m", "0.5", "2" (1m is the smallest step)');
      }
    }
  }
  bytes(v, 'limits.memory', quantityText(l.memory));
  bytes(v, 'limits.disk', quantityText(l.disk));
  if (l.maxProcesses !== undefined && l.maxProcesses !== null && l.maxProcesses < 1) {
    v.add('limits.maxProcesses', String(l.maxProcesses), 'maxProcesses.positive', 'maxProcesses must be at least 1');
  }
}

function quantityText(q: string | number | null | undefined): string {
  return q === undefined || q === null ? '' : String(q);
}

function checkedQuantity(v: Validator, field: string, q: string): bigint | undefined {
  const n = parseQuantity(q);
  if (n === undefined) {
    v.add(field, q, 'quantity.syntax', 'not a quantity; write a number with an optional suffix, e.g. "500m", "2", "512Mi", "1Gi", "1G"');
    return undefined;
  }
  if (n <= 0n) {
    v.add(field, q, 'quantity.positive', 'must be greater than zero');
    return undefined;
  }
  return n;
}

function bytes(v: Validator, field: string, q: string): void {
  if (q === '') return;
  const n = checkedQuantity(v, field, q);
  if (n === undefined) return;
  if (n >= maxInt64 * nano) {
    v.add(field, q, 'quantity.tooLarge', 'the quantity does not fit in 63 bits of bytes');
    return;
  }
  if (n % nano !== 0n) {
    v.add(field, q, 'quantity.wholeBytes', 'must be a whole number of bytes, e.g. "512Mi", "1Gi", "1500M"');
    return;
  }
  if (n / nano < minBytes) v.add(field, q, 'quantity.minimum', `must be at least ${minBytes >> 20n}Mi`);
}

/** spec.QuantityPattern: Kubernetes' quantity grammar with integer exponents only. */
export const quantityPattern = /^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$/;
const binarySuffix: Record<string, bigint> = { Ki: 10n, Mi: 20n, Gi: 30n, Ti: 40n, Pi: 50n, Ei: 60n };
const decimalSuffix: Record<string, number> = { n: -9, u: -6, m: -3, '': 0, k: 3, M: 6, G: 9, T: 12, P: 15, E: 18 };

/**
 * A quantity's value in billionths (nanos), rounded away from zero to a whole nano as
 * Kubernetes' resource.ParseQuantity rounds; undefined when it is not a quantity airlock
 * accepts (spec.Quantity.Parse: the grammar, at most 64 characters, exponent within ±30).
 */
export function parseQuantity(q: string): bigint | undefined {
  if (q === '' || q.length > 64) return undefined;
  const m = quantityPattern.exec(q);
  if (!m) return undefined;
  const negative = m[1] === '-';
  const number = m[2];
  const suffix = m[6] ?? '';
  const [whole, frac = ''] = number.split('.');
  let e2 = 0n;
  let e10: number;
  if (suffix in binarySuffix) {
    e2 = binarySuffix[suffix];
    e10 = 0;
  } else if (suffix in decimalSuffix) {
    e10 = decimalSuffix[suffix];
  } else {
    const e = Number(suffix.slice(1));
    if (!Number.isInteger(e) || e > 30 || e < -30) return undefined;
    e10 = e;
  }
  // value = digits × 10^(e10 − len(frac)) × 2^e2; in nanos, × 10^9.
  const digits = BigInt((whole || '0') + frac) << e2;
  const scale = e10 - frac.length + 9;
  let n: bigint;
  if (scale >= 0) n = digits * 10n ** BigInt(scale);
  else {
    const d = 10n ** BigInt(-scale);
    n = (digits + d - 1n) / d; // round up: a non-zero value never becomes zero
  }
  return negative ? -n : n;
}

function egress(v: Validator, e: NonNullable<Sandbox['egress']>): void {
  const mode = e.mode ?? '';
  const domains = e.domains ?? [];
  if (mode !== '' && !egressModes.includes(mode)) {
    v.add('egress.mode', mode, 'egress.mode', 'egress mode must be one of ' + egressModes.map((m) => JSON.stringify(m)).join(', '));
  }
  if (mode === 'allowDomains' && domains.length === 0) v.add('egress.domains', '', 'egress.domainsEmpty', 'mode allowDomains needs at least one domain');
  else if (mode !== 'allowDomains' && domains.length > 0) {
    v.add('egress.domains', domains.join(','), 'egress.domainsWithoutAllowDomains',
      `domains are only allowed with mode allowDomains; mode is ${mode || `${defaultEgressMode} (the default)`}`);
  }
  domains.forEach((d, i) => {
    const p = domainProblem(d);
    if (p) v.add(`egress.domains[${i}]`, d, p[0], p[1]);
  });
}

/** The rule and message of an egress domain pattern's first problem (spec.ValidateDomain), or undefined. */
export function domainProblem(pattern: string): [string, string] | undefined {
  if (pattern === '') return ['domain.syntax', 'empty domain; write a name such as "api.example.com" or "*.example.com"'];
  if (isIPLiteral(pattern)) return ['domain.ipLiteral', `${JSON.stringify(pattern)} is an IP address, and IP addresses are not allowed; name the host by its DNS name`];
  let name = pattern.toLowerCase();
  if (name.endsWith('.')) name = name.slice(0, -1);
  if (name.includes('*')) {
    if (!name.startsWith('*.') || name.slice(2).includes('*')) {
      return ['domain.wildcard', 'a wildcard is allowed only as a leading "*.", as in "*.example.com"'];
    }
    const rest = name.slice(2);
    if (!rest.includes('.')) return ['domain.wildcard', 'a wildcard needs at least two labels after "*.", as in "*.example.com" (not "*.com")'];
    name = rest;
  }
  if (Buffer.byteLength(name) > 253) return ['domain.syntax', 'a domain is at most 253 characters'];
  const labels = name.split('.');
  for (const l of labels) {
    const m = labelProblem(l);
    if (m) return ['domain.syntax', m];
  }
  if (numericLabel(labels[labels.length - 1])) {
    return ['domain.ipLiteral', `the last label of ${JSON.stringify(pattern)} is numeric, so resolvers read it as an IP address; name the host by its DNS name`];
  }
  return undefined;
}

function labelProblem(l: string): string {
  if (l === '') return 'empty label (two dots in a row, or a leading dot); labels are 1 to 63 characters';
  if (Buffer.byteLength(l) > 63) return 'a label is at most 63 characters';
  for (const c of l) {
    if (!/^[a-z0-9-]$/.test(c)) return `character ${JSON.stringify(c)} is not allowed; a domain holds letters, digits, hyphens and dots`;
  }
  if (l.startsWith('-') || l.endsWith('-')) return 'a label may not start or end with a hyphen';
  return '';
}

function isIPLiteral(s: string): boolean {
  if (s.startsWith('[')) s = s.slice(1).replace(/\]$/, '');
  return isIP(s) !== 0;
}

function numericLabel(l: string): boolean {
  if (l.startsWith('0x')) return /^[0-9a-f]*$/.test(l.slice(2));
  return /^[0-9]*$/.test(l);
}

function session(v: Validator, s: NonNullable<Sandbox['session']>): void {
  let lifeOK = true;
  let idleOK = true;
  const life = s.maxLifetimeSeconds ?? undefined;
  const idle = s.idleTimeoutSeconds ?? undefined;
  if (life !== undefined && life < 1) {
    lifeOK = false;
    v.add('session.maxLifetimeSeconds', String(life), 'session.lifetimePositive', 'maxLifetimeSeconds must be at least 1');
  }
  if (idle !== undefined && idle < 1) {
    idleOK = false;
    v.add('session.idleTimeoutSeconds', String(idle), 'session.idlePositive', 'idleTimeoutSeconds must be at least 1');
  }
  const lifetime = life ?? defaultLifetime;
  if (lifeOK && idleOK && idle !== undefined && idle > lifetime) {
    v.add('session.idleTimeoutSeconds', String(idle), 'session.idleExceedsLifetime', `idleTimeoutSeconds must not exceed maxLifetimeSeconds (${lifetime})`);
  }
}

const labelNameRE = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
const dnsSubdomainRE = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

/** Kubernetes' IsLabelKey: an optional DNS subdomain prefix and '/', then a name of at most 63. */
function labelKeyOK(k: string): boolean {
  const parts = k.split('/');
  let name: string;
  if (parts.length === 1) name = parts[0];
  else if (parts.length === 2) {
    const prefix = parts[0];
    if (prefix === '' || Buffer.byteLength(prefix) > 253 || !dnsSubdomainRE.test(prefix)) return false;
    name = parts[1];
  } else return false;
  return name !== '' && Buffer.byteLength(name) <= 63 && labelNameRE.test(name);
}

function labelValueOK(val: string): boolean {
  return Buffer.byteLength(val) <= 63 && (val === '' || labelNameRE.test(val));
}

function sortedKeys(m: Record<string, unknown>): string[] {
  // Go sorts by bytes; UTF-8 byte order is code point order.
  return Object.keys(m).sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
}

function labels(v: Validator, m: Record<string, string>): void {
  for (const k of sortedKeys(m)) {
    const field = `labels[${k}]`;
    if (!labelKeyOK(k)) v.add(field, k, 'label.key', 'label key is not a qualified name (an optional DNS subdomain prefix and "/", then 1 to 63 of [A-Za-z0-9_.-], alphanumeric at both ends)');
    if (!labelValueOK(m[k] ?? '')) v.add(field, m[k], 'label.value', 'label value is at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends');
  }
}

function previewPorts(v: Validator, ports: number[]): void {
  const first = new Map<number, number>();
  ports.forEach((p, i) => {
    const field = `previewPorts[${i}]`;
    if (p < 1 || p > 65535) {
      v.add(field, String(p), 'previewPort.range', 'a port is 1 to 65535');
      return;
    }
    if (first.has(p)) {
      v.add(field, String(p), 'previewPort.duplicate', `port already listed at previewPorts[${first.get(p)}]`);
      return;
    }
    first.set(p, i);
  });
}

function env(v: Validator, m: Record<string, string>): void {
  for (const k of sortedKeys(m)) {
    const field = `env[${k}]`;
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) {
      v.add(field, k, 'env.name', "an environment variable name is a letter or '_' followed by letters, digits and '_'");
    }
    // The value is withheld from the error: environment values are often secrets.
    if ((m[k] ?? '').includes('\0')) v.add(field, '', 'env.value', 'an environment variable value may not contain a NUL byte');
  }
}

function workdir(v: Validator, w: string): void {
  if (w === '') return;
  const clean = w === '/' || (w.startsWith('/') && !w.endsWith('/') && w.slice(1).split('/').every((seg) => seg !== '' && seg !== '.' && seg !== '..'));
  if (w.includes('\0') || !clean) {
    v.add('workdir', w, 'workdir.absolute', 'workdir is an absolute, clean path such as "/workspace" (no "..", ".", double or trailing slashes)');
  }
}

// ---- the shape check: spec/parse.go's checkShape over the schema's definitions ----

type SchemaNode = { [k: string]: unknown };

function resolve(node: SchemaNode): SchemaNode {
  const ref = node.$ref;
  if (typeof ref === 'string') return (definitions as unknown as Record<string, SchemaNode>)[ref.replace('#/$defs/', '')];
  return node;
}

function describe(v: unknown): string {
  if (typeof v === 'string') return `a string ${JSON.stringify(v)}`;
  if (typeof v === 'number') return `the number ${v}`;
  if (typeof v === 'boolean') return `the boolean ${v}`;
  if (Array.isArray(v)) return 'a list';
  return 'an object';
}

function wrongType(path: string, v: unknown, want: string): ParseProblem {
  let hint = '';
  if (typeof v === 'number' && want === 'a string') hint = ' (quote it)';
  if (typeof v === 'boolean' && (want === 'a string' || want.startsWith('a string '))) {
    hint = ' (quote it: YAML reads unquoted yes, no, on, off, true and false as booleans)';
  }
  return { path, message: `must be ${want}, got ${describe(v)}${hint}` };
}

const join = (path: string, k: string) => (path ? `${path}.${k}` : k);
const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The first shape problem of v against a schema node, object keys in sorted order; null is accepted everywhere. */
function checkShape(path: string, v: unknown, node0: SchemaNode): ParseProblem | undefined {
  if (v === null || v === undefined) return undefined;
  const node = resolve(node0);
  if (node === definitions.Image) {
    if (typeof v === 'string') {
      if (ociLayoutPath(v) === '') {
        return { path, message: `image ${JSON.stringify(v)} names no OCI layout directory after the prefix; write "oci:./layout"` };
      }
      return undefined;
    }
    if (isObject(v)) return checkStruct(path, v, definitions.Image.oneOf[1] as unknown as SchemaNode);
    return wrongType(path, v, `a string ("host", "python:3.12", "./rootfs", "image.tar", "oci:./layout") or an object with one of ${imageObjectFieldList}`);
  }
  if (Array.isArray(node.anyOf)) {
    // A quantity: a string or a bare number.
    if (typeof v === 'string' || typeof v === 'number') return undefined;
    return wrongType(path, v, 'a quantity such as "500m", "512Mi" or 2');
  }
  switch (node.type) {
    case 'object':
      if (!isObject(v)) return wrongType(path, v, 'an object');
      if (node.properties) return checkStruct(path, v, node);
      for (const k of sortedKeys(v)) {
        const p = checkShape(`${path}[${k}]`, v[k], node.additionalProperties as SchemaNode);
        if (p) return p;
      }
      return undefined;
    case 'array':
      if (!Array.isArray(v)) return wrongType(path, v, 'a list');
      for (let i = 0; i < v.length; i++) {
        const p = checkShape(`${path}[${i}]`, v[i], node.items as SchemaNode);
        if (p) return p;
      }
      return undefined;
    case 'string':
      return typeof v === 'string' ? undefined : wrongType(path, v, 'a string');
    case 'boolean':
      return typeof v === 'boolean' ? undefined : wrongType(path, v, 'true or false');
    case 'integer':
      if (typeof v !== 'number') return wrongType(path, v, 'an integer');
      if (!Number.isSafeInteger(v)) return { path, message: `must be an integer that fits 64 bits, got ${v}` };
      return undefined;
  }
  return { path, message: `unsupported schema node at ${path}` };
}

function checkStruct(path: string, m: Record<string, unknown>, node: SchemaNode): ParseProblem | undefined {
  const props = node.properties as Record<string, SchemaNode>;
  for (const k of sortedKeys(m)) {
    if (!(k in props)) return { path: join(path, k), message: `unknown field; allowed: ${Object.keys(props).join(', ')}` };
    const p = checkShape(join(path, k), m[k], props[k]);
    if (p) return p;
  }
  return undefined;
}
