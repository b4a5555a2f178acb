/**
 * The body of the Snapshots section: nothing while the sandboxes' error shows, why the
 * backend has no snapshots, how to take one, or one row per snapshot.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { SandboxesModel } from '../model';
import { SnapshotRow } from './SnapshotRow';

export function SnapshotList(props: {
  model: SandboxesModel;
  trans: TranslationBundle;
}): JSX.Element {
  const { model: m, trans } = props;
  if (m.error) {
    return <div className="jp-SandboxPanel-empty">–</div>;
  }
  if (m.snapshotsError) {
    return (
      <div className="jp-SandboxPanel-empty">{m.snapshotsError.message}</div>
    );
  }
  if (m.snapshots.length === 0) {
    return (
      <div className="jp-SandboxPanel-empty">
        {trans.__('No snapshots. Use the camera button of a sandbox.')}
      </div>
    );
  }
  return (
    <ul className="jp-SandboxPanel-list" aria-label={trans.__('Snapshots')}>
      {m.snapshots.map(s => (
        <SnapshotRow key={s.name} snapshot={s} model={m} trans={trans} />
      ))}
    </ul>
  );
}
