/**
 * How sandbox figures read in the panel. Pure functions, unit-tested.
 *
 * Every function that makes words takes the translation bundle last; without one it
 * uses the null translator (English, with %1-style placeholders filled in).
 */
import { nullTranslator, TranslationBundle } from '@jupyterlab/translation';

import type { ISandbox } from './api';

/** The translation domain of the panel's strings. */
export const TRANSLATION_DOMAIN = 'sandbox_kernel';

const NULL_TRANS: TranslationBundle = nullTranslator.load(TRANSLATION_DOMAIN);

/**
 * A no-break space: a number and its unit ("191 MiB", "3h 05m") never part at the
 * end of a line.
 */
export const NBSP = '\u00a0';

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
  return `${value.toFixed(digits)}${NBSP}${units[unit]}`;
}

/** A duration in seconds as "45s", "12m", "3h 05m", "2d 4h" (no-break spaces). */
export function formatDuration(
  seconds: number,
  trans: TranslationBundle = NULL_TRANS
): string {
  if (!isFinite(seconds) || seconds < 0) {
    return '–';
  }
  const s = Math.floor(seconds);
  if (s < 60) {
    return trans.__('%1s', s);
  }
  const m = Math.floor(s / 60);
  if (m < 60) {
    return trans.__('%1m', m);
  }
  const h = Math.floor(m / 60);
  if (h < 24) {
    return `${trans.__('%1h', h)}${NBSP}${trans.__('%1m', String(m % 60).padStart(2, '0'))}`;
  }
  return `${trans.__('%1d', Math.floor(h / 24))}${NBSP}${trans.__('%1h', h % 24)}`;
}

/** "just now", "5m ago" for an epoch time in seconds. */
export function formatAgo(
  epochSeconds: number,
  nowMs = Date.now(),
  trans: TranslationBundle = NULL_TRANS
): string {
  if (!epochSeconds) {
    return '–';
  }
  const delta = nowMs / 1000 - epochSeconds;
  return delta < 10
    ? trans.__('just now')
    : trans.__('%1 ago', formatDuration(delta, trans));
}

/** CPU use as a percentage of one CPU, with the limit ("12% of 1 CPU", "40% of 2 CPUs"). */
export function formatCpu(
  sandbox: ISandbox,
  trans: TranslationBundle = NULL_TRANS
): string {
  const limit = sandbox.limits?.cpus;
  const cpu = sandbox.usage?.cpu;
  const used =
    cpu === undefined || cpu === null
      ? sandbox.state === 'running'
        ? '…'
        : '–'
      : `${Math.round(cpu * 100)}%`;
  return limit ? trans._n('%2 of %1 CPU', '%2 of %1 CPUs', limit, used) : used;
}

/** A use against a limit in bytes ("256 MiB / 1.00 GiB"), the use alone without a limit. */
export function formatAgainst(
  used: number | undefined | null,
  limit: number | undefined | null
): string {
  const usedText =
    used === undefined || used === null ? '–' : formatBytes(used);
  return limit ? `${usedText} / ${formatBytes(limit)}` : usedText;
}

/** A use as a fraction of its limit (0..1), or null when either is unknown. */
export function fractionOf(
  used: number | undefined | null,
  limit: number | undefined | null
): number | null {
  if (!isSize(used) || !isSize(limit) || limit === 0) {
    return null;
  }
  return Math.min(1, used / limit);
}

export function formatMemory(sandbox: ISandbox): string {
  return formatAgainst(sandbox.usage?.memory, sandbox.limits?.memory);
}

/** Memory use as a fraction of the limit (0..1), or null when unknown. */
export function memoryFraction(sandbox: ISandbox): number | null {
  return fractionOf(sandbox.usage?.memory, sandbox.limits?.memory);
}

/**
 * Disk use against the flavor's disk size ("1.20 GiB / 10.0 GiB"), or "" when the
 * server gives neither (a backend or server version that does not measure it).
 */
export function formatDisk(sandbox: ISandbox): string {
  const used = sandbox.usage?.disk;
  const limit = sandbox.limits?.disk;
  if (!isSize(used) && !isSize(limit)) {
    return '';
  }
  return formatAgainst(
    isSize(used) ? used : null,
    isSize(limit) ? limit : null
  );
}

/** Disk use as a fraction of the flavor's disk size (0..1), or null when unknown. */
export function diskFraction(sandbox: ISandbox): number | null {
  return fractionOf(sandbox.usage?.disk, sandbox.limits?.disk);
}

/** A number of bytes the panel can show (a field the server left out is not one). */
function isSize(value: unknown): value is number {
  return typeof value === 'number' && isFinite(value) && value >= 0;
}

/**
 * The folder a sandbox's cells run in: its work folder (a host folder mounted at the
 * same path inside), else /workspace. It tells two sandboxes of one user apart.
 */
export function folderLabel(sandbox: ISandbox): string {
  return sandbox.work_folder || '/workspace';
}

