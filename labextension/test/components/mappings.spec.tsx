// @vitest-environment jsdom
/**
 * The administrator's mapped folders on a sandbox's card: each one whole (paths
 * breakable after their slashes), with its mode; and what the card says of a sandbox
 * whose mappings changed since it was made.
 */
import { render } from '@testing-library/react';
import * as React from 'react';
import { describe, expect, it } from 'vitest';

import { IVolumeMapping } from '../../src/api';
import { SandboxFacts } from '../../src/components/SandboxFacts';
import { SandboxMappings } from '../../src/components/SandboxMappings';
import { sandbox } from '../server';
import { trans } from './helpers';

const DATA: IVolumeMapping = {
  source: '/srv/datasets/corpora-2026/english',
  target: '/data',
  mode: 'ro',
  kind: 'host folder'
};
const CACHE: IVolumeMapping = {
  source: '/srv/cache/team-nlp',
  target: '/cache',
  mode: 'rw',
  kind: 'host folder'
};

/** The text of one fact of a sandbox's card (its dd), by label; undefined if absent. */
function fact(s: unknown, label: string): HTMLElement | undefined {
  const { container } = render(
    <SandboxFacts sandbox={s as any} trans={trans} now={10_000_000} />
  );
  const dt = Array.from(container.querySelectorAll('dt')).find(
    d => d.textContent === label
  );
  return (dt?.nextElementSibling as HTMLElement | null) ?? undefined;
}

describe('SandboxMappings', () => {
  it('lists each mapping whole: where, from where, and its mode', () => {
    const { container } = render(
      <SandboxMappings volumes={[DATA, CACHE]} trans={trans} />
    );
    const items = Array.from(container.querySelectorAll('li'));
    expect(items.map(i => i.textContent)).toEqual([
      '/data ← /srv/datasets/corpora-2026/english · read-only',
      '/cache ← /srv/cache/team-nlp · writable'
    ]);
    expect(items.map(i => i.dataset.mode)).toEqual(['ro', 'rw']);
    // Long paths wrap after their slashes (never cut).
    expect(items[0].querySelectorAll('wbr').length).toBe(3);
    expect(items[1].title).toBe(
      '/cache shows /srv/cache/team-nlp; every sandbox it is mapped into writes it'
    );
    expect(items[0].title).toBe(
      '/data shows /srv/datasets/corpora-2026/english, read-only'
    );
  });
});

describe('SandboxFacts with mapped folders', () => {
  it('shows the mappings of a sandbox that has them, and no line for one that has none', () => {
    const mapped = fact(sandbox({ volumes: [DATA, CACHE] }), 'Mapped');
    expect(mapped?.querySelectorAll('li').length).toBe(2);
    expect(mapped?.textContent).toContain('/cache ← /srv/cache/team-nlp');
    expect(fact(sandbox({ volumes: [] }), 'Mapped')).toBeUndefined();
    expect(fact(sandbox(), 'Mapped')).toBeUndefined();
  });

  it('says what the next start does when only the mappings changed', () => {
    const outdated = fact(
      sandbox({
        volumes: [DATA],
        outdated:
          'made with other folder mappings (/data (ro); now /data (ro), /cache (rw))',
        remake:
          'made anew with them at its next start: its files and installed packages are kept'
      }),
      'Outdated'
    );
    expect(outdated?.textContent).toBe(
      'made with other folder mappings (/data (ro); now /data (ro), /cache (rw)); ' +
        'made anew with them at its next start: its files and installed packages are kept'
    );
    expect(outdated?.textContent).not.toContain('destroy it');
  });
});
