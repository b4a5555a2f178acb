import { describe, expect, it } from 'vitest';

import type { ISandbox } from '../src/api';
import {
  age,
  formatAgo,
  lifetime,
  formatBytes,
  formatCpu,
  formatDuration,
  formatMemory,
  kernelsLabel,
  memoryFraction,
  nextLabel,
  originLabel,
  scopeLabel
} from '../src/format';
import { sandbox } from './server';

describe('format', () => {
  it('formats sizes and durations', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(1536)).toBe('1.50 KiB');
    expect(formatBytes(1 << 30)).toBe('1.00 GiB');
    expect(formatBytes(undefined)).toBe('–');
    expect(formatDuration(42)).toBe('42s');
    expect(formatDuration(3 * 3600 + 5 * 60)).toBe('3h 05m');
    expect(formatDuration(50 * 3600)).toBe('2d 2h');
    expect(formatAgo(1000, 1000 * 1000 + 5000)).toBe('just now');
    expect(formatAgo(1000, (1000 + 600) * 1000)).toBe('10m ago');
  });

  it('describes use against limits', () => {
    const s = sandbox();
    expect(formatCpu(s)).toBe('25% of 1 CPU');
    expect(formatMemory(s)).toBe('256 MiB / 1.00 GiB');
    expect(memoryFraction(s)).toBe(0.25);
    expect(formatCpu(sandbox({ usage: {}, state: 'stopped' }))).toBe(
      '– of 1 CPU'
    );
    expect(age(sandbox({ created: 100 }), 3700 * 1000)).toBe('1h 00m');
    // Uptime counts from the last start while running; otherwise the age is shown.
    expect(
      lifetime(sandbox({ created: 100, started: 3400 }), 3700 * 1000)
    ).toBe('up 5m');
    expect(
      lifetime(
        sandbox({ created: 100, started: 3400, state: 'stopped' }),
        3700 * 1000
      )
    ).toBe('age 1h 00m');
    expect(lifetime(sandbox({ created: 100, started: 0 }), 3700 * 1000)).toBe(
      'age 1h 00m'
    );
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
    expect(kernelsLabel(base)).toBe('2 (1 busy)');
    expect(kernelsLabel({ ...base, busy_kernel_ids: [] })).toBe('2');
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
});
