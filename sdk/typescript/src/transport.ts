import http from 'node:http';
import https from 'node:https';
import { Readable } from 'node:stream';

import type { AirlockError, ErrorBody } from './error-base.js';
import { codeForStatus, errorFromBody, InvalidError, OutcomeUnknownError, UnreachableError } from './errors.js';

/** The daemon's default unix socket (Go's api.DefaultSocket). */
export const defaultSocket = '/run/airlock/airlock.sock';

/** How to reach the daemon: its unix socket, or its TCP listener (https, or http on loopback). */
export interface ClientOptions {
  /** The unix socket (default /run/airlock/airlock.sock when url is not set). */
  socket?: string;
  /** https://host:port of `airlock serve --listen` (http:// only for a loopback listener). */
  url?: string;
  /** An API key (the daemon's full rights). Set apiKey or token, not both. */
  apiKey?: string;
  /** A delegated capability token (one session, one class). */
  token?: string;
  /** TLS settings for an https url: the CA that signed the daemon's certificate, a server name. */
  tls?: Pick<https.AgentOptions, 'ca' | 'cert' | 'key' | 'servername' | 'rejectUnauthorized'>;
}

/** A request body: bytes, text, or a stream of bytes. */
export type Body = string | Uint8Array | Readable | AsyncIterable<Uint8Array | string>;

export interface RequestOptions {
  query?: Record<string, string | number | boolean | string[] | undefined>;
  body?: Body;
  /** Written before body (the exec header). */
  head?: string;
  contentType?: string;
  signal?: AbortSignal;
  /** The call changes state: a failure after sending is OutcomeUnknownError, not UnreachableError. */
  mutating?: boolean;
}

/** The HTTP/1.1 transport: one keep-alive agent, the credential on every request. */
export class Transport {
  readonly #agent: http.Agent;
  readonly #module: typeof http | typeof https;
  readonly #socket?: string;
  readonly #base: URL;
  readonly #credential: string;

  constructor(opts: ClientOptions = {}) {
    if (opts.apiKey && opts.token) {
      throw new InvalidError('client: set apiKey or token, not both');
    }
    if (opts.url && opts.socket) {
      throw new InvalidError('client: set socket or url, not both');
    }
    this.#credential = opts.apiKey || opts.token || '';
    if (opts.url) {
      let u: URL;
      try {
        u = new URL(opts.url);
      } catch {
        throw new InvalidError(`client: url ${JSON.stringify(opts.url)}: want https://host[:port]`);
      }
      if ((u.protocol !== 'http:' && u.protocol !== 'https:') || !u.host) {
        throw new InvalidError(`client: url ${JSON.stringify(opts.url)}: want https://host[:port]`);
      }
      this.#base = u;
      this.#module = u.protocol === 'https:' ? https : http;
      this.#agent = u.protocol === 'https:' ? new https.Agent({ keepAlive: true, ...opts.tls }) : new http.Agent({ keepAlive: true });
    } else {
      this.#socket = opts.socket || defaultSocket;
      this.#base = new URL('http://airlock');
      this.#module = http;
      this.#agent = new http.Agent({ keepAlive: true });
    }
  }

  /** Closes idle connections; requests in flight finish. */
  close(): void {
    this.#agent.destroy();
  }

