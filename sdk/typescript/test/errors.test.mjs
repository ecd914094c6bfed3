// Every code of the one wire table decodes to its class, from the daemon's error body (as an
// HTTP answer and as an exec stream's terminal event), never from the message text; answers
// without a body and failed round trips are classified as Go's client classifies them.
// A stand-in HTTP server on a unix socket answers what the test tells it to.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import * as sdk from '../dist/index.js';

const { Client, AirlockError, errorClasses } = sdk;

// Go's table (sandbox/sbtypes/codes.go) as docs/api.md prints it, plus canceled and internal.
const table = [
  ['invalid', 400, 'InvalidError'],
  ['unauthenticated', 401, 'UnauthenticatedError'],
  ['forbidden', 403, 'ForbiddenError'],
  ['not_found', 404, 'NotFoundError'],
  ['conflict', 409, 'ConflictError'],
  ['too_large', 413, 'TooLargeError'],
  ['refused', 422, 'RefusedError'],
  ['unsupported', 501, 'UnsupportedError'],
  ['deadline_exceeded', 504, 'DeadlineExceededError'],
  ['unreachable', 502, 'UnreachableError'],
  ['outcome_unknown', 504, 'OutcomeUnknownError'],
  ['canceled', 499, 'CanceledError'],
  ['internal', 500, 'InternalError'],
];

let server;
let dir;
let answer; // (req, res) => void, set by each test

before(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'airlock-ts-'));
  server = http.createServer((req, res) => answer(req, res));
  await new Promise((resolve) => server.listen(path.join(dir, 's.sock'), resolve));
});

after(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
  rmSync(dir, { recursive: true, force: true });
});

const client = () => new Client({ socket: path.join(dir, 's.sock') });

describe('the wire table', () => {
  it('the generated classes are the table, in its order', () => {
    assert.deepEqual(
      errorClasses.map((c) => [c.code, c.status, c.name]),
      table,
    );
  });

  for (const [code, status, name] of table) {
    it(`${code} (${status}) is ${name}, with its reason, request id and problems`, async () => {
      const problems = [{ sandboxId: 'web', field: 'egress.domains', value: 'x', capability: 'domainEgressRules', rule: 'capability', message: 'no' }];
      // The message names another class: the code decides, never the text.
      answer = (req, res) => {
        res.writeHead(status, { 'Content-Type': 'application/json', 'X-Request-Id': 'r-1' });
        res.end(JSON.stringify({ code, reason: 'because', message: 'not found: looks like another class', requestId: 'r-1', problems }));
      };
      const c = client();
      await assert.rejects(c.get('s-1'), (err) => {
        assert.ok(err instanceof sdk[name], `${err.name} is not ${name}`);
        assert.ok(err instanceof AirlockError);
        assert.equal(err.code, code);
        assert.equal(err.status, status);
        assert.equal(err.reason, 'because');
        assert.equal(err.requestId, 'r-1');
        assert.equal(err.capability, 'domainEgressRules');
        assert.deepEqual(err.problems, problems);
        return true;
      });
      c.close();
    });

    it(`${code} as an exec stream's terminal error event is ${name}`, async () => {
      answer = (req, res) => {
        res.writeHead(200, { 'Content-Type': 'application/x-ndjson' });
        res.write(JSON.stringify({ seq: 1, stream: 'stdout', data: Buffer.from('partial\n').toString('base64') }) + '\n');
        res.end(JSON.stringify({ error: { code, message: 'it failed' } }) + '\n');
      };
      const c = client();
      const frames = [];
      await assert.rejects(
        (async () => {
          for await (const f of c.sandbox('s-1').exec({ argv: ['true'] })) frames.push(f);
        })(),
        sdk[name],
      );
      assert.equal(frames.length, 1);
      assert.equal(frames[0].data.toString(), 'partial\n');
      c.close();
    });
  }

  it('an unknown code is InternalError', async () => {
    answer = (req, res) => {
      res.writeHead(418, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ code: 'teapot', message: 'short and stout' }));
    };
    await assert.rejects(client().get('s-1'), sdk.InternalError);
  });

  const bare = [
    [400, 'InvalidError'],
    [405, 'InvalidError'],
    [404, 'NotFoundError'],
    [500, 'OutcomeUnknownError'], // a bare 500 from something between: the outcome is unknown
    [502, 'UnreachableError'],
    [504, 'DeadlineExceededError'], // the first class of 504 in the table
    [503, 'InternalError'],
  ];
  for (const [status, name] of bare) {
    it(`an answer ${status} without an error body is ${name} (Go's api.CodeForStatus)`, async () => {
      answer = (req, res) => {
        res.writeHead(status, { 'Content-Type': 'text/plain' });
        res.end('a proxy said no');
      };
      await assert.rejects(client().get('s-1'), sdk[name]);
    });
  }
});

describe('failed round trips', () => {
  it('nothing listening is UnreachableError', async () => {
    const c = new Client({ socket: path.join(dir, 'nobody.sock') });
    await assert.rejects(c.health(), sdk.UnreachableError);
    await assert.rejects(c.create({ id: 'x', image: 'host' }), sdk.UnreachableError);
  });

  it('a stream that ends without a result is OutcomeUnknownError', async () => {
    answer = (req, res) => {
      res.writeHead(200, { 'Content-Type': 'application/x-ndjson' });
      res.end(JSON.stringify({ seq: 1, stream: 'stdout', data: 'aGkK' }) + '\n');
    };
    await assert.rejects(client().sandbox('s-1').run('echo hi'), sdk.OutcomeUnknownError);
  });

  it('a connection cut during a create is OutcomeUnknownError (it may have been applied)', async () => {
    answer = (req) => req.socket.destroy();
    await assert.rejects(client().create({ id: 'x', image: 'host' }), sdk.OutcomeUnknownError);
  });

  it('a connection cut during a read is UnreachableError', async () => {
    answer = (req) => req.socket.destroy();
    await assert.rejects(client().get('s-1'), sdk.UnreachableError);
  });

  it('a download cut off after its first byte fails, never a short file', async () => {
    answer = (req, res) => {
      res.writeHead(200, { 'Content-Type': 'application/octet-stream' });
      res.write(Buffer.alloc(1000, 1));
      setImmediate(() => res.socket.destroy());
    };
    await assert.rejects(client().sandbox('s-1').readFile('/workspace/x'), AirlockError);
  });

  it('an AbortSignal rejects with its reason', async () => {
    answer = () => {}; // never answers
    const ac = new AbortController();
    const p = client().get('s-1', { signal: ac.signal });
    ac.abort(new Error('stop'));
    await assert.rejects(p, /stop/);
  });

  it('the credential goes out as a bearer token; apiKey and token together are refused', async () => {
    let auth;
    answer = (req, res) => {
      auth = req.headers.authorization;
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end('{"status":"ok","platform":"local"}');
    };
    await new Client({ socket: path.join(dir, 's.sock'), apiKey: 'k'.repeat(20) }).health();
    assert.equal(auth, `Bearer ${'k'.repeat(20)}`);
    assert.throws(() => new Client({ apiKey: 'a', token: 'b' }), sdk.InvalidError);
    assert.throws(() => new Client({ url: 'ftp://x' }), sdk.InvalidError);
  });
});
