/** One upload in flight in Files: its name, size and percent sent, as a progress bar. */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { formatBytes } from '../format';
import { IUpload } from '../model';
import { Meter } from './Meter';

export function UploadProgress(props: {
  upload: IUpload;
  trans: TranslationBundle;
}): JSX.Element {
  const { upload: u, trans } = props;
  const percent = Math.round(u.fraction * 100);
  return (
    <div
      className="jp-SandboxPanel-progress"
      role="progressbar"
      aria-valuenow={percent}
      aria-valuemin={0}
      aria-valuemax={100}
      aria-label={trans.__('Uploading %1', u.name)}
    >
      <span className="jp-SandboxPanel-progressLabel">
        {u.name} · {formatBytes(u.size)} · {percent}%
      </span>
      <Meter fraction={u.fraction} />
    </div>
  );
}