  /**
   * Sends a request and resolves with the answer once its status is 2xx; any other status is
   * thrown as the error class of its body's code.
   */
  request(method: string, path: string, opts: RequestOptions = {}): Promise<http.IncomingMessage> {
    const u = new URL(path, this.#base);
    for (const [k, v] of Object.entries(opts.query ?? {})) {
      if (Array.isArray(v)) v.forEach((x) => u.searchParams.append(k, x));
      else if (v !== undefined) u.searchParams.set(k, String(v));
    }
    const headers: Record<string, string> = {};
    if (opts.contentType) headers['Content-Type'] = opts.contentType;
    if (this.#credential) headers.Authorization = `Bearer ${this.#credential}`;
    const what = `${method} ${u.pathname}`;
    return new Promise((resolve, reject) => {
      let sent = false;
      const req = this.#module.request(
        u,
        { method, headers, agent: this.#agent, socketPath: this.#socket, signal: opts.signal },
        (res) => {
          const status = res.statusCode ?? 0;
          if (status >= 200 && status <= 299) {
            resolve(res);
            return;
          }
          readAll(res, 1 << 20)
            .then((b) => reject(decodeError(status, b, String(res.headers['x-request-id'] ?? ''))))
            .catch((err) => reject(transportError(what, !!opts.mutating, true, err, opts.signal)));
        },
      );
      req.on('error', (err) => reject(transportError(what, !!opts.mutating, sent, err, opts.signal)));
      req.on('socket', (s) => {
        // A reused keep-alive socket is connected already; a new one once it connects (a TLS
        // one once its handshake is done: a refused certificate means nothing was sent).
        if (req.reusedSocket) sent = true;
        else s.once(this.#module === https ? 'secureConnect' : 'connect', () => (sent = true));
      });
      if (opts.head !== undefined) req.write(opts.head);
      const body = opts.body;
      if (body === undefined) {
        req.end();
      } else if (typeof body === 'string' || body instanceof Uint8Array) {
        req.end(body);
      } else {
        const src = body instanceof Readable ? body : Readable.from(body, { objectMode: false });
        src.on('error', (err) => req.destroy(err));
        src.pipe(req);
      }
    });
  }

  /** A JSON call: the body encoded, the 2xx answer decoded (undefined for 204). */
  async json<T>(method: string, path: string, body?: unknown, opts: Omit<RequestOptions, 'body'> = {}): Promise<T> {
    const res = await this.request(method, path, {
      ...opts,
      body: body === undefined ? undefined : JSON.stringify(body),
      contentType: body === undefined ? undefined : 'application/json',
    });
    let b: Buffer;
    try {
      b = await readAll(res, Infinity);
    } catch (err) {
      throw transportError(`${method} ${path}`, !!opts.mutating, true, err, opts.signal);
    }
    if (res.statusCode === 204 || b.length === 0) return undefined as T;
    try {
      return JSON.parse(b.toString('utf8')) as T;
    } catch (err) {
      const Class = opts.mutating ? OutcomeUnknownError : UnreachableError;
      throw new Class(`${method} ${path}: decode answer: ${(err as Error).message}`, { cause: err });
    }
  }
}

/** Reads a whole answer (at most limit bytes). */
export async function readAll(res: Readable, limit: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const c of res) {
    const b = Buffer.isBuffer(c) ? c : Buffer.from(c);
    n += b.length;
    if (n > limit) break;
    chunks.push(b);
  }
  return Buffer.concat(chunks);
}

function decodeError(status: number, b: Buffer, requestId: string): AirlockError {
  try {
    const body = JSON.parse(b.toString('utf8')) as ErrorBody;
    if (body && typeof body.code === 'string' && body.code) return errorFromBody(body, status);
  } catch {
    // not an error body: classified by status below
  }
  const code = codeForStatus(status);
  return errorFromBody({ code: code as ErrorBody['code'], message: `HTTP ${status}: ${b.toString('utf8').trim()}`, requestId }, status);
}

/**
 * A failed round trip, as Go's client classifies it: an abort is the signal's reason; a
 * failure before anything was sent is UnreachableError; after, a call that changes state is
 * OutcomeUnknownError (it may have been applied).
 */
export function transportError(what: string, mutating: boolean, sent: boolean, err: unknown, signal?: AbortSignal): unknown {
  if (signal?.aborted) return signal.reason ?? err;
  if (mutating && sent) return new OutcomeUnknownError(`${what}: ${(err as Error).message}`, { cause: err });
  return new UnreachableError(`${what}: ${(err as Error).message}`, { cause: err });
}
