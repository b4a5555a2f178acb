/** React views of the panel's sections; every action goes through the models. */
import {
  Dialog,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import {
  deleteIcon,
  downloadIcon,
  fileIcon,
  fileUploadIcon,
  folderIcon,
  ReactWidget,
  runIcon,
  stopIcon,
  UseSignal
} from '@jupyterlab/ui-components';
import * as React from 'react';

import {
  ApiError,
  describeStatus,
  IFileEntry,
  ISandbox,
  ISnapshot
} from './api';
import {
  lifetime,
  formatAgo,
  formatBytes,
  formatCpu,
  formatMemory,
  kernelsLabel,
  memoryFraction,
  nextLabel,
  originLabel,
  scopeLabel
} from './format';
import { cameraIcon, filesIcon, sandboxIcon } from './icons';
import { FilesModel, SandboxesModel } from './model';

/** Show an API error as a JupyterLab notification, with the server's message. */
export function notifyError(what: string, error: unknown): void {
  const apiError =
    error instanceof ApiError
      ? error
      : new ApiError(-1, String((error as Error)?.message ?? error));
  const prefix =
    apiError.status >= 0 ? `${describeStatus(apiError.status)}: ` : '';
  Notification.error(`${what} failed. ${prefix}${apiError.message}`, {
    autoClose: 8000
  });
}

export async function askSnapshot(
  model: SandboxesModel,
  sandbox: ISandbox
): Promise<void> {
  const stamp = new Date().toISOString().slice(0, 16).replace(/[-:T]/g, '');
  const result = await InputDialog.getText({
    title: `Snapshot ${sandbox.id}`,
    label:
      'Snapshot name (lowercase letters, digits, ".", "_" or "-"). The workspace is not included.',
    text: `${sandbox.id.replace(/^sk-/, '').slice(0, 40)}-${stamp}`.toLowerCase(),
    okLabel: 'Snapshot'
  });
  if (!result.button.accept || !result.value) {
    return;
  }
  const name = result.value.trim();
  try {
    const snap = await model.snapshot(sandbox.id, name);
    Notification.success(
      `Snapshot ${snap.name} saved (${formatBytes(snap.size)})`,
      { autoClose: 4000 }
    );
  } catch (error) {
    notifyError(`Snapshot of ${sandbox.id}`, error);
  }
}

export async function confirmDestroy(
  model: SandboxesModel,
  sandbox: ISandbox
): Promise<void> {
  const kernels = sandbox.kernels
    ? ` ${sandbox.kernels} kernel(s) using it will lose their variables.`
    : '';
  const result = await showDialog({
    title: `Destroy ${sandbox.id}?`,
    body:
      'The sandbox and what was installed in it outside /workspace are removed. ' +
      `Your files in /workspace are kept.${kernels}`,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Destroy' })]
  });
  if (!result.button.accept) {
    return;
  }
  try {
    await model.destroy(sandbox.id);
    Notification.success(`Destroyed ${sandbox.id}; its workspace is kept`, {
      autoClose: 4000
    });
  } catch (error) {
    notifyError(`Destroying ${sandbox.id}`, error);
  }
}

function ActionButton(props: {
  icon: typeof runIcon;
  label: string;
  onClick: () => void;
  disabled?: boolean;
  className?: string;
}): JSX.Element {
  return (
    <button
      type="button"
      className={`jp-SandboxPanel-action jp-mod-styled ${props.className ?? ''}`}
      title={props.label}
      aria-label={props.label}
      disabled={props.disabled}
      onClick={props.onClick}
    >
      <props.icon.react tag="span" className="jp-SandboxPanel-actionIcon" />
    </button>
  );
}

function StateDot({ state }: { state: string }): JSX.Element {
  return (
    <span
      className={`jp-SandboxPanel-dot jp-SandboxPanel-dot-${state}`}
      role="img"
      aria-label={state}
      title={state}
    />
  );
}

function SandboxCard(props: {
  sandbox: ISandbox;
  model: SandboxesModel;
  files: FilesModel;
  onBrowse: (id: string) => void;
}): JSX.Element {
  const { sandbox: s, model } = props;
  const busy = model.isBusy(s.id);
  const highlighted = model.highlighted === s.id;
  const fraction = memoryFraction(s);
  const act = (what: string, fn: () => Promise<unknown>) => () => {
    fn().catch(error => notifyError(`${what} ${s.id}`, error));
  };
  return (
    <li
      className={`jp-SandboxPanel-card${highlighted ? ' jp-mod-highlighted' : ''}${busy ? ' jp-mod-busy' : ''}`}
      data-sandbox-id={s.id}
      tabIndex={0}
      aria-label={`sandbox ${s.id}, ${s.state}`}
    >
      <div className="jp-SandboxPanel-cardHeader">
        <StateDot state={s.state} />
        <span className="jp-SandboxPanel-name" title={s.id}>
          {s.id}
        </span>
        <span className="jp-SandboxPanel-state">
          {busy ? 'working…' : s.state}
        </span>
      </div>
      <dl className="jp-SandboxPanel-facts">
        <dt>Scope</dt>
        <dd title={s.thread || s.user}>{scopeLabel(s)}</dd>
        <dt>From</dt>
        <dd title={originLabel(s)}>{originLabel(s)}</dd>
        <dt>Flavor</dt>
        <dd>
          {s.flavor || '–'} · {s.backend}
        </dd>
        <dt>Time</dt>
        <dd title={`created ${formatAgo(s.created)}`}>
          {lifetime(s)} · active {formatAgo(s.last_activity)}
        </dd>
        <dt>CPU</dt>
        <dd className="jp-SandboxPanel-cpu">{formatCpu(s)}</dd>
        <dt>Memory</dt>
        <dd className="jp-SandboxPanel-memory">
          {formatMemory(s)}
          {fraction !== null && (
            <span className="jp-SandboxPanel-meter" aria-hidden="true">
              <span style={{ width: `${Math.round(fraction * 100)}%` }} />
            </span>
          )}
        </dd>
        <dt>Kernels</dt>
        <dd className="jp-SandboxPanel-kernels">{kernelsLabel(s)}</dd>
        {nextLabel(s) && (
          <>
            <dt>Next</dt>
            <dd className="jp-SandboxPanel-next" title={s.next?.reason}>
              {nextLabel(s)}
            </dd>
          </>
        )}
        {s.outdated && (
          <>
            <dt>Outdated</dt>
            <dd className="jp-SandboxPanel-outdated" title={s.outdated}>
              {s.outdated}; destroy it to remake it (the workspace is kept)
            </dd>
          </>
        )}
        {s.exit_reason && (
          <>
            <dt>Stopped</dt>
            <dd>{s.exit_reason}</dd>
          </>
        )}
      </dl>
      <div className="jp-SandboxPanel-actions">
        {s.state === 'running' ? (
          <ActionButton
            icon={stopIcon}
            label={`Stop ${s.id}`}
            disabled={busy}
            onClick={act('Stopping', () => model.stop(s.id))}
          />
        ) : (
          <ActionButton
            icon={runIcon}
            label={`Start ${s.id}`}
            disabled={busy}
            onClick={act('Starting', () => model.start(s.id))}
          />
        )}
        <ActionButton
          icon={filesIcon}
          label={`Browse files of ${s.id}`}
          onClick={() => props.onBrowse(s.id)}
        />
        <ActionButton
          icon={cameraIcon}
          label={`Snapshot ${s.id}`}
          disabled={busy}
          onClick={() => void askSnapshot(model, s)}
        />
        <ActionButton
          icon={deleteIcon}
          label={`Destroy ${s.id}`}
          disabled={busy}
          className="jp-mod-danger"
          onClick={() => void confirmDestroy(model, s)}
        />
      </div>
    </li>
  );
}

function ErrorBanner({ error }: { error: ApiError }): JSX.Element {
  return (
    <div className="jp-SandboxPanel-error" role="alert">
      <strong>
        {error.unreachable
          ? 'Server unreachable'
          : describeStatus(error.status)}
      </strong>
      <span>{error.message}</span>
      <span className="jp-SandboxPanel-hint">
        Retrying with backoff; the list is hidden until it answers.
      </span>
    </div>
  );
}

export class SandboxesView extends ReactWidget {
  constructor(
    readonly model: SandboxesModel,
    readonly files: FilesModel,
    readonly onBrowse: (id: string) => void
  ) {
    super();
    this.addClass('jp-SandboxPanel-sandboxes');
    model.revealRequested.connect((_, id) => {
      requestAnimationFrame(() => {
        const card = this.node.querySelector(
          `[data-sandbox-id="${CSS.escape(id)}"]`
        ) as HTMLElement | null;
        card?.scrollIntoView({ block: 'nearest' });
        card?.focus();
      });
    });
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this.model.changed}>
        {() => {
          const m = this.model;
          if (m.error) {
            return <ErrorBanner error={m.error} />;
          }
          if (!m.loaded) {
            return <div className="jp-SandboxPanel-empty">Loading…</div>;
          }
          if (m.sandboxes.length === 0) {
            return (
              <div className="jp-SandboxPanel-empty">
                No sandboxes. Run a cell in a notebook with the “Python 3
                (sandbox)” kernel to make one.
              </div>
            );
          }
          return (
            <ul className="jp-SandboxPanel-list" aria-label="Sandboxes">
              {m.sandboxes.map(s => (
                <SandboxCard
                  key={s.id}
                  sandbox={s}
                  model={m}
                  files={this.files}
                  onBrowse={this.onBrowse}
                />
              ))}
            </ul>
          );
        }}
      </UseSignal>
    );
  }
}

