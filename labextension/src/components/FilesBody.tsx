/**
 * The body of the Files section: how to choose a sandbox, or the folder shown (its
 * breadcrumb, uploads in flight, its entries or why they cannot be listed, how many
 * hidden names were left out). Files dropped anywhere on it are uploaded into it.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { describeStatus } from '../api';
import { FilesModel } from '../model';
import { Breadcrumbs } from './Breadcrumbs';
import { FileRow } from './FileRow';
import { UploadProgress } from './UploadProgress';

export function FilesBody(props: {
  files: FilesModel;
  trans: TranslationBundle;
  /** Upload these files into the folder shown. */
  onUpload: (files: FileList | File[]) => void;
}): JSX.Element {
  const { files, trans } = props;
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
          props.onUpload(event.dataTransfer.files);
        }
      }}
    >
      <Breadcrumbs files={files} trans={trans} />
      {files.uploads.map((u, i) => (
        <UploadProgress key={`${u.name}-${i}`} upload={u} trans={trans} />
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
