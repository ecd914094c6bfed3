import YAML from 'yaml';

import type { Egress, Image, Limits, Sandbox as Declaration, Session, Stack as StackDeclaration, Workload } from './gen/declaration.js';
import type { Problem } from './error-base.js';
import { InvalidError } from './errors.js';
import { apiVersion, stackKind, type FieldError, validateSandbox, validateStack, type Verdict } from './validate.js';

/** YAML as `airlock plan -f` reads it: YAML 1.1, so strings such as "yes" and "on" are quoted. */
function toYAML(v: unknown): string {
  return YAML.stringify(v, { version: '1.1' });
}

/** The problems of a verdict as the daemon's Problem bodies (the field is the path). */
export function problemsOf(v: Verdict): Problem[] {
  if (v.parse) return [{ field: v.parse.path, rule: 'parse', message: v.parse.message }];
  return v.problems.map((p: FieldError) => ({ sandboxId: p.sandboxId || undefined, field: p.path, value: p.value || undefined, rule: p.rule, message: p.message }));
}

/** Throws InvalidError with every problem unless the verdict is clean. */
function assertValid(v: Verdict, what: string): void {
  const problems = problemsOf(v);
  if (problems.length === 0) return;
  const first = problems[0];
  const more = problems.length > 1 ? ` (and ${problems.length - 1} more)` : '';
  throw new InvalidError(`${what}: ${first.field ? `${first.field}: ` : ''}${first.message} (rule ${first.rule})${more}`, { problems });
}

/** The egress choices of a sandbox builder; each returns the builder. */
export interface EgressBuilder {
  /** No connections (the default). */
  deny(): SandboxBuilder;
  /** Public internet only: never private, loopback, link-local or metadata addresses. */
  allow(): SandboxBuilder;
  /** Only these names ("api.example.com", "*.example.com"). */
  allowDomains(...domains: string[]): SandboxBuilder;
  /** No restriction at all; never the default. */
  open(): SandboxBuilder;
}

/**
 * Builds one Sandbox declaration:
 * `sandbox('py').image('docker.io/library/python:3.12').limits({cpu: '500m', memory: '1Gi'}).egress.allowDomains('pypi.org')`.
 * Nothing is checked until validate(), check(), or the daemon.
 */
export class SandboxBuilder {
  #d: Declaration;

  constructor(id: string) {
    this.#d = { id, image: '' };
  }

  image(image: Image): this {
    this.#d.image = image;
    return this;
  }

  /** Merges resource ceilings: cpu ("500m"), memory ("1Gi"), disk, maxProcesses. */
  limits(limits: Limits): this {
    this.#d.limits = { ...this.#d.limits, ...limits };
    return this;
  }

  get egress(): EgressBuilder {
    const set = (e: Egress) => {
      this.#d.egress = e;
      return this;
    };
    return {
      deny: () => set({ mode: 'deny' }),
      allow: () => set({ mode: 'allow' }),
      allowDomains: (...domains: string[]) => set({ mode: 'allowDomains', domains }),
      open: () => set({ mode: 'open' }),
    };
  }

  /** Merges session bounds: maxLifetimeSeconds, idleTimeoutSeconds, reconnect. */
  session(session: Session): this {
    this.#d.session = { ...this.#d.session, ...session };
    return this;
  }

  labels(labels: Record<string, string>): this {
    this.#d.labels = { ...this.#d.labels, ...labels };
    return this;
  }

  env(env: Record<string, string>): this {
    this.#d.env = { ...this.#d.env, ...env };
    return this;
  }

  previewPorts(...ports: number[]): this {
    this.#d.previewPorts = [...(this.#d.previewPorts ?? []), ...ports];
    return this;
  }

  workdir(dir: string): this {
    this.#d.workdir = dir;
    return this;
  }

  runtime(runtime: NonNullable<Declaration['runtime']>): this {
    this.#d.runtime = runtime;
    return this;
  }

  /** The workload of the stack that hosts this sandbox (required on gcp). */
  hostedBy(workload: string): this {
    this.#d.hostedBy = workload;
    return this;
  }

  get id(): string {
    return this.#d.id;
  }

  /** The declaration, as the daemon's create and a stack's sandboxes[] take it. */
  toJSON(): Declaration {
    return structuredClone(this.#d);
  }

  toYAML(): string {
    return toYAML(this.toJSON());
  }

  /** Go spec's verdict on this declaration alone (stack rules such as hostedBy need stack()). */
  validate(): Verdict {
    return validateSandbox(this.toJSON());
  }

  /** Throws InvalidError (every problem, with field paths) unless the declaration is valid. */
  check(): this {
    assertValid(this.validate(), `sandbox ${JSON.stringify(this.#d.id)}`);
    return this;
  }
}

/** Starts a sandbox declaration. */
export function sandbox(id: string): SandboxBuilder {
  return new SandboxBuilder(id);
}

/** A workload that hosts or links sandboxes: its id, image and the sandbox ids it hosts. */
export type WorkloadInit = Workload;

/** Builds a Stack file: sandboxes and the workloads that host them. */
export class StackBuilder {
  #sandboxes: (SandboxBuilder | Declaration)[] = [];
  #workloads: Workload[] = [];

  constructor(items: (SandboxBuilder | Declaration)[]) {
    this.#sandboxes.push(...items);
  }

  /** Adds sandboxes. */
  sandbox(...items: (SandboxBuilder | Declaration)[]): this {
    this.#sandboxes.push(...items);
    return this;
  }

  /** Adds a workload; hosts names sandbox ids of this stack. */
  workload(w: Workload): this {
    this.#workloads.push(structuredClone(w));
    return this;
  }

  /** The stack file, as `airlock plan -f` reads it. */
  toJSON(): StackDeclaration {
    const st: StackDeclaration = {
      apiVersion: apiVersion as StackDeclaration['apiVersion'],
      kind: stackKind as StackDeclaration['kind'],
      sandboxes: this.#sandboxes.map((s) => (s instanceof SandboxBuilder ? s.toJSON() : structuredClone(s))) as StackDeclaration['sandboxes'],
    };
    if (this.#workloads.length > 0) st.workloads = structuredClone(this.#workloads);
    return st;
  }

  toYAML(): string {
    return toYAML(this.toJSON());
  }

  /** Go spec's verdict on the whole stack (paths such as "sandboxes[1].limits.memory"). */
  validate(): Verdict {
    return validateStack(this.toJSON());
  }

  check(): this {
    assertValid(this.validate(), 'stack');
    return this;
  }
}

/** Starts a stack of the given sandboxes. */
export function stack(...sandboxes: (SandboxBuilder | Declaration)[]): StackBuilder {
  return new StackBuilder(sandboxes);
}
