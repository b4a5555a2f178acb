/**
 * The REST client of the sandbox-kernel server extension (jupyter_ext/openapi.yaml).
 *
 * Every call goes through ServerConnection.makeRequest (base URL, token, XSRF);
 * the one exception is an upload with progress, which needs XMLHttpRequest (fetch
 * reports no upload progress) and adds the same headers itself.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { nullTranslator, TranslationBundle } from '@jupyterlab/translation';

import { davUrl } from './format';

export type SandboxState = 'creating' | 'running' | 'stopped' | 'error';

export interface ISandbox {
  id: string;
  backend: string;
  scope: 'user' | 'thread';
  user: string;
  thread: string;
  state: SandboxState;
  image: string;
  flavor: string;
  created: number;
  /** While running: when it last started (epoch seconds; 0 when the backend can't tell). */
  started?: number;
  last_activity: number;
  kernels: number;
  kernel_ids: string[];
  /** Kernels running a cell right now (a task in another notebook or agent session). */
  busy_kernel_ids?: string[];
  /** Agents' interpreters (MCP `execute_code` sessions) in it, beside the kernels. */
  agent_sessions?: IAgentSession[];
  /** Why it differs from what its owner's settings make now ("" when it does not). */
  outdated?: string;
  /** When outdated only in its mapped folders: what its next start does about it. */
  remake?: string;
  /** The administrator's folders mapped into it when it was made. */
  volumes?: IVolumeMapping[];
  /** What the lifecycle policies will do to it next, and when (epoch seconds). */
  next?: { action: '' | 'stop' | 'destroy'; at: number; reason: string };
  /** What it may use: CPUs, memory and disk in bytes (disk: the flavor's size, when the backend gives it). */
  limits: {
    cpus?: number;
    memory?: number;
    disk?: number;
    pids?: number;
    network?: boolean;
  };
  /** What it uses now: CPU as a fraction of one CPU, memory and disk in bytes. */
  usage: { cpu?: number; memory?: number; disk?: number };
  isolation?: string;
  workspace?: string;
  /** The host folder mounted at the same path inside, where its cells run ("" or absent: none, cells run in /workspace). */
  work_folder?: string;
  snapshot?: string;
  exit_reason?: string;
}

/** One of the administrator's folders mapped into a sandbox (c.SandboxConfig.volumes). */
export interface IVolumeMapping {
  /** The host folder (or an engine's volume by name) it shows. */
  source: string;
  /** Where the sandbox sees it. */
  target: string;
  mode: 'ro' | 'rw';
  kind: 'host folder' | 'volume';
}

/** One named interpreter an agent keeps in a sandbox over MCP. */
export interface IAgentSession {
  id: string;
  name: string;
  busy: boolean;
}

export interface ISnapshot {
  name: string;
  backend: string;
  user: string;
  source: string;
  size: number;
  created: number;
  id?: string;
}

export interface IFileEntry {
  name: string;
  path: string;
  type: 'file' | 'directory' | string;
  size: number;
  modified: number;
}

export interface IFolder {
  path: string;
  entries: IFileEntry[];
}

/** A TCP port a process of a sandbox listens on, and its preview URL. */
export interface IListeningPort {
  port: number;
  /** What it listens on: 0.0.0.0, ::, 127.0.0.1... */
  address: string;
  /** False when it listens on the sandbox's loopback only (no preview reaches it). */
  reachable: boolean;
  /** The preview's path on this server. */
  url: string;
}

/** The listening ports of a sandbox (none while it is not running). */
export interface IPorts {
  sandbox_id: string;
  state: SandboxState;
  ports: IListeningPort[];
  /** Whether the server's engine serves previews at all; preview_note says why not. */
  preview: boolean;
  preview_note: string;
}

/**
 * An error of the sandbox API, with the server's message.
 *
 * ``status`` is the HTTP status, or 0 when the server could not be reached at all.
 */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
    this.name = 'ApiError';
  }

  get unreachable(): boolean {
    return this.status === 0;
  }
}

/** What a status means to a user, prefixed to the server's message. */
export function describeStatus(
  status: number,
  trans: TranslationBundle = nullTranslator.load('sandbox_kernel')
): string {
  switch (status) {
    case 0:
      return trans.__('Server unreachable');
    case 400:
      return trans.__('Bad request');
    case 403:
      return trans.__('Not allowed');
    case 404:
      return trans.__('Not found');
    case 409:
      return trans.__('Quota reached');
    case 413:
      return trans.__('File too large');
    case 501:
      return trans.__('Not supported by this backend');
    case 503:
      return trans.__('Sandbox engine unavailable');
    default:
      return trans.__('Error %1', status);
  }
}

function encodePath(path: string): string {
  return path
    .split('/')
    .filter(part => part !== '')
    .map(encodeURIComponent)
    .join('/');
}

export class SandboxAPI {
  constructor(serverSettings?: ServerConnection.ISettings) {
    this.serverSettings = serverSettings ?? ServerConnection.makeSettings();
  }

  readonly serverSettings: ServerConnection.ISettings;

  /** The absolute URL of an API path (segments already encoded). */
  url(path: string): string {
    return URLExt.join(this.serverSettings.baseUrl, 'api', path);
  }

