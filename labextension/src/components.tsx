/** React views of the panel's sections; every action goes through the models. */
import {
  Dialog,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';
import {
  checkIcon,
  copyIcon,
  deleteIcon,
  downloadIcon,
  fileIcon,
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
import { copyText } from './clipboard';
import {
  formatAgo,
  formatBytes,
  formatCpu,
  formatMemory,
  agentsLabel,
  kernelsLabel,
  lifetime,
  memoryFraction,
  nextLabel,
  originLabel,
  scopeLabel
} from './format';
import { cameraIcon, filesIcon, sandboxIcon } from './icons';
import { FilesModel, SandboxesModel } from './model';

/** Show an API error as a JupyterLab notification, with the server's message. */
export function notifyError(
  trans: TranslationBundle,
  what: string,
  error: unknown
): void {
  const apiError =
    error instanceof ApiError
      ? error
      : new ApiError(-1, String((error as Error)?.message ?? error));
  const message =
    apiError.status >= 0
      ? trans.__(
          '%1 failed. %2: %3',
          what,
          describeStatus(apiError.status, trans),
          apiError.message
        )
      : trans.__('%1 failed. %2', what, apiError.message);
  Notification.error(message, { autoClose: 8000 });
}

export async function askSnapshot(
  trans: TranslationBundle,
  model: SandboxesModel,
  sandbox: ISandbox
): Promise<void> {
  const stamp = new Date().toISOString().slice(0, 16).replace(/[-:T]/g, '');
  const result = await InputDialog.getText({
    title: trans.__('Snapshot %1', sandbox.id),
    label: trans.__(
      'Snapshot name (lowercase letters, digits, ".", "_" or "-"). The workspace is not included.'
    ),
    text: `${sandbox.id.replace(/^sk-/, '').slice(0, 40)}-${stamp}`.toLowerCase(),
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
  const result = await showDialog({
    title: trans.__('Destroy %1?', sandbox.id),
    body:
      trans.__(
        'The sandbox and what was installed in it outside /workspace are removed. Your files in /workspace are kept.'
      ) + kernels,
    buttons: [
      Dialog.cancelButton({ label: trans.__('Cancel') }),
      Dialog.warnButton({ label: trans.__('Destroy') })
    ]
  });
  if (!result.button.accept) {
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

function StateDot(props: { state: string; label: string }): JSX.Element {
  return (
    <span
      className={`jp-SandboxPanel-dot jp-SandboxPanel-dot-${props.state}`}
      role="img"
      aria-label={props.label}
      title={props.label}
    />
  );
}

/** How long "Copied" stays shown after a click (a failure's words three times as long). */
const COPIED_MS = 2500;

/**
 * A sandbox's WebDAV URL (the whole workspace as a drive), a button copying it and a
 * one-line mount hint, at the foot of its card (after the actions, so Tab from the
 * card still reaches Stop/Start first). The URL wraps inside its own box at the
 * card's full width, so a long one never pushes anything out of reach; one click on
 * it selects it whole. When neither clipboard path works the URL is selected instead.
 */
function DavLink(props: {
  id: string;
  url: string;
  trans: TranslationBundle;
}): JSX.Element {
  const { id, url, trans } = props;
  // A new object per click, so a second click shows its confirmation for full time.
  const [copied, setCopied] = React.useState<{ ok: boolean } | null>(null);
  const urlNode = React.useRef<HTMLElement>(null);
  React.useEffect(() => {
    if (!copied) {
      return;
    }
    const timer = window.setTimeout(
      () => setCopied(null),
      copied.ok ? COPIED_MS : 3 * COPIED_MS
    );
    return () => window.clearTimeout(timer);
  }, [copied]);
  const copy = () => {
    void copyText(url).then(ok => {
      setCopied({ ok });
      if (!ok && urlNode.current) {
        window.getSelection()?.selectAllChildren(urlNode.current);
      }
    });
  };
  return (
    <div className="jp-SandboxPanel-dav">
      <div className="jp-SandboxPanel-davHead">
        <span className="jp-SandboxPanel-davLabel">{trans.__('WebDAV')}</span>
        <span
          className={`jp-SandboxPanel-davStatus${copied ? ' jp-mod-copied' : ''}`}
          role="status"
        >
          {copied
            ? copied.ok
              ? trans.__('Copied')
              : trans.__('No clipboard access: copy the selected URL by hand')
            : ''}
        </span>
        <ActionButton
          icon={copied?.ok ? checkIcon : copyIcon}
          label={trans.__('Copy the WebDAV URL of %1', id)}
          className="jp-SandboxPanel-copy"
          onClick={copy}
        />
      </div>
      <code className="jp-SandboxPanel-davUrl" title={url} ref={urlNode}>
        {url}
      </code>
      <div className="jp-SandboxPanel-sub jp-SandboxPanel-mountHint">
        {trans.__(
          'Mount it in Finder, Explorer, davfs2 or rclone: any user name, your Jupyter token as password'
        )}
      </div>
    </div>
  );
}

/** The words for a sandbox state (the state itself stays the CSS class). */
export function stateLabel(trans: TranslationBundle, state: string): string {
  switch (state) {
    case 'running':
      return trans.__('running');
    case 'stopped':
      return trans.__('stopped');
    case 'creating':
      return trans.__('creating');
    case 'error':
      return trans.__('error');
    default:
      return state;
  }
}

function SandboxCard(props: {
  sandbox: ISandbox;
  model: SandboxesModel;
  trans: TranslationBundle;
  onBrowse: (id: string) => void;
}): JSX.Element {
  const { sandbox: s, model, trans } = props;
  const busy = model.isBusy(s.id);
  const highlighted = model.highlighted === s.id;
  const fraction = memoryFraction(s);
  const now = Date.now();
  const next = nextLabel(s, now, trans);
  const agents = agentsLabel(s, trans);
  const state = stateLabel(trans, s.state);
  const act = (what: string, fn: () => Promise<unknown>) => () => {
    fn().catch(error => notifyError(trans, what, error));
  };
  const time = trans.__(
    '%1 · active %2',
    lifetime(s, now, trans),
    formatAgo(s.last_activity, now, trans)
  );
  return (
    <li
      className={`jp-SandboxPanel-card${highlighted ? ' jp-SandboxPanel-revealed' : ''}${busy ? ' jp-mod-busy' : ''}`}
      data-sandbox-id={s.id}
      tabIndex={0}
      aria-label={trans.__('sandbox %1, %2', s.id, state)}
    >
      <div className="jp-SandboxPanel-cardHeader">
        <StateDot state={s.state} label={state} />
        <span className="jp-SandboxPanel-name" title={s.id}>
          {s.id}
        </span>
        <span className="jp-SandboxPanel-state">
          {busy ? trans.__('working…') : state}
        </span>
      </div>
      <dl className="jp-SandboxPanel-facts">
        <dt>{trans.__('Scope')}</dt>
        <dd title={s.thread || s.user}>{scopeLabel(s, trans)}</dd>
        <dt>{trans.__('From')}</dt>
        <dd title={originLabel(s, trans)}>{originLabel(s, trans)}</dd>
        <dt>{trans.__('Flavor')}</dt>
        <dd>
          {s.flavor || '–'} · {s.backend}
        </dd>
        <dt>{trans.__('Time')}</dt>
        <dd title={trans.__('created %1', formatAgo(s.created, now, trans))}>
          {time}
        </dd>
        <dt>{trans.__('CPU')}</dt>
        <dd className="jp-SandboxPanel-cpu">{formatCpu(s, trans)}</dd>
        <dt>{trans.__('Memory')}</dt>
        <dd className="jp-SandboxPanel-memory" title={formatMemory(s)}>
          {formatMemory(s)}
          {fraction !== null && (
            <span className="jp-SandboxPanel-meter" aria-hidden="true">
              <span style={{ width: `${Math.round(fraction * 100)}%` }} />
            </span>
          )}
        </dd>
        <dt>{trans.__('Kernels')}</dt>
        <dd className="jp-SandboxPanel-kernels">{kernelsLabel(s, trans)}</dd>
        {agents && (
          <>
            <dt>{trans.__('Agents')}</dt>
            <dd className="jp-SandboxPanel-agents" title={agents}>
              {agents}
            </dd>
          </>
        )}
        {next && (
          <>
            <dt>{trans.__('Next')}</dt>
            <dd className="jp-SandboxPanel-next" title={s.next?.reason}>
              {next}
            </dd>
          </>
        )}
        {s.outdated && (
          <>
            <dt>{trans.__('Outdated')}</dt>
            <dd className="jp-SandboxPanel-outdated" title={s.outdated}>
              {trans.__(
                '%1; destroy it to remake it (the workspace is kept)',
                s.outdated
              )}
            </dd>
          </>
        )}
        {s.exit_reason && (
          <>
            <dt>{trans.__('Stopped')}</dt>
            <dd title={s.exit_reason}>{s.exit_reason}</dd>
          </>
        )}
      </dl>
      <div className="jp-SandboxPanel-actions">
        {s.state === 'running' ? (
          <ActionButton
            icon={stopIcon}
            label={trans.__('Stop %1', s.id)}
            disabled={busy}
            onClick={act(trans.__('Stopping %1', s.id), () => model.stop(s.id))}
          />
        ) : (
          <ActionButton
            icon={runIcon}
            label={trans.__('Start %1', s.id)}
            disabled={busy}
            onClick={act(trans.__('Starting %1', s.id), () =>
              model.start(s.id)
            )}
          />
        )}
        <ActionButton
          icon={filesIcon}
          label={trans.__('Browse files of %1', s.id)}
          onClick={() => props.onBrowse(s.id)}
        />
        <ActionButton
          icon={cameraIcon}
          label={trans.__('Snapshot %1', s.id)}
          disabled={busy}
          onClick={() => void askSnapshot(trans, model, s)}
        />
        <ActionButton
          icon={deleteIcon}
          label={trans.__('Destroy %1', s.id)}
          disabled={busy}
          className="jp-mod-danger"
          onClick={() => void confirmDestroy(trans, model, s)}
        />
      </div>
      <DavLink id={s.id} url={model.api.davUrl(s.id)} trans={trans} />
    </li>
  );
}

function ErrorBanner(props: {
  error: ApiError;
  trans: TranslationBundle;
}): JSX.Element {
  const { error, trans } = props;
  return (
    <div className="jp-SandboxPanel-error" role="alert">
      <strong>
        {describeStatus(error.unreachable ? 0 : error.status, trans)}
      </strong>
      <span>{error.message}</span>
      <span className="jp-SandboxPanel-hint">
        {trans.__(
          'Retrying with backoff; the list is hidden until it answers.'
        )}
      </span>
    </div>
  );
}

export class SandboxesView extends ReactWidget {
  constructor(
    readonly model: SandboxesModel,
    readonly trans: TranslationBundle,
    readonly onBrowse: (id: string) => void
  ) {
    super();
    this.addClass('jp-SandboxPanel-sandboxes');
    this.addClass('jp-SandboxPanel-body');
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
    const trans = this.trans;
    return (
      <UseSignal signal={this.model.changed}>
        {() => {
          const m = this.model;
          if (m.error) {
            return <ErrorBanner error={m.error} trans={trans} />;
          }
          if (!m.loaded) {
            return (
              <div className="jp-SandboxPanel-empty">
                {trans.__('Loading…')}
              </div>
            );
          }
          if (m.sandboxes.length === 0) {
            return (
              <div className="jp-SandboxPanel-empty">
                {trans.__(
                  'No sandboxes. Run a cell in a notebook with the “Python 3 (sandbox)” kernel to make one.'
                )}
              </div>
            );
          }
          return (
            <ul
              className="jp-SandboxPanel-list"
              aria-label={trans.__('Sandboxes')}
            >
              {m.sandboxes.map(s => (
                <SandboxCard
                  key={s.id}
                  sandbox={s}
                  model={m}
                  trans={trans}
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
  trans: TranslationBundle;
}): JSX.Element {
  const { snapshot: snap, model, trans } = props;
  const busy = model.isBusy(`snapshot:${snap.name}`);
  const start = () => {
    model
      .startFromSnapshot(snap.name)
      .then(s => {
        Notification.success(
          trans.__('Started %1 from snapshot %2', s.id, snap.name),
          { autoClose: 4000 }
        );
        model.reveal(s.id);
      })
      .catch(error =>
        notifyError(
          trans,
          trans.__('Starting a sandbox from %1', snap.name),
          error
        )
      );
  };
  const remove = async () => {
    const result = await showDialog({
      title: trans.__('Delete snapshot %1?', snap.name),
      body: trans.__('Sandboxes started from it must be destroyed first.'),
      buttons: [
        Dialog.cancelButton({ label: trans.__('Cancel') }),
        Dialog.warnButton({ label: trans.__('Delete') })
      ]
    });
    if (result.button.accept) {
      model
        .deleteSnapshot(snap.name)
        .catch(error =>
          notifyError(trans, trans.__('Deleting snapshot %1', snap.name), error)
        );
    }
  };
  return (
    <li
      className={`jp-SandboxPanel-snapshot${busy ? ' jp-mod-busy' : ''}`}
      data-snapshot={snap.name}
      tabIndex={0}
    >
      <div className="jp-SandboxPanel-snapshotText">
        <span className="jp-SandboxPanel-name" title={snap.name}>
          {snap.name}
        </span>
        <span className="jp-SandboxPanel-sub">
          {trans.__(
            'from %1 · %2 · %3',
            snap.source || '?',
            formatBytes(snap.size),
            formatAgo(snap.created, Date.now(), trans)
          )}
        </span>
      </div>
      <div className="jp-SandboxPanel-actions">
        <ActionButton
          icon={runIcon}
          label={trans.__('Start a new sandbox from %1', snap.name)}
          disabled={busy}
          onClick={start}
        />
        <ActionButton
          icon={deleteIcon}
          label={trans.__('Delete snapshot %1', snap.name)}
          disabled={busy}
          className="jp-mod-danger"
          onClick={() => void remove()}
        />
      </div>
    </li>
  );
}

export class SnapshotsView extends ReactWidget {
  constructor(
    readonly model: SandboxesModel,
    readonly trans: TranslationBundle
  ) {
    super();
    this.addClass('jp-SandboxPanel-snapshots');
    this.addClass('jp-SandboxPanel-body');
  }

  render(): JSX.Element {
    const trans = this.trans;
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
                {trans.__('No snapshots. Use the camera button of a sandbox.')}
              </div>
            );
          }
          return (
            <ul
              className="jp-SandboxPanel-list"
              aria-label={trans.__('Snapshots')}
            >
              {m.snapshots.map(s => (
                <SnapshotRow
                  key={s.name}
                  snapshot={s}
                  model={m}
                  trans={trans}
                />
              ))}
            </ul>
          );
        }}
      </UseSignal>
    );
  }
}

function FileRow(props: {
  entry: IFileEntry;
  files: FilesModel;
  trans: TranslationBundle;
}): JSX.Element {
  const { entry, files, trans } = props;
  const isDir = entry.type === 'directory';
  const remove = async () => {
    const result = await showDialog({
      title: trans.__('Delete %1?', entry.path),
      body: trans.__('The file is removed from the workspace.'),
      buttons: [
        Dialog.cancelButton({ label: trans.__('Cancel') }),
        Dialog.warnButton({ label: trans.__('Delete') })
      ]
    });
    if (result.button.accept) {
      files
        .delete(entry)
        .catch(error =>
          notifyError(trans, trans.__('Deleting %1', entry.path), error)
        );
    }
  };
  return (
    <li className="jp-SandboxPanel-file" data-path={entry.path}>
      {isDir ? (
        <button
          type="button"
          className="jp-SandboxPanel-fileName jp-SandboxPanel-linkButton"
          title={entry.path}
          onClick={() => void files.open(files.sandboxId, entry.path)}
        >
          <folderIcon.react tag="span" className="jp-SandboxPanel-fileIcon" />
          <span className="jp-SandboxPanel-fileText">{entry.name}/</span>
        </button>
      ) : (
        <span className="jp-SandboxPanel-fileName" title={entry.path}>
          <fileIcon.react tag="span" className="jp-SandboxPanel-fileIcon" />
          <span className="jp-SandboxPanel-fileText">{entry.name}</span>
        </span>
      )}
      {!isDir && (
        <span className="jp-SandboxPanel-sub jp-SandboxPanel-size">
          {formatBytes(entry.size)}
        </span>
      )}
      {!isDir && (
        <a
          className="jp-SandboxPanel-action jp-mod-styled"
          href={files.downloadUrl(entry)}
          download={entry.name}
          title={trans.__('Download %1', entry.name)}
          aria-label={trans.__('Download %1', entry.name)}
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
          label={trans.__('Delete %1', entry.name)}
          className="jp-mod-danger"
          onClick={() => void remove()}
        />
      )}
    </li>
  );
}

export class FilesView extends ReactWidget {
  constructor(
    readonly files: FilesModel,
    readonly trans: TranslationBundle
  ) {
    super();
    this.addClass('jp-SandboxPanel-files');
    this.addClass('jp-SandboxPanel-body');
  }

  /** Open the system file picker and upload what is chosen (only with a sandbox chosen). */
  pickFiles(): void {
    if (!this.files.sandboxId) {
      return;
    }
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
      .catch(error => notifyError(this.trans, this.trans.__('Upload'), error));
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this.files.changed}>
        {() => <FilesBody view={this} />}
      </UseSignal>
    );
  }
}

/** The folder shown, one line: the outer parts shrink first (ellipsis), the last last. */
function Breadcrumbs(props: {
  files: FilesModel;
  trans: TranslationBundle;
}): JSX.Element {
  const { files, trans } = props;
  const crumbs = files.path ? files.path.split('/') : [];
  const root = `${files.sandboxId}:/workspace`;
  return (
    <nav className="jp-SandboxPanel-crumbs" aria-label={trans.__('Folder')}>
      <button
        type="button"
        className="jp-SandboxPanel-linkButton jp-SandboxPanel-crumb"
        title={root}
        onClick={() => void files.open(files.sandboxId, '')}
      >
        {root}
      </button>
      {crumbs.map((part, i) => {
        const path = crumbs.slice(0, i + 1).join('/');
        return (
          <React.Fragment key={i}>
            <span className="jp-SandboxPanel-crumbSep" aria-hidden="true">
              /
            </span>
            <button
              type="button"
              className="jp-SandboxPanel-linkButton jp-SandboxPanel-crumb"
              title={`/workspace/${path}`}
              onClick={() => void files.open(files.sandboxId, path)}
            >
              {part}
            </button>
          </React.Fragment>
        );
      })}
    </nav>
  );
}

function FilesBody({ view }: { view: FilesView }): JSX.Element {
  const { files, trans } = view;
  const [over, setOver] = React.useState(false);
  if (!files.sandboxId) {
    return (
      <div className="jp-SandboxPanel-empty">
        {trans.__('Choose “Browse files” on a sandbox.')}
      </div>
    );
  }
  const hidden = files.hiddenCount;
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
      <Breadcrumbs files={files} trans={trans} />
      {files.uploads.map((u, i) => (
        <div
          className="jp-SandboxPanel-progress"
          key={`${u.name}-${i}`}
          role="progressbar"
          aria-valuenow={Math.round(u.fraction * 100)}
          aria-valuemin={0}
          aria-valuemax={100}
          aria-label={trans.__('Uploading %1', u.name)}
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
          <strong>{describeStatus(files.error.status, trans)}</strong>
          <span>{files.error.message}</span>
        </div>
      ) : (
        <ul className="jp-SandboxPanel-list" aria-label={trans.__('Files')}>
          {files.entries.length === 0 && (
            <li className="jp-SandboxPanel-empty">
              {hidden
                ? trans.__('Nothing to show. Drop files here to upload.')
                : trans.__('Empty folder. Drop files here to upload.')}
            </li>
          )}
          {files.entries.map(e => (
            <FileRow key={e.path} entry={e} files={files} trans={trans} />
          ))}
          {hidden > 0 && (
            <li
              className="jp-SandboxPanel-hint jp-SandboxPanel-hiddenNote"
              title={trans.__(
                'Hidden names are set in Settings › Sandboxes (show hidden files, hidden file patterns).'
              )}
            >
              {trans._n('%1 hidden item', '%1 hidden items', hidden)}
            </li>
          )}
        </ul>
      )}
    </div>
  );
}

export { sandboxIcon };
