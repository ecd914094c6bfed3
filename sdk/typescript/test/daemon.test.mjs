// The client against a real `airlock serve` this suite starts (root: the local runtime), on its
// unix socket and on TCP with TLS and an API key.
//
// Environment:
//   AIRLOCK_BIN                 the airlock binary (required; airlock-server and airlock-agent next to it)
//   AIRLOCK_E2E_STATE_DIR       --state-dir for the daemon (default: a fresh temp dir)
//   AIRLOCK_E2E_CGROUP_PARENT   --cgroup-parent for the daemon (default: derived from the state dir)
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync, chmodSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { PassThrough, Readable } from 'node:stream';

import * as sdk from '../dist/index.js';

const { Client, sandbox, stack } = sdk;

const bin = process.env.AIRLOCK_BIN;
if (!bin) throw new Error('set AIRLOCK_BIN to the airlock binary (go test ./sdk/typescript does)');

const work = mkdtempSync(path.join(os.tmpdir(), 'airlock-ts-'));
chmodSync(work, 0o711); // the sandbox's mapped root must reach the state dir's sessions
const stateDir = process.env.AIRLOCK_E2E_STATE_DIR || path.join(work, 'state');
const socket = path.join(work, 'airlock.sock');
const apiKey = randomBytes(24).toString('hex');

let daemon;
let tcpURL;
let ca;
let c; // the socket client

// startDaemon runs `airlock serve` and resolves once both listeners are up, with the TCP address.
function startDaemon() {
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '1',
    '-keyout', path.join(work, 'tls.key'), '-out', path.join(work, 'tls.crt'), '-subj', '/CN=localhost',
    '-addext', 'subjectAltName=IP:127.0.0.1'], { stdio: 'ignore' });
  ca = readFileSync(path.join(work, 'tls.crt'));
  writeFileSync(path.join(work, 'api-keys'), apiKey + '\n');
  chmodSync(path.join(work, 'api-keys'), 0o600);
  const args = ['serve', '--platform', 'local', '--state-dir', stateDir, '--socket', socket,
    '--signing-key', path.join(work, 'signing.key'), '--listen', '127.0.0.1:0',
    '--tls-cert', path.join(work, 'tls.crt'), '--tls-key', path.join(work, 'tls.key'), '--api-key-file', path.join(work, 'api-keys')];
  if (process.env.AIRLOCK_E2E_CGROUP_PARENT) args.push('--cgroup-parent', process.env.AIRLOCK_E2E_CGROUP_PARENT);
  return new Promise((resolve, reject) => {
    const child = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let buf = '';
    let unix = false;
    child.stderr.on('data', (d) => {
      buf += d.toString();
      if (/transport=unix/.test(buf)) unix = true;
      const m = buf.match(/transport=tcp addr=(\S+) tls=true/);
      if (unix && m) resolve({ child, addr: m[1] });
    });
    child.on('error', reject);
    child.on('exit', (code) => reject(new Error(`airlock serve exited with ${code} before serving:\n${buf}`)));
  });
}

before(async () => {
  const { child, addr } = await startDaemon();
  child.removeAllListeners('exit');
  child.stderr.resume();
  daemon = child;
  tcpURL = `https://${addr}`;
  c = new Client({ socket });
});

after(async () => {
  // Nothing this suite made may outlive it.
  for (const sb of await c.list({ 'suite': 'ts-sdk' })) await sb.terminate();
  c.close();
  daemon.kill('SIGTERM');
  await new Promise((resolve) => (daemon.exitCode !== null ? resolve() : daemon.once('exit', resolve)));
  rmSync(work, { recursive: true, force: true });
});

const labels = { suite: 'ts-sdk' };
// The local runtime refuses an idle timeout shorter than the lifetime (docs/api.md#create).
const decl = (id) => sandbox(id).image('host').labels(labels).session({ maxLifetimeSeconds: 600 });

async function collect(iter) {
  const frames = [];
  for await (const f of iter) frames.push(f);
  return frames;
}

