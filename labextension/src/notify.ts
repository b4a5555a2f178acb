/** How the panel reports a failed action: a JupyterLab notification with the server's message. */
import { Notification } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';

import { ApiError, describeStatus } from './api';

/** The one line a failed action shows: what failed, what the status means, the server's words. */
export function errorMessage(
  trans: TranslationBundle,
  what: string,
  error: unknown
): string {
  const apiError =
    error instanceof ApiError
      ? error
      : new ApiError(-1, String((error as Error)?.message ?? error));
  return apiError.status >= 0
    ? trans.__(
        '%1 failed. %2: %3',
        what,
        describeStatus(apiError.status, trans),
        apiError.message
      )
    : trans.__('%1 failed. %2', what, apiError.message);
}

/** Show an API error as a JupyterLab notification, with the server's message. */
export function notifyError(
  trans: TranslationBundle,
  what: string,
  error: unknown
): void {
  Notification.error(errorMessage(trans, what, error), { autoClose: 8000 });
}
