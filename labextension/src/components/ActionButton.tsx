/** An icon button of the panel (stop, start, browse, snapshot, destroy, copy, delete). */
import { LabIcon } from '@jupyterlab/ui-components';
import * as React from 'react';

export interface IActionButtonProps {
  icon: LabIcon;
  /** What it does, naming what it acts on: the tooltip and the accessible name. */
  label: string;
  onClick: () => void;
  disabled?: boolean;
  /** More classes, e.g. jp-mod-danger for a button that removes something. */
  className?: string;
}

export function ActionButton(props: IActionButtonProps): JSX.Element {
  return (
    <button
      type="button"
      className={`jp-SandboxPanel-action jp-mod-styled ${props.className ?? ''}`}
      title={props.label}
      aria-label={props.label}
      disabled={props.disabled}
      onClick={props.onClick}
    >
      <props.icon.react tag="span" className="jp-SandboxPanel-actionIcon" />
    </button>
  );
}