function SnapshotRow(props: {
  snapshot: ISnapshot;
  model: SandboxesModel;
}): JSX.Element {
  const { snapshot: snap, model } = props;
  const busy = model.isBusy(`snapshot:${snap.name}`);
  const start = () => {
    model
      .startFromSnapshot(snap.name)
      .then(s => {
        Notification.success(`Started ${s.id} from snapshot ${snap.name}`, {
          autoClose: 4000
        });
        model.reveal(s.id);
      })
      .catch(error =>
        notifyError(`Starting a sandbox from ${snap.name}`, error)
      );
  };
  const remove = async () => {
    const result = await showDialog({
      title: `Delete snapshot ${snap.name}?`,
      body: 'Sandboxes started from it must be destroyed first.',
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
    });
    if (result.button.accept) {
      model
        .deleteSnapshot(snap.name)
        .catch(error => notifyError(`Deleting snapshot ${snap.name}`, error));
    }
  };
  return (
    <li
      className={`jp-SandboxPanel-snapshot${busy ? ' jp-mod-busy' : ''}`}
      data-snapshot={snap.name}
      tabIndex={0}
    >
      <div className="jp-SandboxPanel-snapshotText">
        <span className="jp-SandboxPanel-name">{snap.name}</span>
        <span className="jp-SandboxPanel-sub">
          from {snap.source || '?'} · {formatBytes(snap.size)} ·{' '}
          {formatAgo(snap.created)}
        </span>
      </div>
      <div className="jp-SandboxPanel-actions">
        <ActionButton
          icon={runIcon}
          label={`Start a new sandbox from ${snap.name}`}
          disabled={busy}
          onClick={start}
        />
        <ActionButton
          icon={deleteIcon}
          label={`Delete snapshot ${snap.name}`}
          disabled={busy}
          className="jp-mod-danger"
          onClick={() => void remove()}
        />
      </div>
    </li>
  );
}

