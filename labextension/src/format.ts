/** How sandbox figures read in the panel. Pure functions, unit-tested. */
import { ISandbox } from './api';

export function formatBytes(bytes: number | undefined | null): string {
  if (bytes === undefined || bytes === null || !isFinite(bytes) || bytes < 0) {
    return '–';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  const digits = unit === 0 || value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${units[unit]}`;
}

/** A duration in seconds as "45s", "12m", "3h 05m", "2d 4h". */
export function formatDuration(seconds: number): string {
  if (!isFinite(seconds) || seconds < 0) {
    return '–';
  }
  const s = Math.floor(seconds);
  if (s < 60) {
    return `${s}s`;
  }
  const m = Math.floor(s / 60);
  if (m < 60) {
    return `${m}m`;
  }
  const h = Math.floor(m / 60);
  if (h < 24) {
    return `${h}h ${String(m % 60).padStart(2, '0')}m`;
  }
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

/** "just now", "5m ago" for an epoch time in seconds. */
export function formatAgo(epochSeconds: number, nowMs = Date.now()): string {
  if (!epochSeconds) {
    return '–';
  }
  const delta = nowMs / 1000 - epochSeconds;
  return delta < 10 ? 'just now' : `${formatDuration(delta)} ago`;
}

/** CPU use as a percentage of one CPU, with the limit ("12% of 1 CPU"). */
export function formatCpu(sandbox: ISandbox): string {
  const limit = sandbox.limits?.cpus;
  const limitText = limit ? ` of ${limit} CPU` : '';
  const cpu = sandbox.usage?.cpu;
  if (cpu === undefined || cpu === null) {
    return sandbox.state === 'running' ? `…${limitText}` : `–${limitText}`;
  }
  return `${Math.round(cpu * 100)}%${limitText}`;
}

export function formatMemory(sandbox: ISandbox): string {
  const used = sandbox.usage?.memory;
  const limit = sandbox.limits?.memory;
  const usedText = used === undefined ? '–' : formatBytes(used);
  return limit ? `${usedText} / ${formatBytes(limit)}` : usedText;
}

/** Memory use as a fraction of the limit (0..1), or null when unknown. */
export function memoryFraction(sandbox: ISandbox): number | null {
  const used = sandbox.usage?.memory;
  const limit = sandbox.limits?.memory;
  if (!used || !limit) {
    return null;
  }
  return Math.min(1, used / limit);
}

/** The last part of a path, for a notebook's name. */
export function basename(path: string): string {
  const parts = path.split(/[\\/]/).filter(Boolean);
  return parts.length ? parts[parts.length - 1] : path;
}

/** What a sandbox's scope reads as: "user", "thread · analysis.ipynb", "thread · from snapshot x". */
export function scopeLabel(sandbox: ISandbox): string {
  if (sandbox.scope !== 'thread') {
    return 'user';
  }
  const thread = sandbox.thread || '';
  const fromSnapshot = thread.match(/^snapshot:([^:]+):/);
  if (fromSnapshot) {
    return `thread · from snapshot ${fromSnapshot[1]}`;
  }
  return thread ? `thread · ${basename(thread)}` : 'thread';
}

/** Image or snapshot a sandbox was made from. */
export function originLabel(sandbox: ISandbox): string {
  if (sandbox.snapshot) {
    return `snapshot ${sandbox.snapshot}`;
  }
  return sandbox.image || '–';
}

/** How long ago the sandbox was created. */
export function age(sandbox: ISandbox, nowMs = Date.now()): string {
  if (!sandbox.created) {
    return '–';
  }
  return formatDuration(nowMs / 1000 - sandbox.created);
}

/**
 * Uptime of a running sandbox ("up 5m"), else its age ("age 2d 3h"): a stopped one
 * has no uptime, and a backend that can't tell when it started gives 0.
 */
export function lifetime(sandbox: ISandbox, nowMs = Date.now()): string {
  if (sandbox.state === 'running' && sandbox.started) {
    return `up ${formatDuration(Math.max(0, nowMs / 1000 - sandbox.started))}`;
  }
  return `age ${age(sandbox, nowMs)}`;
}

/** Kernels using a sandbox, and how many run a cell ("2 (1 busy)"). */
export function kernelsLabel(sandbox: ISandbox): string {
  const busy = sandbox.busy_kernel_ids?.length ?? 0;
  return busy ? `${sandbox.kernels} (${busy} busy)` : `${sandbox.kernels}`;
}

/** What the lifecycle will do next ("stops in 12m", "removed in 1h 30m"), or "" for nothing planned. */
export function nextLabel(sandbox: ISandbox, nowMs = Date.now()): string {
  const next = sandbox.next;
  if (!next || !next.action) {
    return '';
  }
  const verb = next.action === 'stop' ? 'stops' : 'removed (workspace kept)';
  const left = next.at - nowMs / 1000;
  return left <= 0
    ? `${verb} at the next cleanup`
    : `${verb} in ${formatDuration(left)}`;
}
