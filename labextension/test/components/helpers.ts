/**
 * What the component tests share: the translation bundle, models over the fake server
 * (the real API client and models run; only the network answers are scripted), the
 * notifications shown, and answering JupyterLab's dialogs as a user would.
 */
import { Notification } from '@jupyterlab/apputils';
import { nullTranslator } from '@jupyterlab/translation';
import { cleanup, fireEvent, waitFor } from '@testing-library/react';
import { afterEach } from 'vitest';

import { SandboxAPI } from '../../src/api';
import { TRANSLATION_DOMAIN } from '../../src/format';
import { FilesModel, SandboxesModel } from '../../src/model';
import { FakeServer } from '../server';

afterEach(() => {
  cleanup();
  Notification.dismiss();
  document.querySelectorAll('.jp-Dialog').forEach(node => node.remove());
});

export const trans = nullTranslator.load(TRANSLATION_DOMAIN);

/** A sandboxes model over a fake server listing ``sandboxes`` and ``snapshots``, loaded. */
export async function sandboxesModel(
  sandboxes: unknown[],
  snapshots: unknown[] = []
): Promise<{ server: FakeServer; model: SandboxesModel }> {
  const server = new FakeServer()
    .json('GET', '/base/api/sandboxes', sandboxes)
    .json('GET', '/base/api/snapshots', snapshots);
  const model = new SandboxesModel({
    api: new SandboxAPI(server.settings()),
    poll: false
  });
  await model.update();
  return { server, model };
}

/** A files model over a fake server, showing ``entries`` of sk-alice's workspace top. */
export async function filesModel(
  entries: unknown[]
): Promise<{ server: FakeServer; files: FilesModel }> {
  const server = new FakeServer().json(
    'GET',
    '/base/api/sandboxes/sk-alice/files',
    { path: '', entries }
  );
  const files = new FilesModel(new SandboxAPI(server.settings()));
  await files.open('sk-alice', '');
  return { server, files };
}

/** The requests the fake server got, as "METHOD /path" (no query, no host). */
export function calls(server: FakeServer): string[] {
  return server.requests.map(r => `${r.method} ${new URL(r.url).pathname}`);
}

/** The messages of the notifications shown now, of one type or all. */
export function notifications(type?: Notification.TypeOptions): string[] {
  return Notification.manager.notifications
    .filter(n => !type || n.type === type)
    .map(n => n.message);
}

/** Wait for JupyterLab's dialog, check its title, and press its accept (or cancel) button. */
export async function answerDialog(
  title: RegExp | string,
  accept: boolean
): Promise<void> {
  const dialog = await waitFor(() => {
    const node = document.querySelector('.jp-Dialog');
    if (!node) {
      throw new Error('no dialog');
    }
    return node as HTMLElement;
  });
  const header = dialog.querySelector('.jp-Dialog-header')?.textContent ?? '';
  if (
    typeof title === 'string' ? !header.includes(title) : !title.test(header)
  ) {
    throw new Error(`dialog titled ${JSON.stringify(header)}`);
  }
  const button = dialog.querySelector(
    accept
      ? '.jp-Dialog-button.jp-mod-accept'
      : '.jp-Dialog-button.jp-mod-reject'
  ) as HTMLElement;
  fireEvent.click(button);
  await waitFor(() => {
    if (document.querySelector('.jp-Dialog')) {
      throw new Error('the dialog is still open');
    }
  });
}
