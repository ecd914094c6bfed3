// Drives `airlock mcp` with the official TypeScript MCP client over stdio and streamable HTTP.
//
// Environment:
//   AIRLOCK_BIN                 the airlock binary (required; airlock-agent next to it or $AIRLOCK_AGENT)
//   AIRLOCK_E2E_STATE_DIR       --state-dir for the servers (default: a fresh temp dir)
//   AIRLOCK_E2E_CGROUP_PARENT   --cgroup-parent for the servers (default: derived from the state dir)
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const bin = process.env.AIRLOCK_BIN;
if (!bin) {
  throw new Error('set AIRLOCK_BIN to the airlock binary (go test ./e2e/mcp does)');
}
const stateDir = process.env.AIRLOCK_E2E_STATE_DIR || mkdtempSync(path.join(os.tmpdir(), 'al'));
const serverArgs = ['mcp', '--state-dir', stateDir, '--log-level', 'info'];
if (process.env.AIRLOCK_E2E_CGROUP_PARENT) {
  serverArgs.push('--cgroup-parent', process.env.AIRLOCK_E2E_CGROUP_PARENT);
}

// What this host's local runtime enforces decides what network: true must do.
const caps = JSON.parse(execFileSync(bin, ['-o', 'json', 'capabilities'], { encoding: 'utf8' }));
const publicEgress = caps.capabilities.publicOnlyEgress;

function text(result) {
  return result.content.filter((c) => c.type === 'text').map((c) => c.text).join('');
}

async function runCode(client, args) {
  return client.callTool({ name: 'run_code', arguments: args });
}

// A listener on the host's loopback: code in a sandbox must never reach it.
function loopbackListener() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer((sock) => {
      sock.end('hello from the host\n');
    });
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => resolve(srv));
  });
}

const connectCode = (port) => `import socket
try:
    s = socket.create_connection(('127.0.0.1', ${port}), timeout=3)
    print('connected', s.recv(100))
except OSError as e:
    print('unreachable')
`;

// startHTTP starts `airlock mcp --http 127.0.0.1:0` and resolves with the child and the URL
// it prints on stderr.
function startHTTP() {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, [...serverArgs, '--http', '127.0.0.1:0'], { stdio: ['ignore', 'ignore', 'pipe'] });
    let buf = '';
    const onData = (d) => {
      buf += d.toString();
      process.stderr.write(d);
      const m = buf.match(/serving streamable HTTP on (http:\/\/\S+)/);
      if (m) {
        resolve({ child, url: new URL(m[1]) });
      }
    };
    child.stderr.on('data', onData);
    child.on('error', reject);
    child.on('exit', (code) => reject(new Error(`airlock mcp --http exited with ${code} before serving:\n${buf}`)));
  });
}

function exited(child) {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) {
      resolve({ code: child.exitCode, signal: child.signalCode });
      return;
    }
    child.once('exit', (code, signal) => resolve({ code, signal }));
  });
}

const transports = {
  stdio: async () => {
    const transport = new StdioClientTransport({ command: bin, args: serverArgs, stderr: 'inherit' });
    const client = new Client({ name: 'airlock-e2e', version: '1.0.0' });
    await client.connect(transport);
    return { client, stop: async () => client.close() };
  },
  http: async () => {
    const { child, url } = await startHTTP();
    child.removeAllListeners('exit');
    const client = new Client({ name: 'airlock-e2e', version: '1.0.0' });
    await client.connect(new StreamableHTTPClientTransport(url));
    return {
      client,
      stop: async () => {
        await client.close();
        child.kill('SIGTERM');
        const { code, signal } = await exited(child);
        assert.equal(signal, null, `airlock mcp --http died of ${signal}`);
        assert.equal(code, 0, 'airlock mcp --http did not exit cleanly on SIGTERM');
      },
    };
  },
};