describe('airlock serve from TypeScript', () => {
  it('health and the capability set, on the socket and on TCP+TLS with an API key', async () => {
    assert.deepEqual(await c.health(), { status: 'ok', platform: 'local' });
    const caps = await c.capabilities();
    assert.equal(caps.platform, 'local');
    assert.equal(caps.capabilities.files.supported, true);
    const tcp = new Client({ url: tcpURL, apiKey, tls: { ca } });
    assert.deepEqual(await tcp.capabilities(), caps);
    tcp.close();
  });

  it('create → exec streaming → files (5 MB) → abort kills → terminate', async () => {
    const sb = await c.create(decl('ts-main').env({ GREETING: 'hello' }));
    assert.match(sb.id, /^s-/);
    assert.equal(sb.session.state, 'running');
    assert.equal(sb.session.spec.env.GREETING, 'hello');
    assert.equal((await c.get(sb.id)).session.sandboxId, 'ts-main');
    assert.ok((await c.list(labels)).some((s) => s.id === sb.id));

    // Streaming, full duplex: the command's first line arrives before the test writes the stdin
    // that the command waits for, so output cannot have been buffered until the end.
    const stdin = new PassThrough();
    const frames = [];
    for await (const f of sb.exec({ shell: 'echo "$GREETING first"; read line; echo "got $line"; echo oops >&2; exit 3', stdin })) {
      frames.push(f);
      if (f.kind === 'output' && f.data.toString().includes('first')) stdin.end('the line\n');
    }
    const out = frames.filter((f) => f.kind === 'output');
    assert.deepEqual(out.map((f) => f.seq), out.map((_, i) => i + 1), 'one increasing sequence across both streams');
    assert.equal(out.filter((f) => f.stream === 'stdout').map((f) => f.data.toString()).join(''), 'hello first\ngot the line\n');
    assert.equal(out.filter((f) => f.stream === 'stderr').map((f) => f.data.toString()).join(''), 'oops\n');
    assert.equal(frames.at(-1).kind, 'exit');
    assert.equal(frames.at(-1).result.exitCode, 3);

    const r = await sb.run(['python3', '-c', 'import sys; print(6*7); sys.stdout.flush()']);
    assert.equal(r.stdout, '42\n');
    assert.equal(r.exitCode ?? 0, 0);
    assert.equal((await sb.run('cat', { stdin: 'piped' })).stdout, 'piped');

    // Files: a 5 MB upload streamed from a Readable, downloaded as a stream, byte for byte.
    const size = 5 * 1000 * 1000 + 7;
    const data = randomBytes(size);
    const chunks = [];
    for (let i = 0; i < size; i += 64 * 1024) chunks.push(data.subarray(i, i + 64 * 1024));
    await sb.writeFile('/workspace/big.bin', Readable.from(chunks), { mode: 0o600 });
    const st = await sb.stat('/workspace/big.bin');
    assert.equal(st.size, size);
    assert.equal(st.mode & 0o777, 0o600);
    const h = createHash('sha256');
    let got = 0;
    for await (const chunk of await sb.readFileStream('/workspace/big.bin')) {
      h.update(chunk);
      got += chunk.length;
    }
    assert.equal(got, size);
    assert.equal(h.digest('hex'), createHash('sha256').update(data).digest('hex'));
    const inside = await sb.run('sha256sum /workspace/big.bin');
    assert.equal(inside.stdout.split(' ')[0], createHash('sha256').update(data).digest('hex'));
    assert.deepEqual(await sb.readFile('/workspace/big.bin', { offset: 10, length: 5 }), data.subarray(10, 15));
    await sb.mkdir('/workspace/d');
    await sb.writeFile('/workspace/d/a.txt', 'text');
    assert.deepEqual((await sb.listFiles('/workspace/d')).map((f) => f.name), ['a.txt']);
    await sb.remove('/workspace/d', { recursive: true });
    await assert.rejects(sb.stat('/workspace/d'), sdk.NotFoundError);

    // Abort: the command and what it started are killed in the sandbox.
    const ac = new AbortController();
    let pid = '';
    await assert.rejects(
      (async () => {
        for await (const f of sb.exec({ shell: 'echo $$; exec sleep 600', signal: ac.signal })) {
          if (f.kind === 'output') {
            pid = f.data.toString().trim();
            ac.abort(new Error('enough'));
          }
        }
      })(),
      /enough/,
    );
    assert.match(pid, /^\d+$/);
    // Polled, not timed: the kill is asynchronous; the bound is only there to fail at all.
    let alive = true;
    for (let i = 0; i < 600 && alive; i++) {
      alive = (await sb.run(`kill -0 ${pid} 2>/dev/null`)).exitCode === 0;
      if (alive) await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(alive, false, `process ${pid} survived the abort`);

    // Leaving the loop early does the same.
    let pid2 = '';
    for await (const f of sb.exec({ shell: 'echo $$; exec sleep 600' })) {
      if (f.kind === 'output') {
        pid2 = f.data.toString().trim();
        break;
      }
    }
    assert.match(pid2, /^\d+$/);
    alive = true;
    for (let i = 0; i < 600 && alive; i++) {
      alive = (await sb.run(`kill -0 ${pid2} 2>/dev/null`)).exitCode === 0;
      if (alive) await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(alive, false, `process ${pid2} survived the loop's end`);

    await sb.terminate();
    await sb.terminate(); // idempotent
    await assert.rejects(c.get(sb.id), sdk.NotFoundError);
  });

  it('background processes: stdin, output from the start, wait', async () => {
    const sb = await c.create(decl('ts-proc'));
    try {
      const p = await sb.startProcess({ shell: 'tr a-z A-Z', stdin: true });
      assert.equal(p.info.running, true);
      await p.writeStdin('shout\n', { close: true });
      const res = await p.wait();
      assert.equal(res.exitCode ?? 0, 0);
      const frames = await collect(p.output({ from: 'start' }));
      assert.equal(frames.filter((f) => f.kind === 'output').map((f) => f.data.toString()).join(''), 'SHOUT\n');
      assert.ok((await sb.processes()).some((x) => x.id === p.id));
      const q = await sb.startProcess({ argv: ['sleep', '600'] });
      await q.signal('TERM');
      assert.equal((await q.wait()).signal, 'SIGTERM');
      await q.remove();
      await assert.rejects(sb.process(q.id), sdk.NotFoundError);
    } finally {
      await sb.terminate();
    }
  });

  it('pause/resume, stats, egress, preview, snapshots and fork', async () => {
    const sb = await c.create(decl('ts-feat').previewPorts(8080));
    const made = [sb];
    try {
      assert.equal((await sb.pause()).state, 'paused');
      assert.equal((await sb.resume()).state, 'running');
      assert.equal((await sb.run('echo back')).stdout, 'back\n');
      const stats = await sb.stats();
      assert.equal(typeof stats.memoryBytes, 'number');

      const policy = await sb.setEgress({ mode: 'allowDomains', domains: ['example.com'] });
      assert.deepEqual(policy.egress, { mode: 'allowDomains', domains: ['example.com'] });
      assert.equal(typeof (await sb.egressCounters()).connsDenied, 'number');
      await assert.rejects(sb.setEgress({ mode: 'allowDomains' }), (err) => {
        assert.ok(err instanceof sdk.InvalidError);
        assert.equal(err.problems[0].field, 'egress.domains');
        assert.equal(err.problems[0].rule, 'egress.domainsEmpty');
        return true;
      });

      const pv = await sb.preview(8080, { ttlSeconds: 60 });
      assert.equal(pv.port, 8080);
      assert.match(pv.url, /airlock_token=/);
      await assert.rejects(sb.preview(9090), sdk.RefusedError);

      await sb.writeFile('/workspace/marker', 'from the parent');
      const name = `ts-${randomBytes(4).toString('hex')}`;
      const snap = await sb.snapshot(name);
      assert.equal(snap.name, name);
      await assert.rejects(sb.snapshot(name), sdk.ConflictError);
      assert.ok((await c.snapshots()).some((s) => s.name === name));
      const [child] = await sb.fork(1);
      made.push(child);
      assert.ok(child.session.spec.image.snapshot, 'a fork starts from a snapshot it names');
      assert.equal((await child.readFile('/workspace/marker')).toString(), 'from the parent');
      const fromSnap = await c.create(decl('ts-from-snap').image({ snapshot: name }));
      made.push(fromSnap);
      assert.equal((await fromSnap.run('cat /workspace/marker')).stdout, 'from the parent');
      await c.deleteSnapshot(name);
      await assert.rejects(c.deleteSnapshot(name), sdk.NotFoundError);
    } finally {
      for (const s of made) await s.terminate();
    }
  });

  it('delegated tokens: an execute token runs code and may not create; a manage token may not exec', async () => {
    const sb = await c.create(decl('ts-tok'));
    try {
      const exec = await sb.mintToken('execute', { ttlSeconds: 120 });
      assert.equal(exec.class, 'execute');
      assert.equal(exec.session, sb.id);
      const delegated = new Client({ url: tcpURL, token: exec.token, tls: { ca } });
      assert.equal((await delegated.sandbox(sb.id).run('echo delegated')).stdout, 'delegated\n');
      assert.deepEqual((await delegated.list()).map((s) => s.id), [sb.id]);
      await assert.rejects(delegated.create(decl('ts-nope')), (err) => err instanceof sdk.ForbiddenError && err.reason === 'delegated');
      delegated.close();

      const manage = await sb.mintToken('manage');
      const mc = new Client({ socket, token: manage.token });
      await assert.rejects(mc.sandbox(sb.id).run('true'), (err) => err instanceof sdk.ForbiddenError && err.reason === 'wrongClass');
      mc.close();
    } finally {
      await sb.terminate();
    }
  });
});

describe('every error class the daemon answers crosses the wire', () => {
  it('InvalidError: every problem with its field path, the same as the TypeScript validation', async () => {
    const bad = decl('ts-bad').limits({ cpu: 'lots', memory: '1Ki' }).egress.allowDomains('10.0.0.1');
    await assert.rejects(c.create(bad), (err) => {
      assert.ok(err instanceof sdk.InvalidError);
      assert.equal(err.status, 400);
      assert.deepEqual(
        err.problems.map((p) => [p.field, p.rule]),
        bad.validate().problems.map((p) => [p.path, p.rule]),
      );
      assert.deepEqual(err.problems.map((p) => p.field), ['limits.cpu', 'limits.memory', 'egress.domains[0]']);
      return true;
    });
  });

  it('RefusedError names the capability', async () => {
    await assert.rejects(c.create(decl('ts-docker').runtime('docker')), (err) => {
      assert.ok(err instanceof sdk.RefusedError);
      assert.equal(err.status, 422);
      assert.equal(err.capability, 'dockerRuntime');
      assert.equal(err.refusals[0].field, 'runtime');
      return true;
    });
  });

  it('NotFoundError', async () => {
    await assert.rejects(c.get('s-0000000000000000'), (err) => err instanceof sdk.NotFoundError && err.status === 404 && err.requestId !== '');
  });

  it('ConflictError: a non-empty directory removed without recursive', async () => {
    const sb = await c.create(decl('ts-conflict'));
    try {
      await sb.mkdir('/workspace/d');
      await sb.writeFile('/workspace/d/x', 'x');
      await assert.rejects(sb.remove('/workspace/d'), sdk.ConflictError);
    } finally {
      await sb.terminate();
    }
  });

  it('TooLargeError: a declaration over the daemon\'s 1 MiB body limit', async () => {
    await assert.rejects(c.create(decl('ts-big').env({ BIG: 'x'.repeat(2 << 20) })), (err) => err instanceof sdk.TooLargeError && err.status === 413);
  });

  it('UnauthenticatedError and ForbiddenError on TCP', async () => {
    const anon = new Client({ url: tcpURL, tls: { ca } });
    await assert.rejects(anon.list(), (err) => err instanceof sdk.UnauthenticatedError && err.reason === 'missing');
    anon.close();
    const wrong = new Client({ url: tcpURL, apiKey: 'x'.repeat(32), tls: { ca } });
    await assert.rejects(wrong.list(), (err) => err instanceof sdk.UnauthenticatedError && err.reason === 'unknownKey');
    wrong.close();
  });

  it('UnreachableError: a TLS certificate the client does not trust fails before anything is sent', async () => {
    const untrusting = new Client({ url: tcpURL, apiKey });
    await assert.rejects(untrusting.create(decl('ts-tls')), sdk.UnreachableError);
    untrusting.close();
  });
});

describe('capabilities and plan through the CLI', () => {
  it('capabilities(platform) reads the published set', async () => {
    const aws = await sdk.capabilities('aws', { bin });
    assert.equal(aws.platform, 'aws');
    assert.equal(aws.capabilities.domainEgressRules.supported, false);
    await assert.rejects(sdk.capabilities('mars', { bin }), sdk.InvalidError);
  });

  it('plan(stack, platform) returns typed refusals a program branches on', async () => {
    const st = stack(sandbox('py').image('host').egress.allowDomains('pypi.org').session({ maxLifetimeSeconds: 600 }));
    const aws = await sdk.plan(st, 'aws', { bin });
    assert.equal(aws.refused, true);
    const r = aws.refusals.find((x) => x.capability === 'domainEgressRules');
    assert.ok(r, JSON.stringify(aws.refusals));
    assert.equal(r.field, 'sandboxes[0].egress.mode');
    const local = await sdk.plan(st, 'local', { bin });
    assert.equal(local.refused, false, JSON.stringify(local.refusals));
    assert.ok(local.sandboxes[0].undeclared.some((u) => u.field === 'limits.memory' && u.source === 'default'));
  });

  it('toYAML is what `airlock plan -f` reads, and plan gives the TypeScript verdict', () => {
    const st = stack(
      sandbox('tool').image('docker.io/library/python:3.12').limits({ cpu: '500m', memory: '1Gi' })
        .labels({ answer: 'yes', on: 'off' }).env({ FLAG: 'no', N: '0123' }).session({ maxLifetimeSeconds: 600 }).hostedBy('app'),
      sandbox('bad').image('host').limits({ cpu: '0.0001' }).egress.allowDomains('*.com').previewPorts(80, 80).hostedBy('ghost'),
    ).workload({ id: 'app', image: 'ghcr.io/o/app:1', hosts: ['tool'] });
    const file = path.join(work, 'stack.yaml');
    writeFileSync(file, st.toYAML());
    let out;
    try {
      out = execFileSync(bin, ['-o', 'json', 'plan', '-f', file, '--platform', 'local'], { encoding: 'utf8' });
      assert.fail('plan accepted a stack with problems');
    } catch (err) {
      assert.equal(err.status, 1, err.stderr);
      out = err.stdout;
    }
    const res = JSON.parse(out);
    const rules = res.refusals.filter((r) => !r.capability).map((r) => [r.field, r.rule]);
    assert.deepEqual(rules, st.validate().problems.map((p) => [p.path, p.rule]));
    assert.equal(rules.length, 4);
  });

  it('a sandbox\'s toYAML is what the daemon reads: strings YAML 1.1 would take for booleans or numbers stay strings', async () => {
    const b = decl('ts-yaml').labels({ answer: 'yes', on: 'off' }).env({ FLAG: 'no', N: '0123', E: '1e3' });
    const res = await c.transport.request('POST', '/v1/sandboxes', { body: b.toYAML(), contentType: 'application/yaml', mutating: true });
    const session = JSON.parse((await sdk.readAll(res, Infinity)).toString());
    const sb = c.sandbox(session.id);
    try {
      assert.deepEqual(session.spec.labels, { ...labels, answer: 'yes', on: 'off' });
      assert.deepEqual(session.spec.env, { FLAG: 'no', N: '0123', E: '1e3' });
      assert.deepEqual(JSON.parse(JSON.stringify(b)).env, session.spec.env);
    } finally {
      await sb.terminate();
    }
  });
});

describe('the npm package', () => {
  it('npm pack produces a package whose README examples run as written', async () => {
    const pkgDir = path.resolve(path.dirname(new URL(import.meta.url).pathname), '..');
    const dest = path.join(work, 'pack');
    const proj = path.join(work, 'project');
    execFileSync('mkdir', ['-p', dest, proj]);
    const packed = JSON.parse(execFileSync('npm', ['pack', '--json', '--pack-destination', dest], { cwd: pkgDir, encoding: 'utf8' }));
    const files = packed[0].files.map((f) => f.path);
    assert.ok(files.includes('dist/index.js') && files.includes('dist/index.d.ts') && files.includes('README.md'), files.join(' '));
    assert.ok(!files.some((f) => f.startsWith('src/') || f.startsWith('test/')), files.join(' '));
    writeFileSync(path.join(proj, 'package.json'), JSON.stringify({ name: 'readme-example', private: true, type: 'module' }));
    execFileSync('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', path.join(dest, packed[0].filename)], { cwd: proj, stdio: 'pipe' });

    const readme = readFileSync(path.join(pkgDir, 'README.md'), 'utf8');
    const blocks = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);
    assert.equal(blocks.length, 2, 'the README has its two examples');
    const env = { ...process.env, AIRLOCK_SOCKET: socket, AIRLOCK_BIN: bin, AIRLOCK_URL: '', AIRLOCK_API_KEY: '', AIRLOCK_TOKEN: '' };
    const outputs = blocks.map((code, i) => {
      writeFileSync(path.join(proj, `example${i}.mjs`), code);
      return execFileSync(process.execPath, [`example${i}.mjs`], { cwd: proj, env, encoding: 'utf8' });
    });
    assert.equal(outputs[0], '42\nexit 0\n6 /workspace/data.txt\n');
    assert.match(outputs[1], /^problems: 0\naws cannot allow by domain: sandboxes\[0\]\.egress\.mode\n/);
    assert.match(outputs[1], /apiVersion: airlock.dev\/v1alpha1\nkind: Stack\nsandboxes:\n  - id: py\n/);

    // The repository README's TypeScript example, too.
    const top = [...readFileSync(path.join(pkgDir, '../../README.md'), 'utf8').matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);
    assert.equal(top.length, 1, "the repository README's TypeScript example");
    writeFileSync(path.join(proj, 'top.mjs'), top[0]);
    assert.equal(execFileSync(process.execPath, ['top.mjs'], { cwd: proj, env, encoding: 'utf8' }), '42\n');
  });
});
