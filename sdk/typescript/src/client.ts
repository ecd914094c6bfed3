import type { IncomingMessage } from 'node:http';
import { Readable } from 'node:stream';

import type { components } from './gen/api.js';
import type { Egress, Sandbox as Declaration } from './gen/declaration.js';
import { AirlockError, errorFromBody, OutcomeUnknownError } from './errors.js';
import { type Body, type ClientOptions, readAll, Transport, transportError } from './transport.js';

type S = components['schemas'];
export type Session = S['Session'];
export type CapabilitySet = S['CapabilitySet'];
export type Health = S['Health'];
export type ExecRequest = S['ExecRequest'];
export type ExecResult = S['ExecResult'];
export type FileInfo = S['FileInfo'];
export type ProcessInfo = S['Process'];
export type Stats = S['Stats'];
export type Preview = S['Preview'];
export type Snapshot = S['Snapshot'];
export type Token = S['Token'];
export type TokenClass = S['TokenRequest']['class'];
export type EgressPolicy = S['EgressPolicy'];
export type EgressCounters = S['EgressCounters'];
export type { ClientOptions, Body } from './transport.js';

/** One output chunk of a command: its bytes on stdout or stderr, in one sequence across both. */
export interface OutputFrame {
  kind: 'output';
  seq: number;
  stream: 'stdout' | 'stderr';
  data: Buffer;
}

/** The last frame of a command that ran to its end (a non-zero exit, a timeout or an OOM kill included). */
export interface ExitFrame {
  kind: 'exit';
  result: ExecResult;
}

export type Frame = OutputFrame | ExitFrame;

/** What to run and how: the exec header, plus stdin to stream and an AbortSignal. */
export interface ExecOptions extends Omit<ExecRequest, 'stdin'> {
  /** The command's stdin, streamed while its output streams back; without it stdin is /dev/null. */
  stdin?: Body;
  /** Aborting closes the stream: the daemon kills the command and everything it started. */
  signal?: AbortSignal;
}

/** What run collected. */
export interface RunResult extends ExecResult {
  stdout: string;
  stderr: string;
  stdoutBytes: Buffer;
  stderrBytes: Buffer;
}

/** Anything create accepts: a declaration, or a builder (its toJSON is the declaration). */
export type DeclarationLike = Declaration | { toJSON(): Declaration };

const v1 = '/v1';

/**
 * The client of the daemon's HTTP API (`airlock serve`, docs/api.md) over its unix socket or
 * TCP+TLS. Every failure is an AirlockError subclass decoded from the wire's error code.
 */
export class Client {
  readonly transport: Transport;

  constructor(opts: ClientOptions = {}) {
    this.transport = new Transport(opts);
  }

  /** AIRLOCK_SOCKET or AIRLOCK_URL, and AIRLOCK_API_KEY or AIRLOCK_TOKEN, as Go's client.FromEnv. */
  static fromEnv(env: NodeJS.ProcessEnv = process.env): Client {
    return new Client({
      socket: env.AIRLOCK_SOCKET || undefined,
      url: env.AIRLOCK_URL || undefined,
      apiKey: env.AIRLOCK_API_KEY || undefined,
      token: env.AIRLOCK_TOKEN || undefined,
    });
  }

  /** Closes idle connections. */
  close(): void {
    this.transport.close();
  }

  health(opts: { signal?: AbortSignal } = {}): Promise<Health> {
    return this.transport.json('GET', '/healthz', undefined, opts);
  }

  /** The daemon's capability set: what its platform enforces (as `airlock capabilities -o json`). */
  capabilities(opts: { signal?: AbortSignal } = {}): Promise<CapabilitySet> {
    return this.transport.json('GET', `${v1}/capabilities`, undefined, opts);
  }

  /**
   * Creates a sandbox. A declaration the daemon finds invalid throws InvalidError (every
   * problem in .problems); one its platform cannot enforce throws RefusedError (.capability).
   */
  async create(decl: DeclarationLike, opts: { signal?: AbortSignal } = {}): Promise<Sandbox> {
    const body = 'toJSON' in decl && typeof decl.toJSON === 'function' ? decl.toJSON() : decl;
    const s = await this.transport.json<Session>('POST', `${v1}/sandboxes`, body, { ...opts, mutating: true });
    return new Sandbox(this, s);
  }

  /** Creates a sandbox from one of the daemon's templates (--templates), labels merged over its own. */
  async createFromTemplate(template: string, labels?: Record<string, string>, opts: { signal?: AbortSignal } = {}): Promise<Sandbox> {
    const s = await this.transport.json<Session>('POST', `${v1}/sandboxes`, { template, labels }, { ...opts, mutating: true });
    return new Sandbox(this, s);
  }

