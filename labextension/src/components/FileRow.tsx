/**
 * One entry of the folder shown in Files: a folder opens on click; a file shows its
 * size, a download link and a delete button. Long names wrap rather than being cut.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import {
  deleteIcon,
  downloadIcon,
  fileIcon,
  folderIcon
} from '@jupyterlab/ui-components';
import * as React from 'react';

import { IFileEntry } from '../api';
import { confirmDeleteFile } from '../dialogs';
import { formatBytes } from '../format';
import { FilesModel } from '../model';
import { ActionButton } from './ActionButton';
import { Breakable } from './Breakable';

export function FileRow(props: {
  entry: IFileEntry;
  files: FilesModel;
  trans: TranslationBundle;
}): JSX.Element {
  const { entry, files, trans } = props;
  if (entry.type === 'directory') {
    return (
      <li className="jp-SandboxPanel-file" data-path={entry.path}>
        <button
          type="button"
          className="jp-SandboxPanel-fileName jp-SandboxPanel-linkButton"
          title={entry.path}
          onClick={() => void files.open(files.sandboxId, entry.path)}
        >
          <folderIcon.react tag="span" className="jp-SandboxPanel-fileIcon" />
          <span className="jp-SandboxPanel-fileText">
            <Breakable text={`${entry.name}/`} />
          </span>
        </button>
      </li>
    );
  }
  return (
    <li className="jp-SandboxPanel-file" data-path={entry.path}>
      <span className="jp-SandboxPanel-fileName" title={entry.path}>
        <fileIcon.react tag="span" className="jp-SandboxPanel-fileIcon" />
        <span className="jp-SandboxPanel-fileText">
          <Breakable text={entry.name} />
        </span>
      </span>
      <span className="jp-SandboxPanel-sub jp-SandboxPanel-size">
        {formatBytes(entry.size)}
      </span>
      <a
        className="jp-SandboxPanel-action jp-mod-styled"
        href={files.downloadUrl(entry)}
        download={entry.name}
        title={trans.__('Download %1', entry.name)}
        aria-label={trans.__('Download %1', entry.name)}
      >
        <downloadIcon.react tag="span" className="jp-SandboxPanel-actionIcon" />
      </a>
      <ActionButton
        icon={deleteIcon}
        label={trans.__('Delete %1', entry.name)}
        className="jp-mod-danger"
        onClick={() => void confirmDeleteFile(trans, files, entry)}
      />
    </li>
  );
}
