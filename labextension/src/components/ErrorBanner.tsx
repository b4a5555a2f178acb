/** What the Sandboxes section shows instead of a list when the server does not answer or refuses. */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { ApiError, describeStatus } from '../api';

export function ErrorBanner(props: {
  error: ApiError;
  trans: TranslationBundle;
  /** What happens next, e.g. that the panel retries; none when nothing does. */
  hint?: string;
}): JSX.Element {
  const { error, trans } = props;
  return (
    <div className="jp-SandboxPanel-error" role="alert">
      <strong>
        {describeStatus(error.unreachable ? 0 : error.status, trans)}
      </strong>
      <span>{error.message}</span>
      {props.hint && <span className="jp-SandboxPanel-hint">{props.hint}</span>}
    </div>
  );
}
