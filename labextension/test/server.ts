/**
 * A stand-in for the Jupyter server at the fetch level: the real ServerConnection
 * (settings, makeRequest, headers) runs, and only the network answer is scripted.
 */
import { ServerConnection } from '@jupyterlab/services';

export interface IRecorded {
  method: string;
  url: string;
  headers: Headers;
  body: string;
}

export type Route = (request: IRecorded) => Response | Promise<Response>;

export class FakeServer {
  readonly requests: IRecorded[] = [];
  routes = new Map<string, Route>();
  down = false;

  on(method: string, path: string, route: Route): this {
    this.routes.set(`${method} ${path}`, route);
    return this;
  }

  json(method: string, path: string, body: unknown, status = 200): this {
    return this.on(method, path, () => jsonResponse(body, status));
  }

  settings(): ServerConnection.ISettings {
    return ServerConnection.makeSettings({
      baseUrl: 'http://lab.test/base/',
      token: 'secret-token',
      fetch: (input: RequestInfo, init?: RequestInit) =>
        this.handle(input, init)
    });
  }

  private async handle(
    input: RequestInfo,
    init?: RequestInit
  ): Promise<Response> {
    const request = new Request(input, init);
    const recorded: IRecorded = {
      method: request.method,
      // makeRequest adds a cache-busting timestamp to every URL: leave it out.
      url: request.url.replace(/[?&]\d{10,}$/, ''),
      headers: request.headers,
      body: await request.text()
    };
    this.requests.push(recorded);
    if (this.down) {
      throw new TypeError('fetch failed');
    }
    const url = new URL(request.url);
    const route = this.routes.get(`${request.method} ${url.pathname}`);
    if (!route) {
      return jsonResponse(
        { message: `no route ${request.method} ${url.pathname}` },
        404
      );
    }
    return route(recorded);
  }
}

export function jsonResponse(body: unknown, status = 200): Response {
  return new Response(status === 204 ? null : JSON.stringify(body), {
    status,
    headers: { 'Content-Type': 'application/json' }
  });
}

export function sandbox(overrides: Record<string, unknown> = {}): any {
  return {
    id: 'sk-alice',
    backend: 'docker',
    scope: 'user',
    user: 'alice',
    thread: '',
    state: 'running',
    image: 'python:3.12-slim',
    flavor: 'small',
    created: 1000,
    last_activity: 2000,
    kernels: 1,
    kernel_ids: ['k-1'],
    limits: { cpus: 1, memory: 1 << 30, pids: 512 },
    usage: { cpu: 0.25, memory: 256 << 20 },
    snapshot: '',
    ...overrides
  };
}
