// @vitest-environment jsdom
/**
 * The Files section: a row, the breadcrumb, the body (listing, hidden names, drops)
 * and the widget's uploads.
 */
import { Widget } from '@lumino/widgets';
import { fireEvent, render, screen, waitFor } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import * as React from 'react';
import { afterEach, describe, expect, it, vi } from 'vitest';

import { IFileEntry, SandboxAPI } from '../../src/api';
import { Breadcrumbs } from '../../src/components/Breadcrumbs';
import { FileRow } from '../../src/components/FileRow';
import { FilesBody } from '../../src/components/FilesBody';
import { FilesView } from '../../src/components/FilesView';
import { FilesModel } from '../../src/model';
import { FakeServer } from '../server';
import {
  answerDialog,
  calls,
  filesModel,
  notifications,
  trans
} from './helpers';

// -- FileRow ---------------------------------------------------------------
const FILE: IFileEntry = {
  name: 'measurements_2025-11-26_run-3.csv',
  path: 'data/measurements_2025-11-26_run-3.csv',
  type: 'file',
  size: 1536,
  modified: 1
};
const FOLDER: IFileEntry = {
  name: 'data',
  path: 'data',
  type: 'directory',
  size: 0,
  modified: 1
};

describe('FileRow', () => {
  it('shows a file’s whole name, size, download link and delete button', async () => {
    const { files } = await filesModel([FILE]);
    const { container } = render(
      <FileRow entry={FILE} files={files} trans={trans} />
    );
    const row = container.querySelector('li') as HTMLElement;
    expect(row.dataset.path).toBe(FILE.path);
    expect(row.querySelector('.jp-SandboxPanel-fileText')?.textContent).toBe(
      FILE.name
    );
    expect(row.querySelector('.jp-SandboxPanel-size')?.textContent).toBe(
      '1.50\u00a0KiB'
    );
    const download = screen.getByRole('link', {
      name: `Download ${FILE.name}`
    });
    expect(download.getAttribute('href')).toBe(
      'http://lab.test/base/api/sandboxes/sk-alice/files/data/measurements_2025-11-26_run-3.csv'
    );
    expect(download.getAttribute('download')).toBe(FILE.name);
    screen.getByRole('button', { name: `Delete ${FILE.name}` });
  });

  it('deletes a file after the user agrees, then lists the folder again', async () => {
    const { server, files } = await filesModel([FILE]);
    server.on(
      'DELETE',
      `/base/api/sandboxes/sk-alice/files/${FILE.path}`,
      () => new Response(null, { status: 204 })
    );
    render(<FileRow entry={FILE} files={files} trans={trans} />);
    await userEvent.click(
      screen.getByRole('button', { name: `Delete ${FILE.name}` })
    );
    await answerDialog(`Delete ${FILE.path}?`, true);
    await waitFor(() =>
      expect(calls(server).slice(-2)).toEqual([
        `DELETE /base/api/sandboxes/sk-alice/files/${FILE.path}`,
        'GET /base/api/sandboxes/sk-alice/files'
      ])
    );
  });

  it('opens a folder on click, and offers no file actions for it', async () => {
    const { server, files } = await filesModel([FOLDER]);
    render(<FileRow entry={FOLDER} files={files} trans={trans} />);
    expect(screen.queryByRole('link')).toBeNull();
    expect(screen.getAllByRole('button').length).toBe(1);
    await userEvent.click(screen.getByRole('button', { name: 'data/' }));
    await waitFor(() => expect(files.path).toBe('data'));
    expect(server.requests.at(-1)?.url).toBe(
      'http://lab.test/base/api/sandboxes/sk-alice/files?path=data'
    );
  });
});

// -- Breadcrumbs -----------------------------------------------------------
describe('Breadcrumbs', () => {
  it('shows the folder as parts, each with its full path, each opening its folder', async () => {
    const { files } = await filesModel([]);
    await files.open('sk-alice', 'data/2025/raw');
    render(<Breadcrumbs files={files} trans={trans} />);
    const nav = screen.getByRole('navigation', { name: 'Folder' });
    const parts = Array.from(nav.querySelectorAll('button'));
    expect(parts.map(b => b.textContent)).toEqual([
      'sk-alice:/workspace',
      'data',
      '2025',
      'raw'
    ]);
    expect(parts.map(b => b.title)).toEqual([
      'sk-alice:/workspace',
      '/workspace/data',
      '/workspace/data/2025',
      '/workspace/data/2025/raw'
    ]);
    await userEvent.click(parts[1]);
    await waitFor(() => expect(files.path).toBe('data'));
    await userEvent.click(parts[0]);
    await waitFor(() => expect(files.path).toBe(''));
  });
});

// -- FilesBody -------------------------------------------------------------
const entry = (name: string, type = 'file') => ({
  name,
  path: name,
  type,
  size: 10,
  modified: 1
});

