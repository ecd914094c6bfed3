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
      assert.deepEqual(names, ['run_code', 'sandbox_create', 'sandbox_exec', 'sandbox_fork', 'sandbox_list', 'sandbox_preview_url', 'sandbox_read_file', 'sandbox_snapshot', 'sandbox_stats', 'sandbox_terminate', 'sandbox_write_file']);
      const rc = tools.find((t) => t.name === 'run_code');
      for (const l of ['python', 'node', 'bash', 'py', 'python3', 'js', 'javascript', 'sh', 'shell']) {
        assert.ok(rc.inputSchema.properties.language.enum.includes(l), `language enum lacks ${l}`);
      }
      assert.equal(rc.inputSchema.properties.timeout_seconds.maximum, 300);
      assert.deepEqual(rc.inputSchema.required, ['language', 'code']);
      assert.ok(rc.outputSchema, 'run_code has no output schema');
    });

    it('runs python', async () => {
      const r = await runCode(client, { language: 'python', code: 'import sys\nprint(sum(range(10)))\nprint(sys.version_info.major)' });
      assert.equal(r.isError, undefined);
      assert.equal(text(r), 'Exit code: 0\n--- stdout ---\n45\n3\n');
      assert.equal(r.structuredContent.exit_code, 0);
      assert.equal(r.structuredContent.stdout, '45\n3\n');
      assert.equal(r.structuredContent.language, 'python');
    });

    it('runs node', async () => {
      const r = await runCode(client, { language: 'javascript', code: "console.log(JSON.stringify({a: [1, 2].map((x) => x * 21)}))" });
      assert.equal(text(r), 'Exit code: 0\n--- stdout ---\n{"a":[21,42]}\n');
      assert.equal(r.structuredContent.language, 'node');
    });

    it('runs bash', async () => {
      const r = await runCode(client, { language: 'bash', code: 'for i in 1 2 3; do echo -n $i; done; echo; echo warn >&2' });
      assert.equal(text(r), 'Exit code: 0\n--- stdout ---\n123\n--- stderr ---\nwarn\n');
    });

    it('reports a non-zero exit with stderr', async () => {
      const r = await runCode(client, { language: 'py', code: "import sys\nsys.stderr.write('bad\\n')\nsys.exit(3)" });
      assert.equal(r.isError, undefined, 'a failing program is a result, not a tool error');
      assert.equal(text(r), 'Exit code: 3\n--- stderr ---\nbad\n');
      assert.equal(r.structuredContent.exit_code, 3);
    });

    it('kills code that runs past its timeout', async () => {
      const r = await runCode(client, { language: 'sh', code: 'echo started; sleep 60; echo never', timeout_seconds: 1 });
      assert.equal(r.structuredContent.timed_out, true);
      assert.equal(r.structuredContent.stdout, 'started\n');
      assert.match(text(r), /^Exit code: \d+\nTimed out after 1s/);
    });

    it('has no network by default: the host loopback is unreachable', async () => {
      const r = await runCode(client, { language: 'python', code: connectCode(listener.address().port) });
      assert.equal(text(r), 'Exit code: 0\n--- stdout ---\nunreachable\n');
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
        [{ language: 'python', code: 'print(1)', timeout_seconds: 301 }, /timeout_seconds 301 is over the cap of 300 seconds/],
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
      assert.equal(text(r), 'Exit code: 0\n--- stdout ---\nfrom a file\n');
      r = await client.callTool({ name: 'sandbox_read_file', arguments: { session_id: id, path: '/workspace/out.txt' } });
      assert.equal(r.structuredContent.content, 'from a file\n');
      r = await client.callTool({ name: 'sandbox_list', arguments: {} });
      assert.ok(r.structuredContent.sandboxes.some((s) => s.session_id === id));
      r = await client.callTool({ name: 'sandbox_terminate', arguments: { session_id: id } });
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
