import { describe, expect, it, vi } from 'vitest';

import { SandboxAPI } from '../src/api';
import { FilesModel, SandboxesModel } from '../src/model';
import { FakeServer, jsonResponse, sandbox } from './server';

function setup(sandboxes: unknown[] = [sandbox()], snapshots: unknown = []) {
  const server = new FakeServer()
    .json('GET', '/base/api/sandboxes', sandboxes)
    .json('GET', '/base/api/snapshots', snapshots);
  const model = new SandboxesModel({
    api: new SandboxAPI(server.settings()),
    poll: false
  });
  return { server, model };
}

describe('SandboxesModel', () => {
  it('loads sandboxes and snapshots and signals the change', async () => {
    const { model } = setup(
      [sandbox()],
      [{ name: 's1', source: 'sk-alice', size: 10, created: 5 }]
    );
    let changes = 0;
    model.changed.connect(() => changes++);
    expect(model.loaded).toBe(false);
    await model.update();
    expect(model.loaded && model.error === null).toBe(true);
    expect(model.sandboxes.map(s => s.id)).toEqual(['sk-alice']);
    expect(model.snapshots.map(s => s.name)).toEqual(['s1']);
    expect(changes).toBe(1);
    expect(model.updated).toBeGreaterThan(0);
  });

  it('finds the sandbox of a kernel', async () => {
    const { model } = setup([
      sandbox(),
      sandbox({ id: 'sk-alice--t1', kernel_ids: ['k-2', 'k-3'] })
    ]);
    await model.update();
    expect(model.findByKernel('k-3')?.id).toBe('sk-alice--t1');
    expect(model.findByKernel('k-1')?.id).toBe('sk-alice');
    expect(model.findByKernel('k-9')).toBeUndefined();
    expect(model.findByKernel(null)).toBeUndefined();
  });

  it('shows no stale list when the server stops answering, and recovers', async () => {
    const { server, model } = setup();
    await model.update();
    server.down = true;
    await model.update();
    expect(model.error?.unreachable).toBe(true);
    expect(model.sandboxes).toEqual([]);
    await expect(model.update(true)).rejects.toThrow(/does not answer/);
    server.down = false;
    await model.update();
    expect(model.error).toBeNull();
    expect(model.sandboxes.length).toBe(1);
  });

  it('treats a backend without snapshots (501) as a note, not a failure', async () => {
    const server = new FakeServer()
      .json('GET', '/base/api/sandboxes', [sandbox({ backend: 'local' })])
      .json(
        'GET',
        '/base/api/snapshots',
        { message: 'the local backend has no snapshots' },
        501
      );
    const model = new SandboxesModel({
      api: new SandboxAPI(server.settings()),
      poll: false
    });
    await model.update();
    expect(model.error).toBeNull();
    expect(model.sandboxes.length).toBe(1);
    expect(model.snapshotsError?.message).toBe(
      'the local backend has no snapshots'
    );
  });

  it('marks a sandbox busy during an action, refreshes after, and passes errors on', async () => {
    const { server, model } = setup();
    await model.update();
    let busyDuring = false;
    server.on('POST', '/base/api/sandboxes/sk-alice/stop', () => {
      busyDuring = model.isBusy('sk-alice');
      return jsonResponse(sandbox({ state: 'stopped' }));
    });
    server.json('GET', '/base/api/sandboxes', [sandbox({ state: 'stopped' })]);
    await model.stop('sk-alice');
    expect(busyDuring).toBe(true);
    expect(model.isBusy('sk-alice')).toBe(false);
    expect(model.sandboxes[0].state).toBe('stopped');
    server.json(
      'DELETE',
      '/base/api/sandboxes/sk-alice',
      { message: 'sandbox sk-alice belongs to another user' },
      403
    );
    await expect(model.destroy('sk-alice')).rejects.toMatchObject({
      status: 403
    });
    expect(model.isBusy('sk-alice')).toBe(false);
  });

  it('polls with backoff after failures and stands by while hidden', async () => {
    const server = new FakeServer()
      .json('GET', '/base/api/sandboxes', [sandbox()])
      .json('GET', '/base/api/snapshots', []);
    server.down = true;
    // The poll picks each wait at random between the interval and three times the last
    // one: drawn at the top, the backoff is 20, 60, 180, 400 ms, not left to chance.
    const random = vi.spyOn(Math, 'random').mockReturnValue(0.999);
    const model = new SandboxesModel({
      api: new SandboxAPI(server.settings()),
      interval: 20,
      maxInterval: 400
    });
    await new Promise(resolve => setTimeout(resolve, 300));
    random.mockRestore();
    const failures = server.requests.length / 2;
    // 20 ms apart without backoff would be ~15 rounds in 300 ms; backoff makes it ~4
    // (a slow machine only makes it fewer).
    expect(failures).toBeGreaterThanOrEqual(2);
    expect(failures).toBeLessThan(8);
    expect(model.error?.unreachable).toBe(true);
    server.down = false;
    model.visible = false;
    await new Promise(resolve => setTimeout(resolve, 50));
    const before = server.requests.length;
    await new Promise(resolve => setTimeout(resolve, 200));
    expect(server.requests.length).toBe(before);
    model.visible = true;
    await new Promise(resolve => setTimeout(resolve, 100));
    expect(model.error).toBeNull();
    expect(model.sandboxes.length).toBe(1);
    model.dispose();
  });

  it('honours a new refresh interval at once, both ways', async () => {
    const server = new FakeServer()
      .json('GET', '/base/api/sandboxes', [sandbox()])
      .json('GET', '/base/api/snapshots', []);
    const sleep = (ms: number) =>
      new Promise(resolve => setTimeout(resolve, ms));
    const rounds = () =>
      server.requests.filter(r =>
        new URL(r.url).pathname.endsWith('/api/sandboxes')
      ).length;
    // Waits for what must happen, however slow the machine (the test's timeout bounds it).
    const until = async (done: () => boolean) => {
      while (!done()) {
        await sleep(10);
      }
    };
    // An hour apart: the first refresh, then nothing.
    const model = new SandboxesModel({
      api: new SandboxAPI(server.settings()),
      interval: 3_600_000
    });
    await until(() => rounds() >= 1);
    await sleep(100);
    expect(rounds()).toBe(1);
    expect(model.interval).toBe(3_600_000);
    // Down to 20 ms: refreshes follow without waiting out the hour.
    model.interval = 20;
    expect(model.interval).toBe(20);
    await until(() => rounds() >= 4);
    // Back up to an hour: no more refreshes.
    model.interval = 3_600_000;
    await sleep(50);
    const settled = rounds();
    await sleep(300);
    expect(rounds()).toBe(settled);
    model.dispose();
  });

  it('asks the panel to reveal a sandbox', () => {
    const { model } = setup();
    const revealed: string[] = [];
    model.revealRequested.connect((_, id) => revealed.push(id));
    model.reveal('sk-alice');
    expect(revealed).toEqual(['sk-alice']);
    expect(model.highlighted).toBe('sk-alice');
  });
});