for (const [name, start] of Object.entries(transports)) {
  describe(`airlock mcp over ${name}`, () => {
    let client;
    let stop;
    let listener;

    before(async () => {
      ({ client, stop } = await start());
      listener = await loopbackListener();
    });

    after(async () => {
      listener?.close();
      await stop?.();
    });

    it('lists run_code with its languages and timeout cap, and the session tools', async () => {
      const { tools } = await client.listTools();
      const names = tools.map((t) => t.name).sort();
      for (const n of ['run_code', 'sandbox_create', 'sandbox_exec', 'sandbox_list', 'sandbox_process_kill', 'sandbox_process_output', 'sandbox_read_file', 'sandbox_terminate', 'sandbox_write_file']) {
        assert.ok(names.includes(n), `no tool ${n} in ${names}`);
      }
      const rc = tools.find((t) => t.name === 'run_code');
      // The enum is exactly what is accepted: every name in it runs, and no other spelling.
      assert.deepEqual(rc.inputSchema.properties.language.enum, ['python', 'node', 'bash', 'javascript', 'js', 'py', 'python3', 'sh', 'shell']);
      // Over 300 is capped, not refused: no maximum for a client to enforce.
      assert.equal(rc.inputSchema.properties.timeout_seconds.maximum, undefined);
      assert.equal(rc.inputSchema.properties.timeout_seconds.default, 30);
      assert.match(rc.inputSchema.properties.timeout_seconds.description, /capped to 300/);
      assert.deepEqual(rc.inputSchema.required, ['language', 'code']);
      assert.ok(rc.outputSchema, 'run_code has no output schema');
      const create = tools.find((t) => t.name === 'sandbox_create');
      assert.equal(create.inputSchema.properties.network.default, false);
      const exec = tools.find((t) => t.name === 'sandbox_exec');
      assert.match(exec.description, /killed when it ends/);
      assert.equal(exec.inputSchema.properties.background.default, false);
    });

    it('runs python', async () => {
      const r = await runCode(client, { language: 'python', code: 'import sys\nprint(sum(range(10)))\nprint(sys.version_info.major)' });
      assert.equal(r.isError, undefined);
      assert.equal(text(r), 'Exit code: 0\n\n--- stdout ---\n45\n3\n');
      assert.equal(r.structuredContent.exit_code, 0);
      assert.equal(r.structuredContent.stdout, '45\n3\n');
      assert.equal(r.structuredContent.language, 'python');
    });

    it('runs node', async () => {
      const r = await runCode(client, { language: 'javascript', code: "console.log(JSON.stringify({a: [1, 2].map((x) => x * 21)}))" });
      assert.equal(text(r), 'Exit code: 0\n\n--- stdout ---\n{"a":[21,42]}\n');
      assert.equal(r.structuredContent.language, 'node');
    });

    it('runs bash', async () => {
      const r = await runCode(client, { language: 'bash', code: 'for i in 1 2 3; do echo -n $i; done; echo; echo warn >&2' });
      assert.equal(text(r), 'Exit code: 0\n\n--- stdout ---\n123\n--- stderr ---\nwarn\n');
    });

    it('reports a non-zero exit with stderr', async () => {
      const r = await runCode(client, { language: 'py', code: "import sys\nsys.stderr.write('bad\\n')\nsys.exit(3)" });
      assert.equal(r.isError, undefined, 'a failing program is a result, not a tool error');
      assert.equal(text(r), 'Exit code: 3\n\n--- stderr ---\nbad\n');
      assert.equal(r.structuredContent.exit_code, 3);
    });

    it('kills code that runs past its timeout', async () => {
      const r = await runCode(client, { language: 'sh', code: 'echo started; sleep 60; echo never', timeout_seconds: 1 });
      assert.equal(r.structuredContent.timed_out, true);
      assert.equal(r.structuredContent.stdout, 'started\n');
      // One exit status for a timeout on every surface (the CLI's too): 124; the status line
      // comes after the sections.
      assert.equal(r.structuredContent.exit_code, 124);
      assert.equal(text(r), 'Exit code: 124\n\n--- stdout ---\nstarted\n\nTimed out after 1s: the program and everything it started were killed\n');
    });

    it('caps a timeout over 300 and says so', async () => {
      const r = await runCode(client, { language: 'python', code: 'print(1)', timeout_seconds: 900 });
      assert.equal(r.isError, undefined, text(r));
      assert.equal(r.structuredContent.timeout_seconds, 300);
      assert.equal(r.structuredContent.timeout_capped_from, 900);
      assert.equal(text(r), 'Exit code: 0\n\n--- stdout ---\n1\n\nTimeout capped: 900s asked for, 300s is the most a run gets\n');
      const d = await runCode(client, { language: 'python', code: 'print(2)', timeout_seconds: 0 });
      assert.equal(d.structuredContent.timeout_seconds, 30);
    });

    it('sizes output for a model: the head and the tail, the cut marked', async () => {
      const r = await runCode(client, { language: 'python', code: "print('x' * 200000)\nraise SystemExit('the error at the end')" });
      const sc = r.structuredContent;
      assert.equal(sc.exit_code, 1);
      assert.ok(sc.cut_bytes > 0, `cut_bytes ${sc.cut_bytes}`);
      assert.ok(sc.stdout.length < 70000, `stdout of ${sc.stdout.length} characters`);
      assert.match(sc.stdout, /\[\.\.\. \d+ bytes cut here \.\.\.\]/);
      assert.match(text(r), /the error at the end\n/);
      assert.match(text(r), /Output shortened: \d+ bytes were left out of the middle/);
    });

    it('cuts output at the cap at a character boundary', async () => {
      // One byte, then 2 MiB of two-byte characters: the agent's 1 MiB cap cuts one in two; no U+FFFD.
      const r = await runCode(client, { language: 'python', code: "import sys\nsys.stdout.write('a' + 'é' * (1 << 20))" });
      const sc = r.structuredContent;
      assert.equal(sc.truncated, true);
      assert.ok(!sc.stdout.includes('\uFFFD'), 'the cut left a replacement character');
      assert.ok(!text(r).includes('\uFFFD'), 'the text has a replacement character');
      assert.equal(sc.not_utf8, undefined);
    });

    it('flags output that is not UTF-8', async () => {
      const r = await runCode(client, { language: 'bash', code: "printf 'ok \\xff\\n'" });
      assert.equal(r.structuredContent.not_utf8, true);
      assert.match(text(r), /not valid UTF-8/);
    });

    it('has no network by default: the host loopback is unreachable', async () => {
      const r = await runCode(client, { language: 'python', code: connectCode(listener.address().port) });
      assert.equal(text(r), 'Exit code: 0\n\n--- stdout ---\nunreachable\n');
    });

    it('network: true is refused where public-only egress is unenforceable, and never reaches loopback', async () => {
      const r = await runCode(client, { language: 'python', code: connectCode(listener.address().port), network: true });
      if (!publicEgress.supported) {
        assert.equal(r.isError, true, `network: true ran although publicOnlyEgress is unsupported here: ${text(r)}`);
        assert.match(text(r), /publicOnlyEgress/);
        assert.match(text(r), /egress "allow"/);
        return;
      }
      assert.equal(r.isError, undefined, text(r));
      assert.equal(r.structuredContent.stdout, 'unreachable\n', 'network: true reached the host loopback');
    });

    it('turns input mistakes into tool errors', async () => {
      const cases = [
        [{ language: 'ruby', code: 'puts 1' }, /"ruby" is not supported: allowed are python, node, bash/],
        [{ language: 'python', code: '' }, /code is empty/],
        [{ language: 'PYTHON', code: 'print(1)' }, /"PYTHON" is not supported/],
        [{ language: 'python', code: 'print(1)', timeout: 5 }, /unknown argument "timeout"/],
      ];
      for (const [args, want] of cases) {
        const r = await runCode(client, args);
        assert.equal(r.isError, true, `${JSON.stringify(args)} succeeded`);
        assert.match(text(r), want);
      }
    });

    it('keeps a sandbox across calls with the session tools', async () => {
      const c = await client.callTool({ name: 'sandbox_create', arguments: { memory: '256Mi' } });
      assert.equal(c.isError, undefined, text(c));
      const id = c.structuredContent.session_id;
      assert.ok(id);
      let r = await client.callTool({ name: 'sandbox_write_file', arguments: { session_id: id, path: 'src/app.py', content: 'print("from a file")\n' } });
      assert.equal(r.isError, undefined, text(r));
      r = await client.callTool({ name: 'sandbox_exec', arguments: { session_id: id, command: 'python3 src/app.py > out.txt; node -e "console.log(require(\'fs\').readFileSync(\'out.txt\', \'utf8\').trim())"' } });
      assert.equal(text(r), 'Exit code: 0\n\n--- stdout ---\nfrom a file\n');
      // A process started with background: true outlives its call; its output is read later.
      r = await client.callTool({ name: 'sandbox_exec', arguments: { session_id: id, background: true, command: 'echo serving; exec sleep 600' } });
      assert.equal(r.isError, undefined, text(r));
      const pid = r.structuredContent.process_id;
      assert.ok(pid, text(r));
      let seen = '';
      for (let i = 0; i < 600 && !seen.includes('serving'); i++) {
        r = await client.callTool({ name: 'sandbox_process_output', arguments: { session_id: id, process_id: pid } });
        assert.equal(r.structuredContent.running, true, text(r));
        seen += r.structuredContent.stdout;
        await new Promise((res) => setTimeout(res, 100));
      }
      assert.equal(seen, 'serving\n');
      for (let i = 0; i < 2; i++) {
        r = await client.callTool({ name: 'sandbox_process_kill', arguments: { session_id: id, process_id: pid } });
        assert.equal(r.isError, undefined, text(r));
      }
      r = await client.callTool({ name: 'sandbox_read_file', arguments: { session_id: id, path: '/workspace/out.txt' } });
      assert.equal(r.structuredContent.content, 'from a file\n');
      r = await client.callTool({ name: 'sandbox_list', arguments: {} });
      assert.ok(r.structuredContent.sandboxes.some((s) => s.session_id === id));
      r = await client.callTool({ name: 'sandbox_terminate', arguments: { session_id: id } });
      assert.equal(r.structuredContent.terminated, true);
      // Advertised idempotent: a second terminate succeeds.
      r = await client.callTool({ name: 'sandbox_terminate', arguments: { session_id: id } });
      assert.equal(r.isError, undefined, text(r));
      assert.equal(r.structuredContent.terminated, true);
      r = await client.callTool({ name: 'sandbox_exec', arguments: { session_id: id, command: 'true' } });
      assert.equal(r.isError, true);
    });

    it('leaves a live session for the server to terminate at shutdown', async () => {
      // The Go test that runs this file checks no sandbox survives the servers.
      const c = await client.callTool({ name: 'sandbox_create', arguments: {} });
      assert.equal(c.isError, undefined, text(c));
    });
  });
}

