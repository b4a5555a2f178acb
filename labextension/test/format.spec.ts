import { describe, expect, it } from 'vitest';

import { age, formatAgo, lifetime, formatBytes, formatCpu, formatDuration, formatMemory, memoryFraction, originLabel, scopeLabel } from '../src/format';
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
    expect(formatCpu(sandbox({ usage: {}, state: 'stopped' }))).toBe('– of 1 CPU');
    expect(age(sandbox({ created: 100 }), 3700 * 1000)).toBe('1h 00m');
    // Uptime counts from the last start while running; otherwise the age is shown.
    expect(lifetime(sandbox({ created: 100, started: 3400 }), 3700 * 1000)).toBe('up 5m');
    expect(lifetime(sandbox({ created: 100, started: 3400, state: 'stopped' }), 3700 * 1000)).toBe('age 1h 00m');
    expect(lifetime(sandbox({ created: 100, started: 0 }), 3700 * 1000)).toBe('age 1h 00m');
  });

  it('names scopes and origins', () => {
    expect(scopeLabel(sandbox())).toBe('user');
    expect(scopeLabel(sandbox({ scope: 'thread', thread: '/home/a/work/analysis.ipynb' }))).toBe('thread · analysis.ipynb');
    expect(scopeLabel(sandbox({ scope: 'thread', thread: 'snapshot:base-env:1a2b3c4d' }))).toBe('thread · from snapshot base-env');
    expect(originLabel(sandbox({ snapshot: 'base-env' }))).toBe('snapshot base-env');
    expect(originLabel(sandbox())).toBe('python:3.12-slim');
  });
});
