/**
 * The folder shown in Files, on one line at any width: the outer folders give up their
 * room first (ellipsis, the full path in each one's tooltip), the folder shown last.
 * Each part opens its folder.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { FilesModel } from '../model';

export function Breadcrumbs(props: {
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
