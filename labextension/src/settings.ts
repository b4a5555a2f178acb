/**
 * The panel's user settings (schema/plugin.json), read into plain values. Pure, so the
 * limits are unit-tested; the plugin applies them to the models and again on each change.
 */
import { DEFAULT_HIDDEN_FILES } from './hidden';

export interface IPanelSettings {
  /** Seconds between refreshes of the sandboxes and snapshots while all is well. */
  refreshInterval: number;
  /** List names starting with a dot in Files. */
  showHiddenFiles: boolean;
  /** Glob patterns of names Files never lists. */
  hiddenFiles: string[];
}

export const DEFAULT_SETTINGS: Readonly<IPanelSettings> = {
  refreshInterval: 5,
  showHiddenFiles: false,
  hiddenFiles: [...DEFAULT_HIDDEN_FILES]
};

/** The schema's bounds of ``refreshInterval`` (seconds). */
export const MIN_REFRESH_SECONDS = 1;
export const MAX_REFRESH_SECONDS = 3600;

/**
 * Settings as the registry gives them (``settings.composite``), checked: a value of the
 * wrong type gives the default, an interval out of bounds is brought within them.
 */
export function readSettings(
  composite: { [key: string]: unknown } | null | undefined
): IPanelSettings {
  const raw = composite ?? {};
  const interval = Number(raw.refreshInterval);
  const hidden = raw.hiddenFiles;
  return {
    refreshInterval:
      typeof raw.refreshInterval === 'number' && isFinite(interval)
        ? Math.min(MAX_REFRESH_SECONDS, Math.max(MIN_REFRESH_SECONDS, interval))
        : DEFAULT_SETTINGS.refreshInterval,
    showHiddenFiles:
      typeof raw.showHiddenFiles === 'boolean'
        ? raw.showHiddenFiles
        : DEFAULT_SETTINGS.showHiddenFiles,
    hiddenFiles: Array.isArray(hidden)
      ? hidden.filter((p): p is string => typeof p === 'string' && p !== '')
      : [...DEFAULT_SETTINGS.hiddenFiles]
  };
}

/** An interval in seconds as the model's milliseconds, within the schema's bounds. */
export function refreshIntervalMs(seconds: number): number {
  const bounded = Math.min(
    MAX_REFRESH_SECONDS,
    Math.max(
      MIN_REFRESH_SECONDS,
      isFinite(seconds) ? seconds : DEFAULT_SETTINGS.refreshInterval
    )
  );
  return Math.round(bounded * 1000);
}
