/** One snapshot in the Snapshots section: name, source, size, age; start a sandbox from it, delete it. */
import { Notification } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';
import { deleteIcon, runIcon } from '@jupyterlab/ui-components';
import * as React from 'react';

import { ISnapshot } from '../api';
import { confirmDeleteSnapshot } from '../dialogs';
import { formatAgo, formatBytes } from '../format';
import { SandboxesModel } from '../model';
import { notifyError } from '../notify';
import { ActionButton } from './ActionButton';
import { Breakable } from './Breakable';

export function SnapshotRow(props: {
  snapshot: ISnapshot;
  model: SandboxesModel;
  trans: TranslationBundle;
}): JSX.Element {
  const { snapshot: snap, model, trans } = props;
  const busy = model.isBusy(`snapshot:${snap.name}`);
  const start = () => {
    model
      .startFromSnapshot(snap.name)
      .then(s => {
        Notification.success(
          trans.__('Started %1 from snapshot %2', s.id, snap.name),
          { autoClose: 4000 }
        );
        model.reveal(s.id);
      })
      .catch(error =>
        notifyError(
          trans,
          trans.__('Starting a sandbox from %1', snap.name),
          error
        )
      );
  };
  return (
    <li
      className={`jp-SandboxPanel-snapshot${busy ? ' jp-mod-busy' : ''}`}
      data-snapshot={snap.name}
      tabIndex={0}
    >
      <div className="jp-SandboxPanel-snapshotText">
        <span className="jp-SandboxPanel-name">
          <Breakable text={snap.name} />
        </span>
        <span className="jp-SandboxPanel-sub">
          {trans.__(
            'from %1 · %2 · %3',
            snap.source || '?',
            formatBytes(snap.size),
            formatAgo(snap.created, Date.now(), trans)
          )}
        </span>
      </div>
      <div className="jp-SandboxPanel-actions">
        <ActionButton
          icon={runIcon}
          label={trans.__('Start a new sandbox from %1', snap.name)}
          disabled={busy}
          onClick={start}
        />
        <ActionButton
          icon={deleteIcon}
          label={trans.__('Delete snapshot %1', snap.name)}
          disabled={busy}
          className="jp-mod-danger"
          onClick={() => void confirmDeleteSnapshot(trans, model, snap.name)}
        />
      </div>
    </li>
  );
}
