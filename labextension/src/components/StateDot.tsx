/** The coloured dot of a sandbox's state (running, stopped, creating, error). */
import * as React from 'react';

export function StateDot(props: {
  /** The state as the API names it: the CSS class picks the colour. */
  state: string;
  /** The state in words, for screen readers and the tooltip. */
  label: string;
}): JSX.Element {
  return (
    <span
      className={`jp-SandboxPanel-dot jp-SandboxPanel-dot-${props.state}`}
      role="img"
      aria-label={props.label}
      title={props.label}
    />
  );
}