export class SnapshotsView extends ReactWidget {
  constructor(readonly model: SandboxesModel) {
    super();
    this.addClass('jp-SandboxPanel-snapshots');
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this.model.changed}>
        {() => {
          const m = this.model;
          if (m.error) {
            return <div className="jp-SandboxPanel-empty">–</div>;
          }
          if (m.snapshotsError) {
            return (
              <div className="jp-SandboxPanel-empty">
                {m.snapshotsError.message}
              </div>
            );
          }
          if (m.snapshots.length === 0) {
            return (
              <div className="jp-SandboxPanel-empty">
                No snapshots. Use the camera button of a sandbox.
              </div>
            );
          }
          return (
            <ul className="jp-SandboxPanel-list" aria-label="Snapshots">
              {m.snapshots.map(s => (
                <SnapshotRow key={s.name} snapshot={s} model={m} />
              ))}
            </ul>
          );
        }}
      </UseSignal>
    );
  }
}

function FileRow(props: { entry: IFileEntry; files: FilesModel }): JSX.Element {
  const { entry, files } = props;
  const isDir = entry.type === 'directory';
  const remove = async () => {
    const result = await showDialog({
      title: `Delete ${entry.path}?`,
      body: 'The file is removed from the workspace.',
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
    });
    if (result.button.accept) {
      files
        .delete(entry)
        .catch(error => notifyError(`Deleting ${entry.path}`, error));
    }
  };
  return (
    <li className="jp-SandboxPanel-file" data-path={entry.path}>
      {isDir ? (
        <button
          type="button"
          className="jp-SandboxPanel-fileName jp-SandboxPanel-linkButton"
          onClick={() => void files.open(files.sandboxId, entry.path)}
        >
          <folderIcon.react tag="span" className="jp-SandboxPanel-fileIcon" />
          {entry.name}/
        </button>
      ) : (
        <span className="jp-SandboxPanel-fileName">
          <fileIcon.react tag="span" className="jp-SandboxPanel-fileIcon" />
          {entry.name}
        </span>
      )}
      <span className="jp-SandboxPanel-sub">
        {isDir ? '' : formatBytes(entry.size)}
      </span>
      {!isDir && (
        <a
          className="jp-SandboxPanel-action jp-mod-styled"
          href={files.downloadUrl(entry)}
          download={entry.name}
          title={`Download ${entry.name}`}
          aria-label={`Download ${entry.name}`}
        >
          <downloadIcon.react
            tag="span"
            className="jp-SandboxPanel-actionIcon"
          />
        </a>
      )}
      {!isDir && (
        <ActionButton
          icon={deleteIcon}
          label={`Delete ${entry.name}`}
          className="jp-mod-danger"
          onClick={() => void remove()}
        />
      )}
    </li>
  );
}

