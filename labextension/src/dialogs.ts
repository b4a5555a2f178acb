/**
 * The questions the panel asks before an action that loses something or needs a name:
 * destroy a sandbox, name a snapshot, delete a snapshot or a file. Each runs the action
 * through the model when the user agrees and reports the outcome as a notification.
 */
import {
  Dialog,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';

import { IFileEntry, ISandbox } from './api';
import { formatBytes } from './format';
import { FilesModel, SandboxesModel } from './model';
import { notifyError } from './notify';

/** A yes/no question whose yes button is marked as dangerous; true when it is pressed. */
async function confirmDanger(
  title: string,
  body: string,
  accept: string,
  trans: TranslationBundle
): Promise<boolean> {
  const result = await showDialog({
    title,
    body,
    buttons: [
      Dialog.cancelButton({ label: trans.__('Cancel') }),
      Dialog.warnButton({ label: accept })
    ]
  });
  return result.button.accept;
}

/** The name a new snapshot of ``sandbox`` is offered under: its id and the time. */
export function defaultSnapshotName(
  sandbox: ISandbox,
  now = new Date()
): string {
  const stamp = now.toISOString().slice(0, 16).replace(/[-:T]/g, '');
  return `${sandbox.id.replace(/^sk-/, '').slice(0, 40)}-${stamp}`.toLowerCase();
}

/** Ask for a snapshot's name, then take the snapshot of ``sandbox``. */
export async function askSnapshot(
  trans: TranslationBundle,
  model: SandboxesModel,
  sandbox: ISandbox
): Promise<void> {
  const result = await InputDialog.getText({
    title: trans.__('Snapshot %1', sandbox.id),
    label: trans.__(
      'Snapshot name (lowercase letters, digits, ".", "_" or "-"). The workspace is not included.'
    ),
    text: defaultSnapshotName(sandbox),
    okLabel: trans.__('Snapshot'),
    cancelLabel: trans.__('Cancel')
  });
  if (!result.button.accept || !result.value) {
    return;
  }
  const name = result.value.trim();
  try {
    const snap = await model.snapshot(sandbox.id, name);
    Notification.success(
      trans.__('Snapshot %1 saved (%2)', snap.name, formatBytes(snap.size)),
      { autoClose: 4000 }
    );
  } catch (error) {
    notifyError(trans, trans.__('Snapshot of %1', sandbox.id), error);
  }
}

/** Ask, saying what is lost and that the workspace is kept, then destroy ``sandbox``. */
export async function confirmDestroy(
  trans: TranslationBundle,
  model: SandboxesModel,
  sandbox: ISandbox
): Promise<void> {
  const kernels = sandbox.kernels
    ? ' ' +
      trans._n(
        '%1 kernel using it will lose its variables.',
        '%1 kernels using it will lose their variables.',
        sandbox.kernels
      )
    : '';
  const yes = await confirmDanger(
    trans.__('Destroy %1?', sandbox.id),
    trans.__(
      'The sandbox and what was installed in it outside /workspace are removed. Your files in /workspace are kept.'
    ) + kernels,
    trans.__('Destroy'),
    trans
  );
  if (!yes) {
    return;
  }
  try {
    await model.destroy(sandbox.id);
    Notification.success(
      trans.__('Destroyed %1; its workspace is kept', sandbox.id),
      { autoClose: 4000 }
    );
  } catch (error) {
    notifyError(trans, trans.__('Destroying %1', sandbox.id), error);
  }
}

/** Ask, then delete the snapshot ``name``. */
export async function confirmDeleteSnapshot(
  trans: TranslationBundle,
  model: SandboxesModel,
  name: string
): Promise<void> {
  const yes = await confirmDanger(
    trans.__('Delete snapshot %1?', name),
    trans.__('Sandboxes started from it must be destroyed first.'),
    trans.__('Delete'),
    trans
  );
  if (yes) {
    await model
      .deleteSnapshot(name)
      .catch(error =>
        notifyError(trans, trans.__('Deleting snapshot %1', name), error)
      );
  }
}

/** Ask, then delete one file of the workspace shown. */
export async function confirmDeleteFile(
  trans: TranslationBundle,
  files: FilesModel,
  entry: IFileEntry
): Promise<void> {
  const yes = await confirmDanger(
    trans.__('Delete %1?', entry.path),
    trans.__('The file is removed from the workspace.'),
    trans.__('Delete'),
    trans
  );
  if (yes) {
    await files
      .delete(entry)
      .catch(error =>
        notifyError(trans, trans.__('Deleting %1', entry.path), error)
      );
  }
}