  /** The session id's sandbox, as the daemon has it now. */
  async get(id: string, opts: { signal?: AbortSignal } = {}): Promise<Sandbox> {
    return new Sandbox(this, await this.transport.json<Session>('GET', sandboxPath(id), undefined, opts));
  }

  /** A handle on a session id without a call (for a delegated caller that may not get). */
  sandbox(id: string): Sandbox {
    return new Sandbox(this, { id } as Session);
  }

  /** The sandboxes carrying every label given (none: all). A delegated caller sees its own at most. */
  async list(labels: Record<string, string> = {}, opts: { signal?: AbortSignal } = {}): Promise<Sandbox[]> {
    const out = await this.transport.json<{ sandboxes: Session[] }>('GET', `${v1}/sandboxes`, undefined, {
      ...opts,
      query: { label: Object.entries(labels).map(([k, v]) => `${k}=${v}`) },
    });
    return out.sandboxes.map((s) => new Sandbox(this, s));
  }

  /** The daemon's snapshots, oldest first (UnsupportedError where the platform has none). */
  async snapshots(opts: { signal?: AbortSignal } = {}): Promise<Snapshot[]> {
    return (await this.transport.json<{ snapshots: Snapshot[] }>('GET', `${v1}/snapshots`, undefined, opts)).snapshots;
  }

  /** Removes a snapshot; sandboxes made from it keep running. */
  async deleteSnapshot(name: string, opts: { signal?: AbortSignal } = {}): Promise<void> {
    await this.transport.json('DELETE', `${v1}/snapshots/${encodeURIComponent(name)}`, undefined, { ...opts, mutating: true });
  }
}

function sandboxPath(id: string, suffix = ''): string {
  return `${v1}/sandboxes/${encodeURIComponent(id)}${suffix}`;
}

/** One session of a sandbox on the daemon. */
export class Sandbox {
  readonly client: Client;
  /** The session as last read (create, get, refresh, pause, resume). */
  session: Session;

  constructor(client: Client, session: Session) {
    this.client = client;
    this.session = session;
  }

  /** The session id (s-…). */
  get id(): string {
    return this.session.id;
  }

  private get t(): Transport {
    return this.client.transport;
  }

  private path(suffix = ''): string {
    return sandboxPath(this.id, suffix);
  }

  /** Reads the session again. */
  async refresh(opts: { signal?: AbortSignal } = {}): Promise<Session> {
    this.session = await this.t.json<Session>('GET', this.path(), undefined, opts);
    return this.session;
  }

  /** Ends the sandbox; resolves once it is gone. Idempotent. */
  async terminate(opts: { signal?: AbortSignal } = {}): Promise<void> {
    await this.t.json('DELETE', this.path(), undefined, { ...opts, mutating: true });
  }

  async pause(opts: { signal?: AbortSignal } = {}): Promise<Session> {
    this.session = await this.t.json<Session>('POST', this.path('/pause'), undefined, { ...opts, mutating: true });
    return this.session;
  }

  async resume(opts: { signal?: AbortSignal } = {}): Promise<Session> {
    this.session = await this.t.json<Session>('POST', this.path('/resume'), undefined, { ...opts, mutating: true });
    return this.session;
  }

  stats(opts: { signal?: AbortSignal } = {}): Promise<Stats> {
    return this.t.json('GET', this.path('/stats'), undefined, opts);
  }

  /**
   * Runs a command and yields its output as it is produced, then one exit frame. An error
   * event is thrown as its class; a stream that ends without a result is OutcomeUnknownError.
   * Leaving the loop early, or aborting opts.signal, kills the command in the sandbox.
   */
  exec(opts: ExecOptions): AsyncIterable<Frame> {
    const { stdin, signal, ...header } = opts;
    const t = this.t;
    const path = this.path('/exec');
    return {
      async *[Symbol.asyncIterator]() {
        const req: ExecRequest = { ...header, stdin: stdin !== undefined };
        const res = await t.request('POST', path, {
          head: JSON.stringify(req) + (stdin !== undefined ? '\n' : ''),
          body: stdin ?? '',
          contentType: 'application/json',
          signal,
          mutating: true,
        });
        yield* events(res, `POST ${path}`, signal);
      },
    };
  }

  /** Runs a command to its end and collects its output (see exec). */
  async run(cmd: string | string[], opts: Omit<ExecOptions, 'argv' | 'shell'> = {}): Promise<RunResult> {
    const req: ExecOptions = { ...opts, ...(typeof cmd === 'string' ? { shell: cmd } : { argv: cmd }) };
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    for await (const f of this.exec(req)) {
      if (f.kind === 'output') (f.stream === 'stdout' ? out : err).push(f.data);
      else {
        const stdoutBytes = Buffer.concat(out);
        const stderrBytes = Buffer.concat(err);
        return { ...f.result, stdoutBytes, stderrBytes, stdout: stdoutBytes.toString('utf8'), stderr: stderrBytes.toString('utf8') };
      }
    }
    throw new OutcomeUnknownError('exec: the stream ended without a result');
  }