  async request(path: string, init: RequestInit = {}): Promise<Response> {
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(
        this.url(path),
        init,
        this.serverSettings
      );
    } catch (error) {
      throw new ApiError(
        0,
        `the Jupyter server does not answer (${(error as Error).message})`
      );
    }
    if (!response.ok) {
      throw new ApiError(response.status, await errorMessage(response));
    }
    return response;
  }

  async json<T>(path: string, init: RequestInit = {}): Promise<T> {
    const response = await this.request(path, init);
    if (response.status === 204) {
      return undefined as T;
    }
    return (await response.json()) as T;
  }

  private post<T>(path: string, body?: unknown): Promise<T> {
    return this.json<T>(path, {
      method: 'POST',
      body: body === undefined ? '' : JSON.stringify(body),
      headers: { 'Content-Type': 'application/json' }
    });
  }

  // -- sandboxes --------------------------------------------------------------
  listSandboxes(): Promise<ISandbox[]> {
    return this.json<ISandbox[]>('sandboxes');
  }

  getSandbox(id: string): Promise<ISandbox> {
    return this.json<ISandbox>(`sandboxes/${encodeURIComponent(id)}`);
  }

  stop(id: string): Promise<ISandbox> {
    return this.post<ISandbox>(`sandboxes/${encodeURIComponent(id)}/stop`);
  }

  start(id: string): Promise<ISandbox> {
    return this.post<ISandbox>(`sandboxes/${encodeURIComponent(id)}/start`);
  }

  async destroy(id: string): Promise<void> {
    await this.request(`sandboxes/${encodeURIComponent(id)}`, {
      method: 'DELETE'
    });
  }

  startFromSnapshot(snapshot: string): Promise<ISandbox> {
    return this.post<ISandbox>('sandboxes', { snapshot });
  }

  // -- snapshots --------------------------------------------------------------
  listSnapshots(): Promise<ISnapshot[]> {
    return this.json<ISnapshot[]>('snapshots');
  }

  snapshot(id: string, name: string): Promise<ISnapshot> {
    return this.post<ISnapshot>(
      `sandboxes/${encodeURIComponent(id)}/snapshots`,
      { name }
    );
  }

  async deleteSnapshot(name: string): Promise<void> {
    await this.request(`snapshots/${encodeURIComponent(name)}`, {
      method: 'DELETE'
    });
  }

  /** The ports listening in a running sandbox (read from inside it, on request). */
  ports(id: string): Promise<IPorts> {
    return this.json<IPorts>(`sandboxes/${encodeURIComponent(id)}/ports`);
  }

  /** An absolute URL of a path the server gave (a port's preview, say). */
  absolute(path: string): string {
    return new URL(path, this.serverSettings.baseUrl).href;
  }

  // -- files ------------------------------------------------------------------
  listFiles(id: string, path = ''): Promise<IFolder> {
    const query = path ? `?path=${encodeURIComponent(path)}` : '';
    return this.json<IFolder>(
      `sandboxes/${encodeURIComponent(id)}/files${query}`
    );
  }

  /** Where the browser downloads a file from (streamed by the server). */
  fileUrl(id: string, path: string): string {
    return this.url(
      `sandboxes/${encodeURIComponent(id)}/files/${encodePath(path)}`
    );
  }

  /** The absolute WebDAV URL of a sandbox's whole workspace (see davUrl). */
  davUrl(id: string): string {
    return davUrl(this.serverSettings.baseUrl, id);
  }

  async deleteFile(id: string, path: string): Promise<void> {
    await this.request(
      `sandboxes/${encodeURIComponent(id)}/files/${encodePath(path)}`,
      { method: 'DELETE' }
    );
  }

  /**
   * Upload a file (raw body); ``onProgress`` gets the fraction sent.
   *
   * Without ``onProgress`` it goes through makeRequest like every other call.
   */
  async upload(
    id: string,
    path: string,
    data: Blob,
    onProgress?: (fraction: number) => void
  ): Promise<{ path: string; size: number }> {
    const route = `sandboxes/${encodeURIComponent(id)}/files/${encodePath(path)}`;
    if (!onProgress || typeof XMLHttpRequest === 'undefined') {
      return this.json(route, {
        method: 'PUT',
        body: data,
        headers: { 'Content-Type': 'application/octet-stream' }
      });
    }
    return new Promise((resolve, reject) => {
      const xhr = new XMLHttpRequest();
      xhr.open('PUT', this.url(route));
      for (const [name, value] of Object.entries(
        authHeaders(this.serverSettings)
      )) {
        xhr.setRequestHeader(name, value);
      }
      xhr.setRequestHeader('Content-Type', 'application/octet-stream');
      xhr.upload.onprogress = event => {
        if (event.lengthComputable && event.total > 0) {
          onProgress(event.loaded / event.total);
        }
      };
      xhr.onload = () => {
        if (xhr.status >= 200 && xhr.status < 300) {
          onProgress(1);
          resolve(JSON.parse(xhr.responseText));
        } else {
          reject(
            new ApiError(
              xhr.status,
              messageOf(xhr.responseText, xhr.statusText)
            )
          );
        }
      };
      xhr.onerror = () =>
        reject(
          new ApiError(0, 'the Jupyter server does not answer (upload failed)')
        );
      xhr.send(data);
    });
  }
}

/** The headers makeRequest would add: the token and the XSRF cookie. */
export function authHeaders(
  settings: ServerConnection.ISettings
): Record<string, string> {
  const headers: Record<string, string> = {};
  if (settings.token) {
    headers['Authorization'] = `token ${settings.token}`;
  }
  if (typeof document !== 'undefined' && document.cookie) {
    const match = document.cookie.match('\\b_xsrf=([^;]*)\\b');
    if (match) {
      headers['X-XSRFToken'] = match[1];
    }
  }
  return headers;
}

function messageOf(text: string, fallback: string): string {
  try {
    const body = JSON.parse(text);
    if (body && typeof body.message === 'string' && body.message) {
      return body.message;
    }
  } catch {
    // not JSON: a proxy's page, for instance
  }
  return fallback || 'the server gave no reason';
}

async function errorMessage(response: Response): Promise<string> {
  let text = '';
  try {
    text = await response.text();
  } catch {
    // body already gone
  }
  return messageOf(text, response.statusText);
}