describe('FilesBody', () => {
  it('says how to choose a sandbox before one is chosen', () => {
    const files = new FilesModel(new SandboxAPI(new FakeServer().settings()));
    const { container } = render(
      <FilesBody files={files} trans={trans} onUpload={() => undefined} />
    );
    expect(container.textContent).toBe('Choose “Browse files” on a sandbox.');
  });

  it('lists folders first, leaves hidden names out and says how many', async () => {
    const { files } = await filesModel([
      entry('train.py'),
      entry('.env'),
      entry('__pycache__', 'directory'),
      entry('data', 'directory')
    ]);
    render(
      <FilesBody files={files} trans={trans} onUpload={() => undefined} />
    );
    const list = screen.getByRole('list', { name: 'Files' });
    expect(
      Array.from(list.querySelectorAll('[data-path]')).map(
        e => (e as HTMLElement).dataset.path
      )
    ).toEqual(['data', 'train.py']);
    expect(list.querySelector('.jp-SandboxPanel-hiddenNote')?.textContent).toBe(
      '2 hidden items'
    );
    screen.getByRole('navigation', { name: 'Folder' });
  });

  it('gets the plural right for one hidden item, and says a folder is empty', async () => {
    const one = await filesModel([entry('.env')]);
    const { unmount } = render(
      <FilesBody files={one.files} trans={trans} onUpload={() => undefined} />
    );
    expect(screen.getByRole('list').textContent).toBe(
      'Nothing to show. Drop files here to upload.1 hidden item'
    );
    unmount();
    const none = await filesModel([]);
    render(
      <FilesBody files={none.files} trans={trans} onUpload={() => undefined} />
    );
    expect(screen.getByRole('list').textContent).toBe(
      'Empty folder. Drop files here to upload.'
    );
  });

  it('shows why a folder cannot be listed', async () => {
    const { server, files } = await filesModel([]);
    server.json(
      'GET',
      '/base/api/sandboxes/sk-alice/files',
      { message: 'not a folder: notes.txt' },
      400
    );
    await files.reload();
    render(
      <FilesBody files={files} trans={trans} onUpload={() => undefined} />
    );
    expect(screen.getByRole('alert').textContent).toBe(
      'Bad requestnot a folder: notes.txt'
    );
    expect(screen.queryByRole('list')).toBeNull();
  });

  it('uploads what is dropped on it, and marks itself while files are dragged over', async () => {
    const { files } = await filesModel([]);
    const onUpload = vi.fn();
    const { container } = render(
      <FilesBody files={files} trans={trans} onUpload={onUpload} />
    );
    const zone = container.querySelector(
      '.jp-SandboxPanel-dropzone'
    ) as HTMLElement;
    const dropped = [new File(['hi'], 'notes.txt')];
    const dataTransfer = { files: dropped, dropEffect: 'none' };
    fireEvent.dragOver(zone, { dataTransfer });
    expect(zone.className).toContain('jp-mod-dropTarget');
    expect(dataTransfer.dropEffect).toBe('copy');
    fireEvent.drop(zone, { dataTransfer });
    expect(zone.className).not.toContain('jp-mod-dropTarget');
    expect(onUpload).toHaveBeenCalledWith(dropped);
  });
});

// -- FilesView -------------------------------------------------------------
let view: FilesView | null = null;

afterEach(() => {
  view?.dispose();
  view = null;
  vi.unstubAllGlobals();
});

describe('FilesView', () => {
  it('uploads into the folder shown and lists it again', async () => {
    // Without XMLHttpRequest the API client sends through fetch, i.e. the fake server
    // (jsdom's XMLHttpRequest would try the network).
    vi.stubGlobal('XMLHttpRequest', undefined);
    const { server, files } = await filesModel([]);
    server.json('PUT', '/base/api/sandboxes/sk-alice/files/notes.txt', {
      path: 'notes.txt',
      size: 2
    });
    view = new FilesView(files, trans);
    Widget.attach(view, document.body);
    await waitFor(() => expect(view!.node.textContent).toMatch(/Empty folder/));
    view.upload([new File(['hi'], 'notes.txt')]);
    await waitFor(() =>
      expect(calls(server).slice(-2)).toEqual([
        'PUT /base/api/sandboxes/sk-alice/files/notes.txt',
        'GET /base/api/sandboxes/sk-alice/files'
      ])
    );
  });

  it('says when an upload fails', async () => {
    vi.stubGlobal('XMLHttpRequest', undefined);
    const { server, files } = await filesModel([]);
    server.json(
      'PUT',
      '/base/api/sandboxes/sk-alice/files/big.bin',
      { message: 'larger than the 1 GiB upload limit' },
      413
    );
    view = new FilesView(files, trans);
    view.upload([new File(['x'], 'big.bin')]);
    await waitFor(() =>
      expect(notifications('error')).toEqual([
        'Upload failed. File too large: larger than the 1 GiB upload limit'
      ])
    );
  });

  it('opens the file picker only once a sandbox is chosen', async () => {
    const clicked = vi.spyOn(HTMLInputElement.prototype, 'click');
    const { files } = await filesModel([]);
    view = new FilesView(files, trans);
    view.pickFiles();
    expect(clicked).toHaveBeenCalledTimes(1);
    const input = clicked.mock.contexts[0] as HTMLInputElement;
    expect(input.type).toBe('file');
    expect(input.multiple).toBe(true);
    await files.open(null);
    view.pickFiles();
    expect(clicked).toHaveBeenCalledTimes(1);
    clicked.mockRestore();
  });
});
