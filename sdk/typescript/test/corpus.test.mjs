// The shared declaration corpus (spec/testdata/corpus/cases.json): the TypeScript validation
// gives exactly the verdicts Go's spec gives (spec's TestCorpus runs the same file).
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import { validateSandbox, validateStack } from '../dist/index.js';

const corpus = JSON.parse(readFileSync(new URL('../../../spec/testdata/corpus/cases.json', import.meta.url), 'utf8'));

describe('the shared declaration corpus', () => {
  assert.ok(corpus.cases.length > 50, 'the corpus has its cases');
  for (const c of corpus.cases) {
    it(`${c.kind}: ${c.name}`, () => {
      const verdict = c.kind === 'stack' ? validateStack(c.document) : validateSandbox(c.document);
      if (c.expect.parse !== undefined) {
        assert.ok(verdict.parse, `want a parse problem at ${c.expect.parse}, got ${JSON.stringify(verdict.problems)}`);
        assert.equal(verdict.parse.path, c.expect.parse, verdict.parse.message);
        return;
      }
      assert.equal(verdict.parse, undefined, verdict.parse && `${verdict.parse.path}: ${verdict.parse.message}`);
      assert.deepEqual(
        verdict.problems.map((p) => `${p.path} ${p.rule}`),
        c.expect.problems.map((p) => `${p.path} ${p.rule}`),
      );
    });
  }
});