/** The words for a sandbox state (the state itself stays the CSS class). */
export function stateLabel(
  state: string,
  trans: TranslationBundle = NULL_TRANS
): string {
  switch (state) {
    case 'running':
      return trans.__('running');
    case 'stopped':
      return trans.__('stopped');
    case 'creating':
      return trans.__('creating');
    case 'error':
      return trans.__('error');
    default:
      return state;
  }
}

/** The last part of a path, for a notebook's name. */
export function basename(path: string): string {
  const parts = path.split(/[\\/]/).filter(Boolean);
  return parts.length ? parts[parts.length - 1] : path;
}

/** What a sandbox's scope reads as: "user", "thread · analysis.ipynb", "thread · from snapshot x". */
export function scopeLabel(
  sandbox: ISandbox,
  trans: TranslationBundle = NULL_TRANS
): string {
  if (sandbox.scope !== 'thread') {
    return trans.__('user');
  }
  const thread = sandbox.thread || '';
  const fromSnapshot = thread.match(/^snapshot:([^:]+):/);
  if (fromSnapshot) {
    return trans.__('thread · from snapshot %1', fromSnapshot[1]);
  }
  return thread
    ? trans.__('thread · %1', basename(thread))
    : trans.__('thread');
}

/** Image or snapshot a sandbox was made from. */
export function originLabel(
  sandbox: ISandbox,
  trans: TranslationBundle = NULL_TRANS
): string {
  if (sandbox.snapshot) {
    return trans.__('snapshot %1', sandbox.snapshot);
  }
  return sandbox.image || '–';
}

/** How long ago the sandbox was created. */
export function age(
  sandbox: ISandbox,
  nowMs = Date.now(),
  trans: TranslationBundle = NULL_TRANS
): string {
  if (!sandbox.created) {
    return '–';
  }
  return formatDuration(nowMs / 1000 - sandbox.created, trans);
}

/**
 * Uptime of a running sandbox ("up 5m"), else its age ("age 2d 3h"): a stopped one
 * has no uptime, and a backend that can't tell when it started gives 0.
 */
export function lifetime(
  sandbox: ISandbox,
  nowMs = Date.now(),
  trans: TranslationBundle = NULL_TRANS
): string {
  if (sandbox.state === 'running' && sandbox.started) {
    return trans.__(
      'up %1',
      formatDuration(Math.max(0, nowMs / 1000 - sandbox.started), trans)
    );
  }
  return trans.__('age %1', age(sandbox, nowMs, trans));
}

/** Kernels using a sandbox, and how many run a cell ("1 kernel", "2 kernels (1 busy)"). */
export function kernelsLabel(
  sandbox: ISandbox,
  trans: TranslationBundle = NULL_TRANS
): string {
  const count = sandbox.kernels ?? 0;
  const kernels = trans._n('%1 kernel', '%1 kernels', count);
  const busy = sandbox.busy_kernel_ids?.length ?? 0;
  return busy ? trans.__('%1 (%2 busy)', kernels, busy) : kernels;
}

/**
 * Agents' sessions in a sandbox, by name, busy ones marked ("analysis (busy), scratch"),
 * or "" for none. Names come from the agent: long ones are cut so a card keeps its width.
 */
export function agentsLabel(
  sandbox: ISandbox,
  trans: TranslationBundle = NULL_TRANS
): string {
  return (sandbox.agent_sessions ?? [])
    .map(a => {
      const name = a.name.length > 24 ? `${a.name.slice(0, 23)}…` : a.name;
      return a.busy ? trans.__('%1 (busy)', name) : name;
    })
    .join(', ');
}

/** What the lifecycle will do next ("stops in 12m", "removed in 1h 30m"), or "" for nothing planned. */
export function nextLabel(
  sandbox: ISandbox,
  nowMs = Date.now(),
  trans: TranslationBundle = NULL_TRANS
): string {
  const next = sandbox.next;
  if (!next || !next.action) {
    return '';
  }
  const left = next.at - nowMs / 1000;
  if (next.action === 'stop') {
    return left <= 0
      ? trans.__('stops at the next cleanup')
      : trans.__('stops in %1', formatDuration(left, trans));
  }
  return left <= 0
    ? trans.__('removed (workspace kept) at the next cleanup')
    : trans.__('removed (workspace kept) in %1', formatDuration(left, trans));
}

/**
 * The absolute WebDAV URL of a sandbox's workspace: the server extension serves it at
 * `{base_url}sandbox-kernel/dav/{sandbox id}/`. A desktop client needs the whole URL, so
 * a relative base URL is resolved against `location` (the page's address by default);
 * a base URL without its trailing slash is taken as the folder it names.
 */
export function davUrl(
  baseUrl: string,
  id: string,
  location: string | undefined = globalThis.location?.href
): string {
  const base = baseUrl.endsWith('/') ? baseUrl : `${baseUrl}/`;
  return new URL(
    `${base}sandbox-kernel/dav/${encodeURIComponent(id)}/`,
    location
  ).href;
}