describe('airlock mcp --http refuses another origin', () => {
  it('answers 403 to a browser page elsewhere (DNS rebinding) and serves its own', async () => {
    const { child, url } = await startHTTP();
    child.removeAllListeners('exit');
    try {
      const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'e2e', version: '1' } } });
      const headers = { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' };
      let r = await fetch(url, { method: 'POST', body, headers: { ...headers, Origin: 'http://attacker.example' } });
      assert.equal(r.status, 403);
      assert.match(await r.text(), /attacker\.example/);
      r = await fetch(url, { method: 'POST', body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/list' }), headers });
      assert.equal(r.status, 400, 'a request without a session id that is not an initialize got a session');
      r = await fetch(url, { method: 'POST', body, headers: { ...headers, Origin: `http://${url.host}` } });
      assert.equal(r.status, 200);
      await r.text();
    } finally {
      child.kill('SIGTERM');
      await exited(child);
    }
  });
});

describe('airlock mcp over stdio keeps serving after an oversized message', () => {
  it('refuses the message with an error for its id and answers the next', async () => {
    const child = spawn(bin, serverArgs, { stdio: ['pipe', 'pipe', 'inherit'] });
    let buf = '';
    const lines = [];
    const waiters = [];
    child.stdout.on('data', (d) => {
      buf += d.toString();
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        lines.push(JSON.parse(buf.slice(0, i)));
        buf = buf.slice(i + 1);
        waiters.splice(0).forEach((w) => w());
      }
    });
    const next = async () => {
      while (lines.length === 0) {
        await new Promise((res) => waiters.push(res));
      }
      return lines.shift();
    };
    const send = (msg) => new Promise((res) => child.stdin.write(msg + '\n', res));
    await send(JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'e2e', version: '1' } } }));
    assert.equal((await next()).id, 1);
    await send(JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }));
    const code = 'x'.repeat(17 << 20);
    await send(JSON.stringify({ jsonrpc: '2.0', id: 5, method: 'tools/call', params: { name: 'run_code', arguments: { language: 'python', code } } }));
    const refused = await next();
    assert.equal(refused.id, 5);
    assert.match(refused.error.message, /over this server's limit of 16777216 bytes/);
    await send(JSON.stringify({ jsonrpc: '2.0', id: 6, method: 'tools/call', params: { name: 'run_code', arguments: { language: 'python', code: 'print(6*7)' } } }));
    const ok = await next();
    assert.equal(ok.id, 6);
    assert.equal(ok.result.structuredContent.stdout, '42\n');
    child.stdin.end();
    const { code: status } = await exited(child);
    assert.equal(status, 0);
  });
});
