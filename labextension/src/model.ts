/**
 * Models behind the panel: what the server says about sandboxes and snapshots,
 * refreshed by a lumino Poll (backoff on failure, standby while the panel is hidden),
 * and the file browser of one sandbox. No DOM here, so they are unit-tested in node.
 */
import { IDisposable } from '@lumino/disposable';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { ApiError, IFileEntry, ISandbox, ISnapshot, SandboxAPI } from './api';
import { hiddenNameFilter, IHiddenOptions } from './hidden';

export interface IModelOptions {
  api: SandboxAPI;
  /** Milliseconds between refreshes while all is well. */
  interval?: number;
  /** Longest wait between refreshes after failures (backoff). */
  maxInterval?: number;
  /** Start polling at once (default true; tests call update() themselves). */
  poll?: boolean;
}

function asApiError(error: unknown): ApiError {
  return error instanceof ApiError
    ? error
    : new ApiError(-1, (error as Error)?.message ?? String(error));
}

export class SandboxesModel implements IDisposable {
  constructor(options: IModelOptions) {
    this.api = options.api;
    this._interval = Math.max(0, Math.round(options.interval ?? 5000));
    this._maxInterval = options.maxInterval ?? 60000;
    if (options.poll !== false) {
      this._poll = new Poll<void, unknown, 'rescheduled'>({
        auto: true,
        factory: () => this.update(true),
        frequency: this._frequency(),
        name: 'sandbox-kernel:sandboxes',
        standby: () => !this._visible || 'when-hidden'
      });
    }
  }

  readonly api: SandboxAPI;

  /** Milliseconds between refreshes while all is well. */
  get interval(): number {
    return this._interval;
  }

