import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';

import type { CapabilitySet } from './client.js';
import type { Problem } from './error-base.js';
import { InternalError, InvalidError } from './errors.js';
import type { StackBuilder } from './builder.js';
import type { Stack } from './gen/declaration.js';

/**
 * One refusal of a plan: the field, and the capability the platform lacks
 * (`refusal.capability === 'domainEgressRules'`) or the rule the declaration breaks.
 */
export type Refusal = Problem;

/** What an undeclared property becomes on the platform: airlock's default, or the platform's own value. */
export interface UndeclaredValue {
  field: string;
  value: string;
  source: 'default' | 'platform';
}

/** `airlock plan -o json`: every refusal of a stack on a platform, and per sandbox its undeclared values. */
export interface PlanResult {
  platform: string;
  refusals: Refusal[];
  sandboxes: { id: string; undeclared: UndeclaredValue[] }[];
}

export interface CLIOptions {
  /** The airlock binary (default $AIRLOCK_BIN, else `airlock` on PATH). */
  bin?: string;
  signal?: AbortSignal;
}

function run(args: string[], opts: CLIOptions): Promise<{ code: number; stdout: string; stderr: string }> {
  const bin = opts.bin || process.env.AIRLOCK_BIN || 'airlock';
  return new Promise((resolve, reject) => {
    execFile(bin, args, { signal: opts.signal, maxBuffer: 64 << 20, encoding: 'utf8' }, (err, stdout, stderr) => {
      if (err && typeof err.code !== 'number') {
        reject(opts.signal?.aborted ? opts.signal.reason : new InternalError(`${bin} ${args.join(' ')}: ${err.message}`, { cause: err }));
        return;
      }
      resolve({ code: typeof err?.code === 'number' ? err.code : 0, stdout, stderr });
    });
  });
}

/** The CLI's usage or input error (exit 2): the request was invalid. */
function cliError(args: string[], r: { code: number; stderr: string }): Error {
  const msg = r.stderr.trim().replace(/^airlock: /, '');
  if (r.code === 2) return new InvalidError(msg);
  return new InternalError(`airlock ${args.join(' ')} exited ${r.code}: ${msg}`);
}

/**
 * What a platform enforces, as `airlock capabilities --platform P -o json` reads it (an
 * opened backend's set where it can be opened here, else the platform's published one). For
 * the set of a running daemon use Client.capabilities().
 */
export async function capabilities(platform: string, opts: CLIOptions = {}): Promise<CapabilitySet> {
  const args = ['-o', 'json', 'capabilities', '--platform', platform];
  const r = await run(args, opts);
  if (r.code !== 0) throw cliError(args, r);
  return JSON.parse(r.stdout) as CapabilitySet;
}

/**
 * Checks a stack against a platform with `airlock plan -o json`: every refusal (a capability
 * the platform lacks, or a rule the declaration breaks), and what each undeclared property
 * becomes there. A document the CLI cannot read throws InvalidError.
 */
export async function plan(st: StackBuilder | Stack, platform: string, opts: CLIOptions = {}): Promise<PlanResult & { refused: boolean }> {
  const doc = 'toJSON' in st && typeof st.toJSON === 'function' ? st.toJSON() : st;
  const dir = await mkdtemp(path.join(os.tmpdir(), 'airlock-plan-'));
  try {
    const file = path.join(dir, 'stack.json');
    await writeFile(file, JSON.stringify(doc));
    const args = ['-o', 'json', 'plan', '-f', file, '--platform', platform];
    const r = await run(args, opts);
    if (r.code !== 0 && r.code !== 1) throw cliError(args, r);
    const res = JSON.parse(r.stdout) as PlanResult;
    return { ...res, refused: r.code === 1 };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
