import { describe, expect, it } from 'vitest';

import { ApiError, describeStatus, SandboxAPI } from '../src/api';
import { FakeServer, jsonResponse, sandbox } from './server';

describe('SandboxAPI', () => {
  it('lists sandboxes under the base URL with the token', async () => {
    const server = new FakeServer().json('GET', '/base/api/sandboxes', [
      sandbox()
    ]);
    const api = new SandboxAPI(server.settings());
    const list = await api.listSandboxes();
    expect(list.map(s => s.id)).toEqual(['sk-alice']);
    expect(server.requests[0].url).toBe('http://lab.test/base/api/sandboxes');
    expect(server.requests[0].headers.get('Authorization')).toBe(
      'token secret-token'
    );
  });

  it('sends actions to the documented routes', async () => {
    const server = new FakeServer()
      .json(
        'POST',
        '/base/api/sandboxes/sk-alice/stop',
        sandbox({ state: 'stopped' })
      )
      .json('POST', '/base/api/sandboxes/sk-alice/start', sandbox())
      .on('DELETE', '/base/api/sandboxes/sk-alice', () =>
        jsonResponse(null, 204)
      )
      .json(
        'POST',
        '/base/api/sandboxes/sk-alice/snapshots',
        { name: 'snap-1', size: 5 },
        201
      )
      .json(
        'POST',
        '/base/api/sandboxes',
        sandbox({ id: 'sk-alice--t1', scope: 'thread' }),
        201
      )
      .on('DELETE', '/base/api/snapshots/snap-1', () =>
        jsonResponse(null, 204)
      );
    const api = new SandboxAPI(server.settings());
    expect((await api.stop('sk-alice')).state).toBe('stopped');
    expect((await api.start('sk-alice')).state).toBe('running');
    await api.destroy('sk-alice');
    expect((await api.snapshot('sk-alice', 'snap-1')).name).toBe('snap-1');
    expect((await api.startFromSnapshot('snap-1')).id).toBe('sk-alice--t1');
    await api.deleteSnapshot('snap-1');
    const bodies = server.requests
      .filter(r => r.method === 'POST' && r.body)
      .map(r => JSON.parse(r.body));
    expect(bodies).toEqual([{ name: 'snap-1' }, { snapshot: 'snap-1' }]);
  });

  it('encodes file paths segment by segment', async () => {
    const server = new FakeServer()
      .json('GET', '/base/api/sandboxes/sk-alice/files', {
        path: 'a b',
        entries: []
      })
      .json(
        'PUT',
        '/base/api/sandboxes/sk-alice/files/a%20b/n%23te.txt',
        { path: 'a b/n#te.txt', size: 2 },
        201
      );
    const api = new SandboxAPI(server.settings());
    await api.listFiles('sk-alice', 'a b');
    expect(server.requests[0].url).toBe(
      'http://lab.test/base/api/sandboxes/sk-alice/files?path=a%20b'
    );
    const made = await api.upload('sk-alice', 'a b/n#te.txt', new Blob(['hi']));
    expect(made.size).toBe(2);
    expect(server.requests[1].body).toBe('hi');
    expect(api.fileUrl('sk-alice', '/a b/n#te.txt')).toBe(
      'http://lab.test/base/api/sandboxes/sk-alice/files/a%20b/n%23te.txt'
    );
  });

  it('gives the WebDAV URL of a sandbox under the same base URL', () => {
    const api = new SandboxAPI(new FakeServer().settings());
    expect(api.davUrl('sk-alice')).toBe(
      'http://lab.test/base/sandbox-kernel/dav/sk-alice/'
    );
    expect(api.davUrl('sk-alice--t 1')).toBe(
      'http://lab.test/base/sandbox-kernel/dav/sk-alice--t%201/'
    );
  });

  it.each([
    [403, 'sandbox sk-bob belongs to another user'],
    [404, "no sandbox with id 'sk-x'"],
    [409, 'quota max_sandboxes=2 reached'],
    [413, 'the file is 20 bytes; the limit is 10 bytes'],
    [501, 'the local backend cannot take snapshots']
  ])(
    'turns a %i into an ApiError with the server message',
    async (status, message) => {
      const server = new FakeServer().json(
        'GET',
        '/base/api/sandboxes',
        { message },
        status
      );
      const api = new SandboxAPI(server.settings());
      const error = await api.listSandboxes().catch(e => e);
      expect(error).toBeInstanceOf(ApiError);
      expect(error.status).toBe(status);
      expect(error.message).toBe(message);
      expect(describeStatus(status)).not.toMatch(/^Error/);
    }
  );

  it('falls back to the status text when the body is not JSON', async () => {
    const server = new FakeServer().on(
      'GET',
      '/base/api/sandboxes',
      () =>
        new Response('<html>bad gateway</html>', {
          status: 502,
          statusText: 'Bad Gateway'
        })
    );
    const error = await new SandboxAPI(server.settings())
      .listSandboxes()
      .catch(e => e);
    expect([error.status, error.message]).toEqual([502, 'Bad Gateway']);
  });

  it('reports an unreachable server as status 0', async () => {
    const server = new FakeServer();
    server.down = true;
    const error = await new SandboxAPI(server.settings())
      .listSandboxes()
      .catch(e => e);
    expect(error).toBeInstanceOf(ApiError);
    expect(error.unreachable).toBe(true);
    expect(error.message).toMatch(/does not answer/);
  });
});
