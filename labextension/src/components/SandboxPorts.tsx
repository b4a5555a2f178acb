/**
 * The ports a running sandbox listens on, each a link to its preview (a new tab), on
 * its card. A port that listens on the sandbox's loopback only gets a note instead of a
 * link: no preview reaches it until it listens on 0.0.0.0.
 *
 * The server reads them from inside the sandbox, so they are asked for only when there
 * is a reason: the card is shown (or the panel shown again) with the sandbox running,
 * the sandbox starts, the refresh button is pressed, or the sandbox was used since the
 * last read (a cell may have started an app), then at most every ACTIVITY_GAP_MS; never
 * on the list's own polls. A link carries neither the opener nor this page's address to
 * the app's tab (rel="noopener noreferrer").
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { refreshIcon } from '@jupyterlab/ui-components';
import * as React from 'react';

import { ApiError, describeStatus, ISandbox, SandboxAPI } from '../api';
import { ActionButton } from './ActionButton';
import { IPortsRead, PortList } from './PortList';

/** The shortest time between two reads that the sandbox's use (not the user) asks for. */
export const ACTIVITY_GAP_MS = 15000;

export function SandboxPorts(props: {
  sandbox: ISandbox;
  api: SandboxAPI;
  trans: TranslationBundle;
  /** Whether the panel can be seen: a hidden panel reads nothing. */
  visible: boolean;
}): JSX.Element | null {
  const { sandbox: s, api, trans, visible } = props;
  const running = s.state === 'running';
  const [found, setFound] = React.useState<IPortsRead | null>(null);
  const [error, setError] = React.useState<ApiError | null>(null);
  const [reading, setReading] = React.useState(false);
  const asked = React.useRef(0); // the latest read's number: older answers are dropped
  const readAt = React.useRef(0); // when (ms) the latest read began
  const readActivity = React.useRef<number | null>(null); // last_activity at that read
  const activity = React.useRef(s.last_activity);
  React.useEffect(() => {
    activity.current = s.last_activity;
  }, [s.last_activity]);

  const read = React.useCallback(() => {
    const mine = ++asked.current;
    readAt.current = Date.now();
    readActivity.current = activity.current;
    setReading(true);
    api.ports(s.id).then(
      answer => {
        if (mine === asked.current) {
          setFound({
            ports: answer.ports,
            preview: answer.preview,
            note: answer.preview_note
          });
          setError(null);
          setReading(false);
        }
      },
      (reason: unknown) => {
        if (mine === asked.current) {
          setError(
            reason instanceof ApiError
              ? reason
              : new ApiError(-1, String((reason as Error)?.message ?? reason))
          );
          setReading(false);
        }
      }
    );
  }, [api, s.id]);

  // Shown running, started, or the panel shown again: read. Otherwise forget.
  React.useEffect(() => {
    if (running && visible) {
      read();
      return;
    }
    asked.current++;
    setReading(false);
    if (!running) {
      setFound(null);
      setError(null);
    }
  }, [running, visible, read]);

  // Used since the last read: read again, ACTIVITY_GAP_MS after the last read at the soonest.
  React.useEffect(() => {
    if (
      !running ||
      !visible ||
      readActivity.current === null ||
      s.last_activity === readActivity.current
    ) {
      return;
    }
    const wait = Math.max(0, readAt.current + ACTIVITY_GAP_MS - Date.now());
    const timer = window.setTimeout(read, wait);
    return () => window.clearTimeout(timer);
  }, [s.last_activity, running, visible, read]);

  if (!running) {
    return null;
  }
  return (
    <div className="jp-SandboxPanel-ports">
      <div className="jp-SandboxPanel-portsHead">
        <span className="jp-SandboxPanel-portsLabel">{trans.__('Ports')}</span>
        <span className="jp-SandboxPanel-portsStatus" role="status">
          {reading ? trans.__('reading…') : ''}
        </span>
        <ActionButton
          icon={refreshIcon}
          label={trans.__('Read the listening ports of %1 again', s.id)}
          className="jp-SandboxPanel-portsRefresh"
          disabled={reading}
          onClick={read}
        />
      </div>
      {error ? (
        <div className="jp-SandboxPanel-sub jp-SandboxPanel-portsError">
          {trans.__(
            '%1: %2',
            describeStatus(error.unreachable ? 0 : error.status, trans),
            error.message
          )}
        </div>
      ) : found === null ? null : (
        <PortList sandbox={s} found={found} api={api} trans={trans} />
      )}
    </div>
  );
}
