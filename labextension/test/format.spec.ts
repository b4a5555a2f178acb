import type { TranslationBundle } from '@jupyterlab/translation';
import { nullTranslator } from '@jupyterlab/translation';
import { describe, expect, it } from 'vitest';

import type { ISandbox } from '../src/api';
import {
  age,
  agentsLabel,
  davUrl,
  diskFraction,
  folderLabel,
  formatAgainst,
  formatAgo,
  formatBytes,
  formatCpu,
  formatDisk,
  formatDuration,
  formatMemory,
  kernelsLabel,
  lifetime,
  memoryFraction,
  NBSP,
  nextLabel,
  fractionOf,
  originLabel,
  scopeLabel,
  stateLabel
} from '../src/format';
import { sandbox } from './server';

/** Expected text: "_" stands for the no-break space that keeps a number with its unit. */
const nb = (text: string) => text.replace(/_/g, NBSP);

describe('format', () => {
  it('formats sizes and durations', () => {
    expect(formatBytes(0)).toBe(nb('0_B'));
    expect(formatBytes(1536)).toBe(nb('1.50_KiB'));
    expect(formatBytes(191 * 1024 * 1024)).toBe(nb('191_MiB'));
    expect(formatBytes(1 << 30)).toBe(nb('1.00_GiB'));
    expect(formatBytes(undefined)).toBe('–');
    expect(formatDuration(42)).toBe('42s');
    expect(formatDuration(3 * 3600 + 5 * 60)).toBe(nb('3h_05m'));
    expect(formatDuration(50 * 3600)).toBe(nb('2d_2h'));
    expect(formatAgo(1000, 1000 * 1000 + 5000)).toBe('just now');
    expect(formatAgo(1000, (1000 + 600) * 1000)).toBe('10m ago');
  });

  it('never puts a breakable space between a number and its unit', () => {
    for (const bytes of [0, 1, 1023, 1024, 5e6, 191 * 2 ** 20, 3e9, 2 ** 42]) {
      // The only spaces in a size are no-break spaces; \s would match them too.
      expect(formatBytes(bytes)).not.toMatch(/[ \t\n]/);
      expect(formatBytes(bytes)).toMatch(/^[\d.]+\u00a0[KMGT]?i?B$/);
    }
    for (const seconds of [5, 90, 3700, 90000, 10 ** 7]) {
      expect(formatDuration(seconds)).not.toMatch(/[ \t\n]/);
    }
    // Between figures the words may wrap; inside one figure they may not.
    expect(formatMemory(sandbox())).toBe(nb('256_MiB / 1.00_GiB'));
  });

  it('describes use against limits', () => {
    const s = sandbox();
    expect(formatCpu(s)).toBe('25% of 1 CPU');
    expect(memoryFraction(s)).toBe(0.25);
    expect(formatCpu(sandbox({ usage: {}, state: 'stopped' }))).toBe(
      '– of 1 CPU'
    );
    expect(formatCpu(sandbox({ usage: {}, state: 'running' }))).toBe(
      '… of 1 CPU'
    );
    expect(formatCpu(sandbox({ limits: { cpus: 2 } }))).toBe('25% of 2 CPUs');
    expect(formatCpu(sandbox({ limits: { cpus: 0.5 } }))).toBe(
      '25% of 0.5 CPUs'
    );
    expect(formatCpu(sandbox({ limits: {} }))).toBe('25%');
    expect(age(sandbox({ created: 100 }), 3700 * 1000)).toBe(nb('1h_00m'));
    // Uptime counts from the last start while running; otherwise the age is shown.
    expect(
      lifetime(sandbox({ created: 100, started: 3400 }), 3700 * 1000)
    ).toBe('up 5m');
    expect(
      lifetime(
        sandbox({ created: 100, started: 3400, state: 'stopped' }),
        3700 * 1000
      )
    ).toBe(nb('age 1h_00m'));
    expect(lifetime(sandbox({ created: 100, started: 0 }), 3700 * 1000)).toBe(
      nb('age 1h_00m')
    );
  });

  it('gives disk use against the disk size only when the server gives them', () => {
    expect(formatDisk(sandbox())).toBe('');
    expect(diskFraction(sandbox())).toBeNull();
    const both = sandbox({
      limits: { disk: 10 * 2 ** 30 },
      usage: { disk: 2.5 * 2 ** 30 }
    });
    expect(formatDisk(both)).toBe(nb('2.50_GiB / 10.0_GiB'));
    expect(diskFraction(both)).toBe(0.25);
    expect(formatDisk(sandbox({ usage: { disk: 0 } }))).toBe(nb('0_B'));
    expect(formatDisk(sandbox({ limits: { disk: 2 ** 30 }, usage: {} }))).toBe(
      nb('– / 1.00_GiB')
    );
    expect(
      diskFraction(sandbox({ limits: { disk: 2 ** 30 }, usage: {} }))
    ).toBe(null);
    // Over the size (a filesystem that counts differently) fills the bar, no more.
    expect(
      diskFraction(sandbox({ limits: { disk: 100 }, usage: { disk: 250 } }))
    ).toBe(1);
    // Figures of the wrong kind are not figures.
    expect(
      formatDisk(sandbox({ limits: { disk: 'big' }, usage: { disk: -1 } }))
    ).toBe('');
    expect(fractionOf(5, 0)).toBeNull();
    expect(formatAgainst(undefined, 2 ** 20)).toBe(nb('– / 1.00_MiB'));
  });

  it('names the folder cells run in and the state', () => {
    expect(folderLabel(sandbox())).toBe('/workspace');
    expect(folderLabel(sandbox({ work_folder: '' }))).toBe('/workspace');
    expect(folderLabel(sandbox({ work_folder: '/home/alice/a' }))).toBe(
      '/home/alice/a'
    );
    expect(stateLabel('running')).toBe('running');
    expect(stateLabel('paused')).toBe('paused');
  });

  it('names scopes and origins', () => {
    expect(scopeLabel(sandbox())).toBe('user');
    expect(
      scopeLabel(
        sandbox({ scope: 'thread', thread: '/home/a/work/analysis.ipynb' })
      )
    ).toBe('thread · analysis.ipynb');
    expect(
      scopeLabel(
        sandbox({ scope: 'thread', thread: 'snapshot:base-env:1a2b3c4d' })
      )
    ).toBe('thread · from snapshot base-env');
    expect(originLabel(sandbox({ snapshot: 'base-env' }))).toBe(
      'snapshot base-env'
    );
    expect(originLabel(sandbox())).toBe('python:3.12-slim');
  });

  it('says what the lifecycle does next and which kernels are busy', () => {
    const now = 1_000_000 * 1000;
    const base = { kernels: 2, busy_kernel_ids: ['k1'] } as unknown as ISandbox;
    expect(kernelsLabel(base)).toBe('2 kernels (1 busy)');
    expect(kernelsLabel({ ...base, busy_kernel_ids: [] })).toBe('2 kernels');
    expect(kernelsLabel({ ...base, kernels: 1, busy_kernel_ids: ['k1'] })).toBe(
      '1 kernel (1 busy)'
    );
    expect(kernelsLabel({ ...base, kernels: 0, busy_kernel_ids: [] })).toBe(
      '0 kernels'
    );
    expect(agentsLabel(base)).toBe('');
    expect(
      agentsLabel({
        ...base,
        agent_sessions: [
          { id: 'a1', name: 'analysis', busy: true },
          {
            id: 'a2',
            name: 'a-very-long-session-name-from-an-agent',
            busy: false
          }
        ]
      })
    ).toBe('analysis (busy), a-very-long-session-nam…');
    expect(
      nextLabel(
        {
          ...base,
          next: { action: 'stop', at: 1_000_000 + 720, reason: 'idle' }
        },
        now
      )
    ).toBe('stops in 12m');
    expect(
      nextLabel(
        {
          ...base,
          next: { action: 'destroy', at: 999_000, reason: 'stopped' }
        },
        now
      )
    ).toBe('removed (workspace kept) at the next cleanup');
    expect(
      nextLabel({ ...base, next: { action: '', at: 0, reason: '' } }, now)
    ).toBe('');
  });

  it('passes every word through the translation bundle it is given', () => {
    const plain = nullTranslator.load('sandbox_kernel');
    // A "translation" that marks what went through it, placeholders filled as gettext does.
    const marked = {
      ...plain,
      __: (msgid: string, ...args: unknown[]) =>
        `«${plain.__(msgid, ...(args as string[]))}»`,
      _n: (msgid: string, plural: string, n: number, ...args: unknown[]) =>
        `«${plain._n(msgid, plural, n, ...(args as string[]))}»`
    } as TranslationBundle;
    const now = 3700 * 1000;
    expect(formatDuration(42, marked)).toBe('«42s»');
    expect(formatAgo(1000, (1000 + 600) * 1000, marked)).toBe('««10m» ago»');
    expect(
      lifetime(sandbox({ created: 100, started: 3400 }), now, marked)
    ).toBe('«up «5m»»');
    expect(scopeLabel(sandbox(), marked)).toBe('«user»');
    expect(formatCpu(sandbox(), marked)).toBe('«25% of 1 CPU»');
    expect(
      kernelsLabel(
        { kernels: 2, busy_kernel_ids: ['k'] } as unknown as ISandbox,
        marked
      )
    ).toBe('««2 kernels» (1 busy)»');
  });

  it.each([
    // base URL as the page config gives it (absolute), with and without its slash
    ['http://lab.test/', 'http://lab.test/sandbox-kernel/dav/sk-alice/'],
    ['http://lab.test', 'http://lab.test/sandbox-kernel/dav/sk-alice/'],
    [
      'http://lab.test/user/alice/',
      'http://lab.test/user/alice/sandbox-kernel/dav/sk-alice/'
    ],
    [
      'http://lab.test/user/alice',
      'http://lab.test/user/alice/sandbox-kernel/dav/sk-alice/'
    ],
    // relative base URLs are resolved against the page, never against its folder
    ['/', 'https://hub.test/sandbox-kernel/dav/sk-alice/'],
    [
      '/user/alice/',
      'https://hub.test/user/alice/sandbox-kernel/dav/sk-alice/'
    ],
    ['/user/alice', 'https://hub.test/user/alice/sandbox-kernel/dav/sk-alice/'],
    ['', 'https://hub.test/sandbox-kernel/dav/sk-alice/']
  ])('makes the absolute WebDAV URL from base URL %j', (base, expected) => {
    expect(
      davUrl(base, 'sk-alice', 'https://hub.test/user/alice/lab/tree/x')
    ).toBe(expected);
  });

  it('encodes a sandbox id into one path segment of the WebDAV URL', () => {
    const page = 'http://lab.test/lab';
    expect(davUrl('/', 'sk-alice--t1.a_b', page)).toBe(
      'http://lab.test/sandbox-kernel/dav/sk-alice--t1.a_b/'
    );
    expect(davUrl('/', 'sk-a b/c?d#e%f', page)).toBe(
      'http://lab.test/sandbox-kernel/dav/sk-a%20b%2Fc%3Fd%23e%25f/'
    );
    expect(davUrl('/', 'sk-zoë@host', page)).toBe(
      'http://lab.test/sandbox-kernel/dav/sk-zo%C3%AB%40host/'
    );
    // The segment stays one: the server gets the id back with one decode.
    const url = new URL(davUrl('/base/', 'a/../../b', page));
    expect(url.pathname).toBe('/base/sandbox-kernel/dav/a%2F..%2F..%2Fb/');
    expect(decodeURIComponent(url.pathname.split('/')[4])).toBe('a/../../b');
  });

  it('keeps the host, port and scheme of an absolute base URL', () => {
    expect(
      davUrl('https://other.test:8443/jl/', 'sk-alice', 'http://lab.test/lab')
    ).toBe('https://other.test:8443/jl/sandbox-kernel/dav/sk-alice/');
  });
});