  /**
   * A new interval applies at once: the next refresh is one new interval from now,
   * not after what is left of the old one (a setting changed from 1 h to 5 s works now).
   */
  set interval(ms: number) {
    const value = Math.max(0, Math.round(ms));
    if (value === this._interval || this._isDisposed || !isFinite(value)) {
      return;
    }
    this._interval = value;
    if (this._poll) {
      this._poll.frequency = this._frequency();
      void this._poll.schedule({ interval: value, phase: 'rescheduled' });
    }
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Asks the panel to show (scroll to, highlight) one sandbox. */
  get revealRequested(): ISignal<this, string> {
    return this._revealRequested;
  }

  get sandboxes(): ReadonlyArray<ISandbox> {
    return this._sandboxes;
  }

  get snapshots(): ReadonlyArray<ISnapshot> {
    return this._snapshots;
  }

  /** Why the last refresh failed (null when it worked). */
  get error(): ApiError | null {
    return this._error;
  }

  /** Why snapshots are not listed (the backend has none: 501), or null. */
  get snapshotsError(): ApiError | null {
    return this._snapshotsError;
  }

  get loaded(): boolean {
    return this._loaded;
  }

  /** When the data shown was fetched (ms since epoch), 0 before the first success. */
  get updated(): number {
    return this._updated;
  }

  get highlighted(): string | null {
    return this._highlighted;
  }

  get visible(): boolean {
    return this._visible;
  }

  /** The panel tells the model whether anyone can see it: hidden means standby. */
  set visible(value: boolean) {
    if (value === this._visible) {
      return;
    }
    this._visible = value;
    if (value) {
      void this.refresh();
    }
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** Ids of sandboxes with an action in flight. */
  isBusy(id: string): boolean {
    return this._busy.has(id);
  }

  /** The sandbox a kernel (by id) is attached to, if any. */
  findByKernel(kernelId: string | null | undefined): ISandbox | undefined {
    if (!kernelId) {
      return undefined;
    }
    return this._sandboxes.find(s => (s.kernel_ids ?? []).includes(kernelId));
  }

  find(id: string): ISandbox | undefined {
    return this._sandboxes.find(s => s.id === id);
  }

  reveal(id: string): void {
    this._highlighted = id;
    this._revealRequested.emit(id);
    this._changed.emit();
  }

  /** Refresh now (through the poll when there is one, so its schedule restarts). */
  async refresh(): Promise<void> {
    if (this._poll) {
      await this._poll.refresh();
      await this._poll.tick;
    } else {
      await this.update();
    }
  }

  /**
   * Fetch sandboxes and snapshots. A failure keeps no stale list: the error is
   * what the panel shows. ``rethrow`` lets the poll see the failure and back off.
   */
  async update(rethrow = false): Promise<void> {
    try {
      const [sandboxes, snapshots] = await Promise.all([
        this.api.listSandboxes(),
        this.api.listSnapshots().then(
          list => ({ list, error: null as ApiError | null }),
          (error: unknown) => {
            const apiError = asApiError(error);
            if (apiError.status === 501) {
              return { list: [] as ISnapshot[], error: apiError };
            }
            throw apiError;
          }
        )
      ]);
      this._sandboxes = sandboxes;
      this._snapshots = snapshots.list;
      this._snapshotsError = snapshots.error;
      this._error = null;
      this._loaded = true;
      this._updated = Date.now();
    } catch (error) {
      this._error = asApiError(error);
      this._sandboxes = [];
      this._snapshots = [];
      this._loaded = true;
      if (rethrow) {
        this._changed.emit();
        throw this._error;
      }
    }
    this._changed.emit();
  }

  /**
   * Run an action on one sandbox (marked busy meanwhile), then refresh the lists.
   * Errors are thrown to the caller (the panel shows them as notifications).
   */
  async act<T>(id: string, action: () => Promise<T>): Promise<T> {
    this._busy.add(id);
    this._changed.emit();
    try {
      return await action();
    } finally {
      this._busy.delete(id);
      await this.refresh().catch(() => undefined);
    }
  }

  stop(id: string): Promise<ISandbox> {
    return this.act(id, () => this.api.stop(id));
  }

  start(id: string): Promise<ISandbox> {
    return this.act(id, () => this.api.start(id));
  }

  destroy(id: string): Promise<void> {
    return this.act(id, () => this.api.destroy(id));
  }

  snapshot(id: string, name: string): Promise<ISnapshot> {
    return this.act(id, () => this.api.snapshot(id, name));
  }

  deleteSnapshot(name: string): Promise<void> {
    return this.act(`snapshot:${name}`, () => this.api.deleteSnapshot(name));
  }

  startFromSnapshot(name: string): Promise<ISandbox> {
    return this.act(`snapshot:${name}`, () => this.api.startFromSnapshot(name));
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._poll?.dispose();
    Signal.clearData(this);
  }

  /** The poll's frequency: backoff after failures up to the longer of the ceiling and the interval. */
  private _frequency(): { interval: number; backoff: boolean; max: number } {
    return {
      interval: this._interval,
      backoff: true,
      max: Math.max(this._maxInterval, this._interval)
    };
  }

  private _poll: Poll<void, unknown, 'rescheduled'> | null = null;
  private _interval: number;
  private _maxInterval: number;
  private _changed = new Signal<this, void>(this);
  private _revealRequested = new Signal<this, string>(this);
  private _sandboxes: ISandbox[] = [];
  private _snapshots: ISnapshot[] = [];
  private _error: ApiError | null = null;
  private _snapshotsError: ApiError | null = null;
  private _loaded = false;
  private _updated = 0;
  private _visible = true;
  private _highlighted: string | null = null;
  private _busy = new Set<string>();
  private _isDisposed = false;
}

export interface IUpload {
  name: string;
  size: number;
  fraction: number;
}

/** The files of one sandbox's workspace, one folder at a time. */
export class FilesModel implements IDisposable {
  constructor(api: SandboxAPI, hidden: IHiddenOptions = {}) {
    this.api = api;
    this._isHidden = hiddenNameFilter(hidden);
  }

  readonly api: SandboxAPI;

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get sandboxId(): string | null {
    return this._sandboxId;
  }

  get path(): string {
    return this._path;
  }

  /** The folder's entries, directories first, without the hidden names. */
  get entries(): ReadonlyArray<IFileEntry> {
    return this._shown;
  }

  /** How many entries of the folder are left out (hidden names). */
  get hiddenCount(): number {
    return this._entries.length - this._shown.length;
  }

  /** Which names are left out (the settings' hidden files); applies to the folder shown. */
  setHidden(options: IHiddenOptions): void {
    this._isHidden = hiddenNameFilter(options);
    this._filter();
    this._changed.emit();
  }

  get error(): ApiError | null {
    return this._error;
  }

  get uploads(): ReadonlyArray<IUpload> {
    return this._uploads;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** Show ``path`` (relative to the workspace) of a sandbox. */
  async open(sandboxId: string | null, path = ''): Promise<void> {
    this._sandboxId = sandboxId;
    this._path = path.replace(/^\/+|\/+$/g, '');
    await this.reload();
  }

  async reload(): Promise<void> {
    if (!this._sandboxId) {
      this._entries = [];
      this._shown = [];
      this._error = null;
      this._changed.emit();
      return;
    }
    const wanted = [this._sandboxId, this._path].join('\0');
    try {
      const folder = await this.api.listFiles(this._sandboxId, this._path);
      if ([this._sandboxId, this._path].join('\0') !== wanted) {
        return; // the user moved on meanwhile
      }
      this._entries = [...folder.entries].sort((a, b) =>
        a.type === b.type
          ? a.name.localeCompare(b.name)
          : a.type === 'directory'
            ? -1
            : 1
      );
      this._error = null;
    } catch (error) {
      this._entries = [];
      this._error = asApiError(error);
    }
    this._filter();
    this._changed.emit();
  }

  private _filter(): void {
    this._shown = this._entries.filter(e => !this._isHidden(e.name));
  }

  /** The folder above the current one ('' at the top). */
  get parent(): string {
    const parts = this._path.split('/').filter(Boolean);
    parts.pop();
    return parts.join('/');
  }

  join(name: string): string {
    return this._path ? `${this._path}/${name}` : name;
  }

  downloadUrl(entry: IFileEntry): string {
    return this.api.fileUrl(this._sandboxId ?? '', entry.path);
  }

  /** Upload files into the current folder, one after the other, with progress. */
  async upload(files: ArrayLike<File>): Promise<void> {
    const sandboxId = this._sandboxId;
    if (!sandboxId) {
      throw new ApiError(400, 'open a sandbox first');
    }
    const list = Array.from(files);
    const entries = list.map(f => ({
      name: f.name,
      size: f.size,
      fraction: 0
    }));
    this._uploads = [...this._uploads, ...entries];
    this._changed.emit();
    try {
      for (let i = 0; i < list.length; i++) {
        const entry = entries[i];
        await this.api.upload(
          sandboxId,
          this.join(list[i].name),
          list[i],
          f => {
            entry.fraction = f;
            this._changed.emit();
          }
        );
      }
    } finally {
      this._uploads = this._uploads.filter(u => !entries.includes(u));
      await this.reload();
    }
  }

  async delete(entry: IFileEntry): Promise<void> {
    if (!this._sandboxId) {
      return;
    }
    await this.api.deleteFile(this._sandboxId, entry.path);
    await this.reload();
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    Signal.clearData(this);
  }

  private _sandboxId: string | null = null;
  private _path = '';
  private _entries: IFileEntry[] = [];
  private _shown: IFileEntry[] = [];
  private _isHidden: (name: string) => boolean;
  private _error: ApiError | null = null;
  private _uploads: IUpload[] = [];
  private _changed = new Signal<this, void>(this);
  private _isDisposed = false;
}
