import { readFileSync } from 'fs';
import { join } from 'path';

import { describe, expect, it } from 'vitest';

import { DEFAULT_HIDDEN_FILES } from '../src/hidden';
import {
  DEFAULT_SETTINGS,
  MAX_REFRESH_SECONDS,
  MIN_REFRESH_SECONDS,
  readSettings,
  refreshIntervalMs
} from '../src/settings';

const schema = JSON.parse(
  readFileSync(join(__dirname, '..', 'schema', 'plugin.json'), 'utf-8')
);

describe('settings', () => {
  it('has the schema defaults and bounds the code uses', () => {
    const props = schema.properties;
    expect(props.refreshInterval.default).toBe(
      DEFAULT_SETTINGS.refreshInterval
    );
    expect(props.refreshInterval.minimum).toBe(MIN_REFRESH_SECONDS);
    expect(props.refreshInterval.maximum).toBe(MAX_REFRESH_SECONDS);
    expect(props.showHiddenFiles.default).toBe(
      DEFAULT_SETTINGS.showHiddenFiles
    );
    expect(props.hiddenFiles.default).toEqual([...DEFAULT_HIDDEN_FILES]);
    expect(schema.additionalProperties).toBe(false);
  });

  it('reads what the registry gives, falling back to defaults on bad values', () => {
    expect(
      readSettings({
        refreshInterval: 30,
        showHiddenFiles: true,
        hiddenFiles: ['*.log']
      })
    ).toEqual({
      refreshInterval: 30,
      showHiddenFiles: true,
      hiddenFiles: ['*.log']
    });
    expect(readSettings(null)).toEqual(DEFAULT_SETTINGS);
    expect(
      readSettings({
        refreshInterval: '30',
        showHiddenFiles: 'yes',
        hiddenFiles: 'x'
      })
    ).toEqual(DEFAULT_SETTINGS);
    expect(readSettings({ refreshInterval: 0.01 }).refreshInterval).toBe(
      MIN_REFRESH_SECONDS
    );
    expect(readSettings({ refreshInterval: 1e9 }).refreshInterval).toBe(
      MAX_REFRESH_SECONDS
    );
    expect(readSettings({ refreshInterval: NaN }).refreshInterval).toBe(
      DEFAULT_SETTINGS.refreshInterval
    );
    expect(
      readSettings({ hiddenFiles: ['*.log', 3, '', null] }).hiddenFiles
    ).toEqual(['*.log']);
  });

  it('turns the interval in seconds into the model milliseconds, within bounds', () => {
    expect(refreshIntervalMs(5)).toBe(5000);
    expect(refreshIntervalMs(2.5)).toBe(2500);
    expect(refreshIntervalMs(0)).toBe(MIN_REFRESH_SECONDS * 1000);
    expect(refreshIntervalMs(1e9)).toBe(MAX_REFRESH_SECONDS * 1000);
    expect(refreshIntervalMs(Infinity)).toBe(
      DEFAULT_SETTINGS.refreshInterval * 1000
    );
  });
});