  /** Writes a file from bytes, text or a stream, replacing it atomically (mode default 0644). */
  async writeFile(path: string, data: Body, opts: { mode?: number; signal?: AbortSignal } = {}): Promise<void> {
    const res = await this.t.request('PUT', this.path('/files'), {
      query: { path, mode: opts.mode === undefined ? undefined : opts.mode.toString(8) },
      body: data,
      contentType: 'application/octet-stream',
      signal: opts.signal,
      mutating: true,
    });
    res.resume();
  }

  /**
   * Streams a file's bytes. A transfer the daemon cuts off fails the stream with an error:
   * never a short file that looks whole.
   */
  async readFileStream(path: string, opts: { offset?: number; length?: number; signal?: AbortSignal } = {}): Promise<Readable> {
    const res = await this.t.request('GET', this.path('/files'), {
      query: { path, offset: opts.offset || undefined, length: opts.length || undefined },
      signal: opts.signal,
    });
    return res;
  }

  /** Reads a whole file. */
  async readFile(path: string, opts: { offset?: number; length?: number; signal?: AbortSignal } = {}): Promise<Buffer> {
    const res = await this.readFileStream(path, opts);
    try {
      return await readAll(res, Infinity);
    } catch (err) {
      throw transportError(`GET ${this.path('/files')}`, false, true, err, opts.signal);
    }
  }

  stat(path: string, opts: { signal?: AbortSignal } = {}): Promise<FileInfo> {
    return this.t.json('GET', this.path('/files/stat'), undefined, { ...opts, query: { path } });
  }

  async listFiles(path: string, opts: { signal?: AbortSignal } = {}): Promise<FileInfo[]> {
    return (await this.t.json<{ files: FileInfo[] }>('GET', this.path('/files/list'), undefined, { ...opts, query: { path } })).files;
  }

  async mkdir(path: string, opts: { mode?: number; signal?: AbortSignal } = {}): Promise<void> {
    await this.t.json('POST', this.path('/files/mkdir'), { path, mode: opts.mode ?? 0o755 }, { signal: opts.signal, mutating: true });
  }

  async remove(path: string, opts: { recursive?: boolean; signal?: AbortSignal } = {}): Promise<void> {
    await this.t.json('DELETE', this.path('/files'), undefined, {
      signal: opts.signal,
      mutating: true,
      query: { path, recursive: opts.recursive ? 'true' : undefined },
    });
  }

  /** Starts a background process; it outlives this call (see Process). */
  async startProcess(req: ExecRequest, opts: { signal?: AbortSignal } = {}): Promise<Process> {
    const p = await this.t.json<ProcessInfo>('POST', this.path('/processes'), req, { ...opts, mutating: true });
    return new Process(this, p);
  }

  async processes(opts: { signal?: AbortSignal } = {}): Promise<Process[]> {
    const out = await this.t.json<{ processes: ProcessInfo[] }>('GET', this.path('/processes'), undefined, opts);
    return out.processes.map((p) => new Process(this, p));
  }

  async process(id: string, opts: { signal?: AbortSignal } = {}): Promise<Process> {
    return new Process(this, await this.t.json<ProcessInfo>('GET', this.path(`/processes/${encodeURIComponent(id)}`), undefined, opts));
  }

  /** Mints a delegated token for this session (daemon callers only). Hand token.token to a less trusted caller. */
  mintToken(cls: TokenClass, opts: { ttlSeconds?: number; signal?: AbortSignal } = {}): Promise<Token> {
    return this.t.json('POST', this.path('/tokens'), { class: cls, ttlSeconds: opts.ttlSeconds }, { signal: opts.signal, mutating: true });
  }

  /** Replaces the egress policy of the running sandbox (daemon only; UnsupportedError where not live). */
  setEgress(egress: Egress, opts: { signal?: AbortSignal } = {}): Promise<EgressPolicy> {
    return this.t.json('PUT', this.path('/egress'), egress, { ...opts, mutating: true });
  }

  egressCounters(opts: { signal?: AbortSignal } = {}): Promise<EgressCounters> {
    return this.t.json('GET', this.path('/egress/counters'), undefined, opts);
  }

  /** Exposes one of the declaration's previewPorts behind the authenticated proxy. */
  preview(port: number, opts: { ttlSeconds?: number; signal?: AbortSignal } = {}): Promise<Preview> {
    return this.t.json('POST', this.path('/previews'), { port, ttlSeconds: opts.ttlSeconds }, { signal: opts.signal, mutating: true });
  }

