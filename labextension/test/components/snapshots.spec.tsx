// @vitest-environment jsdom
/**
 * The Snapshots section: a row's actions, the list and the widget.
 */
import { Widget } from '@lumino/widgets';
import { render, screen, waitFor } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import * as React from 'react';
import { describe, expect, it } from 'vitest';

import { ISnapshot } from '../../src/api';
import { SnapshotList } from '../../src/components/SnapshotList';
import { SnapshotRow } from '../../src/components/SnapshotRow';
import { SnapshotsView } from '../../src/components/SnapshotsView';
import { SandboxesModel } from '../../src/model';
import { sandbox } from '../server';
import {
  answerDialog,
  calls,
  notifications,
  sandboxesModel,
  trans
} from './helpers';

// -- SnapshotRow -----------------------------------------------------------
const SNAP: ISnapshot = {
  name: 'alice-base-env',
  backend: 'docker',
  user: 'alice',
  source: 'sk-alice',
  size: 191 * 2 ** 20,
  created: Date.now() / 1000 - 600
};

describe('SnapshotRow', () => {
  it('says its name, source, size and age', async () => {
    const { model } = await sandboxesModel([], [SNAP]);
    const { container } = render(
      <SnapshotRow snapshot={SNAP} model={model} trans={trans} />
    );
    const row = container.querySelector('li') as HTMLElement;
    expect(row.dataset.snapshot).toBe('alice-base-env');
    expect(row.querySelector('.jp-SandboxPanel-name')?.textContent).toBe(
      'alice-base-env'
    );
    expect(
      row
        .querySelector('.jp-SandboxPanel-sub')
        ?.textContent?.replace(/\u00a0/g, ' ')
    ).toBe('from sk-alice · 191 MiB · 10m ago');
  });

  it('starts a new sandbox from it and reveals that sandbox', async () => {
    const { server, model } = await sandboxesModel([], [SNAP]);
    const made = sandbox({ id: 'sk-alice--t9', snapshot: SNAP.name });
    server.json('POST', '/base/api/sandboxes', made);
    const revealed: string[] = [];
    model.revealRequested.connect((_, id) => revealed.push(id));
    render(<SnapshotRow snapshot={SNAP} model={model} trans={trans} />);
    await userEvent.click(
      screen.getByRole('button', {
        name: 'Start a new sandbox from alice-base-env'
      })
    );
    await waitFor(() => expect(revealed).toEqual(['sk-alice--t9']));
    const post = server.requests.find(r => r.method === 'POST');
    expect(JSON.parse(post!.body)).toEqual({ snapshot: 'alice-base-env' });
    expect(notifications('success')).toEqual([
      'Started sk-alice--t9 from snapshot alice-base-env'
    ]);
  });

  it('deletes it after the user agrees', async () => {
    const { server, model } = await sandboxesModel([], [SNAP]);
    server.on(
      'DELETE',
      '/base/api/snapshots/alice-base-env',
      () => new Response(null, { status: 204 })
    );
    render(<SnapshotRow snapshot={SNAP} model={model} trans={trans} />);
    const remove = screen.getByRole('button', {
      name: 'Delete snapshot alice-base-env'
    });
    await userEvent.click(remove);
    await answerDialog('Delete snapshot alice-base-env?', false);
    expect(calls(server)).not.toContain(
      'DELETE /base/api/snapshots/alice-base-env'
    );
    await userEvent.click(remove);
    await answerDialog('Delete snapshot alice-base-env?', true);
    await waitFor(() =>
      expect(calls(server)).toContain(
        'DELETE /base/api/snapshots/alice-base-env'
      )
    );
  });
});

// -- SnapshotList ----------------------------------------------------------
function show(model: SandboxesModel): HTMLElement {
  return render(<SnapshotList model={model} trans={trans} />).container;
}

describe('SnapshotList', () => {
  it('says how to take one when there is none', async () => {
    const { model } = await sandboxesModel([sandbox()], []);
    expect(show(model).textContent).toBe(
      'No snapshots. Use the camera button of a sandbox.'
    );
  });

  it('lists them by name', async () => {
    const snaps = ['a', 'b'].map(name => ({
      name,
      source: 'sk-alice',
      size: 1,
      created: 1
    }));
    const { model } = await sandboxesModel([sandbox()], snaps);
    show(model);
    const list = screen.getByRole('list', { name: 'Snapshots' });
    expect(
      Array.from(list.children).map(c => (c as HTMLElement).dataset.snapshot)
    ).toEqual(['a', 'b']);
  });

  it('says why a backend has none, and shows nothing while the server is away', async () => {
    const { server, model } = await sandboxesModel([sandbox()]);
    server.json(
      'GET',
      '/base/api/snapshots',
      { message: 'the local backend has no snapshots' },
      501
    );
    await model.update();
    const { container, unmount } = render(
      <SnapshotList model={model} trans={trans} />
    );
    expect(container.textContent).toBe('the local backend has no snapshots');
    unmount();
    server.down = true;
    await model.update();
    expect(show(model).textContent).toBe('–');
  });
});

// -- SnapshotsView ---------------------------------------------------------
describe('SnapshotsView', () => {
  it('draws the snapshots again on each change of the model', async () => {
    const { server, model } = await sandboxesModel([sandbox()], []);
    const view = new SnapshotsView(model, trans);
    Widget.attach(view, document.body);
    try {
      await waitFor(() =>
        expect(view.node.textContent).toMatch(/No snapshots/)
      );
      server.json('GET', '/base/api/snapshots', [
        { name: 'base', source: 'sk-alice', size: 1, created: 1 }
      ]);
      await model.update();
      await waitFor(() =>
        expect(view.node.querySelector('[data-snapshot="base"]')).not.toBeNull()
      );
    } finally {
      view.dispose();
    }
  });
});
