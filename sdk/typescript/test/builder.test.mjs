// The builder: the declaration it produces, as JSON and as YAML, and its verdicts.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import YAML from 'yaml';

import { sandbox, stack, InvalidError, parseQuantity } from '../dist/index.js';

describe('the builder', () => {
  it("the issue's example is the declaration it names", () => {
    const b = sandbox('py').image('docker.io/library/python:3.12').limits({ cpu: '500m', memory: '1Gi' }).egress.allowDomains('pypi.org').session({ maxLifetimeSeconds: 600 });
    assert.deepEqual(b.toJSON(), {
      id: 'py',
      image: 'docker.io/library/python:3.12',
      limits: { cpu: '500m', memory: '1Gi' },
      egress: { mode: 'allowDomains', domains: ['pypi.org'] },
      session: { maxLifetimeSeconds: 600 },
    });
    assert.deepEqual(b.validate(), { problems: [] });
    assert.equal(b.check(), b);
  });

  it('limits, session, labels and env merge; egress and image replace; toJSON is a copy', () => {
    const b = sandbox('x').image('host').limits({ cpu: '1' }).limits({ memory: '2Gi' }).session({ maxLifetimeSeconds: 60 }).session({ idleTimeoutSeconds: 30 })
      .labels({ a: '1' }).labels({ b: '2' }).env({ A: 'x' }).env({ B: 'y' }).egress.allow().egress.open().image({ dir: '/rootfs' })
      .previewPorts(80).previewPorts(8080).workdir('/work').runtime('gvisor');
    const j = b.toJSON();
    assert.deepEqual(j, {
      id: 'x', image: { dir: '/rootfs' }, limits: { cpu: '1', memory: '2Gi' }, session: { maxLifetimeSeconds: 60, idleTimeoutSeconds: 30 },
      labels: { a: '1', b: '2' }, env: { A: 'x', B: 'y' }, egress: { mode: 'open' }, previewPorts: [80, 8080], workdir: '/work', runtime: 'gvisor',
    });
    j.labels.a = 'changed';
    assert.equal(b.toJSON().labels.a, '1');
    assert.deepEqual(sandbox('d').image('host').egress.deny().toJSON().egress, { mode: 'deny' });
  });

  it('a stack with a workload that hosts a sandbox; its YAML reads back as its JSON', () => {
    const st = stack(sandbox('tool').image('host').hostedBy('app'), { id: 'raw', image: 'host' }).workload({ id: 'app', image: 'ghcr.io/o/app:1', hosts: ['tool'] });
    const j = st.toJSON();
    assert.deepEqual(j, {
      apiVersion: 'airlock.dev/v1alpha1',
      kind: 'Stack',
      sandboxes: [{ id: 'tool', image: 'host', hostedBy: 'app' }, { id: 'raw', image: 'host' }],
      workloads: [{ id: 'app', image: 'ghcr.io/o/app:1', hosts: ['tool'] }],
    });
    assert.deepEqual(YAML.parse(st.toYAML(), { version: '1.1' }), j);
    assert.deepEqual(st.validate(), { problems: [] });
  });

  it('check() throws InvalidError with every problem and its field path', () => {
    const st = stack(sandbox('a').image('host').hostedBy('nobody'), sandbox('a').limits({ memory: 'lots' }));
    assert.throws(() => st.check(), (err) => {
      assert.ok(err instanceof InvalidError);
      assert.deepEqual(err.problems.map((p) => [p.sandboxId, p.field, p.rule]), [
        ['a', 'sandboxes[0].hostedBy', 'hostedBy.unknown'],
        ['a', 'sandboxes[1].id', 'id.duplicate'],
        ['a', 'sandboxes[1].image', 'image.required'],
        ['a', 'sandboxes[1].limits.memory', 'quantity.syntax'],
      ]);
      return true;
    });
    // hostedBy is a stack rule: a sandbox alone does not check it.
    assert.deepEqual(sandbox('a').image('host').hostedBy('nobody').validate(), { problems: [] });
    assert.throws(() => sandbox('a').image('oci:').check(), (err) => err instanceof InvalidError && err.problems[0].field === 'image' && err.problems[0].rule === 'parse');
  });

  it('quantities in nanos, rounded away from zero as Kubernetes rounds', () => {
    const cases = [['1', 1_000_000_000n], ['250m', 250_000_000n], ['1Ki', 1024_000_000_000n], ['1.5Gi', 1610612736_000_000_000n], ['1e-30', 1n], ['-1e-30', -1n], ['.5', 500_000_000n], ['1e3', 1000_000_000_000n]];
    for (const [q, n] of cases) assert.equal(parseQuantity(q), n, q);
    for (const q of ['', 'Mi', '1e31', '1.5.5', 'e3', '1 Gi', '1'.repeat(65)]) assert.equal(parseQuantity(q), undefined, q);
  });
});