  /** Captures the sandbox's files as a named snapshot (image: {snapshot: name} starts from it). */
  snapshot(name: string, opts: { signal?: AbortSignal } = {}): Promise<Snapshot> {
    return this.t.json('POST', this.path('/snapshots'), { name }, { ...opts, mutating: true });
  }

  /** Snapshots the sandbox and starts count new sandboxes from it, all or none. */
  async fork(count: number, opts: { signal?: AbortSignal } = {}): Promise<Sandbox[]> {
    const out = await this.t.json<{ sandboxes: Session[] }>('POST', this.path('/fork'), { count }, { ...opts, mutating: true });
    return out.sandboxes.map((s) => new Sandbox(this.client, s));
  }
}

/** A background process in a sandbox. */
export class Process {
  readonly sandbox: Sandbox;
  info: ProcessInfo;

  constructor(sandbox: Sandbox, info: ProcessInfo) {
    this.sandbox = sandbox;
    this.info = info;
  }

  get id(): string {
    return this.info.id;
  }

  private path(suffix = ''): string {
    return sandboxPath(this.sandbox.id, `/processes/${encodeURIComponent(this.id)}${suffix}`);
  }

  private get t(): Transport {
    return this.sandbox.client.transport;
  }

  async refresh(opts: { signal?: AbortSignal } = {}): Promise<ProcessInfo> {
    this.info = await this.t.json<ProcessInfo>('GET', this.path(), undefined, opts);
    return this.info;
  }

  /**
   * The process's output as frames; from 'start' replays what the agent still holds, 'live'
   * (default) only new output. Leaving the loop leaves the process running.
   */
  output(opts: { from?: 'start' | 'live'; signal?: AbortSignal } = {}): AsyncIterable<Frame> {
    const t = this.t;
    const path = this.path('/output');
    return {
      async *[Symbol.asyncIterator]() {
        const res = await t.request('GET', path, { query: { from: opts.from ?? 'live' }, signal: opts.signal });
        yield* events(res, `GET ${path}`, opts.signal);
      },
    };
  }

  /** Sends bytes to the process's stdin (it was started with stdin: true); close ends it. */
  async writeStdin(data: Body, opts: { close?: boolean; signal?: AbortSignal } = {}): Promise<void> {
    const res = await this.t.request('POST', this.path('/stdin'), {
      query: { close: opts.close ? 'true' : undefined },
      body: data,
      contentType: 'application/octet-stream',
      signal: opts.signal,
      mutating: true,
    });
    res.resume();
  }

  async signal(signal: string, opts: { signal?: AbortSignal } = {}): Promise<void> {
    await this.t.json('POST', this.path('/signal'), { signal }, { signal: opts.signal, mutating: true });
  }

  /** Resolves with the result once the process and everything it started are gone. */
  wait(opts: { signal?: AbortSignal } = {}): Promise<ExecResult> {
    return this.t.json('GET', this.path('/wait'), undefined, opts);
  }

  async resize(rows: number, cols: number, opts: { signal?: AbortSignal } = {}): Promise<void> {
    await this.t.json('POST', this.path('/resize'), { rows, cols }, { signal: opts.signal, mutating: true });
  }

  /** Removes the process (killing it if it runs). */
  async remove(opts: { signal?: AbortSignal } = {}): Promise<void> {
    await this.t.json('DELETE', this.path(), undefined, { signal: opts.signal, mutating: true });
  }
}

type Event = S['Event'];

/** Decodes an NDJSON event stream into frames; destroying the answer when the consumer leaves. */
async function* events(res: IncomingMessage, what: string, signal?: AbortSignal): AsyncGenerator<Frame> {
  let buf = '';
  let done = false;
  try {
    for await (const chunk of res) {
      buf += (chunk as Buffer).toString('utf8');
      let nl: number;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!line) continue;
        let ev: Event;
        try {
          ev = JSON.parse(line) as Event;
        } catch (err) {
          throw new OutcomeUnknownError(`${what}: undecodable event: ${(err as Error).message}`, { cause: err });
        }
        if (ev.error) throw errorFromBody(ev.error);
        if (ev.exit) {
          done = true;
          yield { kind: 'exit', result: ev.exit };
          return;
        }
        if (ev.stream) {
          yield { kind: 'output', seq: ev.seq ?? 0, stream: ev.stream, data: Buffer.from(ev.data ?? '', 'base64') };
        }
      }
    }
  } catch (err) {
    if (err instanceof AirlockError) throw err;
    throw transportError(what, true, true, err, signal);
  } finally {
    if (!done) res.destroy();
  }
  throw new OutcomeUnknownError(`${what}: the stream ended without a result`);
}