export class FilesView extends ReactWidget {
  constructor(readonly files: FilesModel) {
    super();
    this.addClass('jp-SandboxPanel-files');
  }

  /** Open the system file picker and upload what is chosen. */
  pickFiles(): void {
    const input = document.createElement('input');
    input.type = 'file';
    input.multiple = true;
    input.onchange = () => {
      if (input.files && input.files.length) {
        this.upload(input.files);
      }
    };
    input.click();
  }

  upload(list: FileList | File[]): void {
    this.files
      .upload(Array.from(list))
      .catch(error => notifyError('Upload', error));
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this.files.changed}>
        {() => <FilesBody view={this} />}
      </UseSignal>
    );
  }
}

function FilesBody({ view }: { view: FilesView }): JSX.Element {
  const files = view.files;
  const [over, setOver] = React.useState(false);
  if (!files.sandboxId) {
    return (
      <div className="jp-SandboxPanel-empty">
        Choose “Browse files” on a sandbox.
      </div>
    );
  }
  const crumbs = files.path ? files.path.split('/') : [];
  return (
    <div
      className={`jp-SandboxPanel-dropzone${over ? ' jp-mod-dropTarget' : ''}`}
      onDragOver={event => {
        event.preventDefault();
        event.stopPropagation();
        event.dataTransfer.dropEffect = 'copy';
        setOver(true);
      }}
      onDragLeave={() => setOver(false)}
      onDrop={event => {
        event.preventDefault();
        event.stopPropagation();
        setOver(false);
        if (event.dataTransfer.files.length) {
          view.upload(event.dataTransfer.files);
        }
      }}
    >
      <div className="jp-SandboxPanel-crumbs">
        <button
          type="button"
          className="jp-SandboxPanel-linkButton"
          onClick={() => void files.open(files.sandboxId, '')}
        >
          {files.sandboxId}:/workspace
        </button>
        {crumbs.map((part, i) => (
          <React.Fragment key={i}>
            <span>/</span>
            <button
              type="button"
              className="jp-SandboxPanel-linkButton"
              onClick={() =>
                void files.open(
                  files.sandboxId,
                  crumbs.slice(0, i + 1).join('/')
                )
              }
            >
              {part}
            </button>
          </React.Fragment>
        ))}
        <button
          type="button"
          className="jp-SandboxPanel-upload jp-mod-styled"
          onClick={() => view.pickFiles()}
          aria-label="Upload files"
        >
          <fileUploadIcon.react
            tag="span"
            className="jp-SandboxPanel-actionIcon"
          />{' '}
          Upload
        </button>
      </div>
      {files.uploads.map((u, i) => (
        <div
          className="jp-SandboxPanel-progress"
          key={`${u.name}-${i}`}
          role="progressbar"
          aria-valuenow={Math.round(u.fraction * 100)}
          aria-valuemin={0}
          aria-valuemax={100}
          aria-label={`Uploading ${u.name}`}
        >
          <span className="jp-SandboxPanel-progressLabel">
            {u.name} · {formatBytes(u.size)} · {Math.round(u.fraction * 100)}%
          </span>
          <span className="jp-SandboxPanel-meter">
            <span style={{ width: `${Math.round(u.fraction * 100)}%` }} />
          </span>
        </div>
      ))}
      {files.error ? (
        <div className="jp-SandboxPanel-error" role="alert">
          <strong>{describeStatus(files.error.status)}</strong>
          <span>{files.error.message}</span>
        </div>
      ) : (
        <ul className="jp-SandboxPanel-list" aria-label="Files">
          {files.entries.length === 0 && (
            <li className="jp-SandboxPanel-empty">
              Empty folder. Drop files here to upload.
            </li>
          )}
          {files.entries.map(e => (
            <FileRow key={e.path} entry={e} files={files} />
          ))}
        </ul>
      )}
    </div>
  );
}

export { sandboxIcon };