describe('FilesModel', () => {
  it('browses folders (directories first) and uploads into the current one', async () => {
    const server = new FakeServer()
      .json('GET', '/base/api/sandboxes/sk-alice/files', {
        path: '',
        entries: [
          { name: 'b.txt', path: 'b.txt', type: 'file', size: 3, modified: 1 },
          {
            name: 'data',
            path: 'data',
            type: 'directory',
            size: 0,
            modified: 1
          },
          { name: 'a.txt', path: 'a.txt', type: 'file', size: 3, modified: 1 }
        ]
      })
      .json(
        'PUT',
        '/base/api/sandboxes/sk-alice/files/data/new.csv',
        { path: 'data/new.csv', size: 4 },
        201
      );
    const files = new FilesModel(new SandboxAPI(server.settings()));
    await files.open('sk-alice');
    expect(files.entries.map(e => e.name)).toEqual(['data', 'a.txt', 'b.txt']);
    await files.open('sk-alice', 'data/');
    expect(files.path).toBe('data');
    expect(files.parent).toBe('');
    const file = new File(['x,y\n'], 'new.csv');
    await files.upload([file]);
    const put = server.requests.find(r => r.method === 'PUT');
    expect(put?.url).toBe(
      'http://lab.test/base/api/sandboxes/sk-alice/files/data/new.csv'
    );
    expect(put?.body).toBe('x,y\n');
    expect(files.uploads).toEqual([]);
  });

  it('leaves out hidden names, as set, without asking the server again', async () => {
    const entry = (name: string, type = 'file') => ({
      name,
      path: name,
      type,
      size: 1,
      modified: 1
    });
    const server = new FakeServer().json(
      'GET',
      '/base/api/sandboxes/sk-alice/files',
      {
        path: '',
        entries: [
          entry('.ipynb_checkpoints', 'directory'),
          entry('__pycache__', 'directory'),
          entry('.bashrc'),
          entry('notes.txt~'),
          entry('hello.txt')
        ]
      }
    );
    const files = new FilesModel(new SandboxAPI(server.settings()));
    await files.open('sk-alice');
    expect(files.entries.map(e => e.name)).toEqual(['hello.txt']);
    expect(files.hiddenCount).toBe(4);
    let changes = 0;
    files.changed.connect(() => changes++);
    const before = server.requests.length;
    files.setHidden({ showHidden: true });
    expect(files.entries.map(e => e.name)).toEqual(['.bashrc', 'hello.txt']);
    files.setHidden({ showHidden: true, patterns: [] });
    expect(files.entries.map(e => e.name)).toEqual([
      '__pycache__',
      '.ipynb_checkpoints',
      '.bashrc',
      'hello.txt',
      'notes.txt~'
    ]);
    expect(files.hiddenCount).toBe(0);
    expect(changes).toBe(2);
    expect(server.requests.length).toBe(before);
  });

  it('keeps the error of a folder it cannot list', async () => {
    const server = new FakeServer().json(
      'GET',
      '/base/api/sandboxes/sk-alice/files',
      { message: "bad path '../x': it resolves outside the workspace" },
      400
    );
    const files = new FilesModel(new SandboxAPI(server.settings()));
    await files.open('sk-alice', '../x');
    expect(files.error?.status).toBe(400);
    expect(files.entries).toEqual([]);
  });
});
