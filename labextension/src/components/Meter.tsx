/**
 * A thin bar showing a use against its limit (memory, disk, an upload's progress). It is
 * decoration beside the figures it draws, so screen readers skip it; the figures (or the
 * progress bar around it) say the same in words.
 */
import * as React from 'react';

export function Meter(props: {
  /** How full, 0..1 (clamped). */
  fraction: number;
}): JSX.Element {
  const percent = Math.round(Math.min(1, Math.max(0, props.fraction)) * 100);
  return (
    <span className="jp-SandboxPanel-meter" aria-hidden="true">
      <span style={{ width: `${percent}%` }} />
    </span>
  );
}
