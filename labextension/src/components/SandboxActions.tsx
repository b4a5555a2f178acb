/**
 * The buttons of a sandbox card: stop or start, browse its files, snapshot, destroy.
 * Failures show as notifications; the buttons that change the sandbox are disabled
 * while an action on it is in flight.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { deleteIcon, runIcon, stopIcon } from '@jupyterlab/ui-components';
import * as React from 'react';

import { ISandbox } from '../api';
import { askSnapshot, confirmDestroy } from '../dialogs';
import { cameraIcon, filesIcon } from '../icons';
import { SandboxesModel } from '../model';
import { notifyError } from '../notify';
import { ActionButton } from './ActionButton';

export function SandboxActions(props: {
  sandbox: ISandbox;
  model: SandboxesModel;
  trans: TranslationBundle;
  /** Show this sandbox's files in the Files section. */
  onBrowse: (id: string) => void;
}): JSX.Element {
  const { sandbox: s, model, trans } = props;
  const busy = model.isBusy(s.id);
  const act = (what: string, fn: () => Promise<unknown>) => () => {
    fn().catch(error => notifyError(trans, what, error));
  };
  return (
    <div className="jp-SandboxPanel-actions">
      {s.state === 'running' ? (
        <ActionButton
          icon={stopIcon}
          label={trans.__('Stop %1', s.id)}
          disabled={busy}
          onClick={act(trans.__('Stopping %1', s.id), () => model.stop(s.id))}
        />
      ) : (
        <ActionButton
          icon={runIcon}
          label={trans.__('Start %1', s.id)}
          disabled={busy}
          onClick={act(trans.__('Starting %1', s.id), () => model.start(s.id))}
        />
      )}
      <ActionButton
        icon={filesIcon}
        label={trans.__('Browse files of %1', s.id)}
        onClick={() => props.onBrowse(s.id)}
      />
      <ActionButton
        icon={cameraIcon}
        label={trans.__('Snapshot %1', s.id)}
        disabled={busy}
        onClick={() => void askSnapshot(trans, model, s)}
      />
      <ActionButton
        icon={deleteIcon}
        label={trans.__('Destroy %1', s.id)}
        disabled={busy}
        className="jp-mod-danger"
        onClick={() => void confirmDestroy(trans, model, s)}
      />
    </div>
  );
}
