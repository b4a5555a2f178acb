/**
 * What a sandbox card says about its sandbox, one fact a line: the folder its cells run
 * in, the administrator's folders mapped into it, scope, image, flavor, time, CPU, memory
 * and disk against their limits, who uses it, what the lifecycle does next and why it is
 * outdated (and what its next start does about it) or stopped. Every value wraps
 * inside the card (paths and image names after their slashes and colons), so at the
 * default sidebar width all of it is read, never cut (only agents' session names, which
 * agents choose, are shortened, whole in the tooltip); lines with nothing to say are
 * left out (no disk line where the server does not measure disk).
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { ISandbox } from '../api';
import {
  agentsLabel,
  diskFraction,
  folderLabel,
  formatAgo,
  formatCpu,
  formatDisk,
  formatMemory,
  kernelsLabel,
  lifetime,
  memoryFraction,
  nextLabel,
  originLabel,
  scopeLabel
} from '../format';
import { Breakable } from './Breakable';
import { Fact } from './Fact';
import { Meter } from './Meter';
import { SandboxMappings } from './SandboxMappings';

export function SandboxFacts(props: {
  sandbox: ISandbox;
  trans: TranslationBundle;
  /** The time the figures are relative to (ms since the epoch). */
  now: number;
}): JSX.Element {
  const { sandbox: s, trans, now } = props;
  const memory = formatMemory(s);
  const memoryUse = memoryFraction(s);
  const disk = formatDisk(s);
  const diskUse = diskFraction(s);
  const agents = agentsLabel(s, trans);
  const next = nextLabel(s, now, trans);
  const origin = originLabel(s, trans);
  const folder = folderLabel(s);
  return (
    <dl className="jp-SandboxPanel-facts">
      <Fact
        label={trans.__('Folder')}
        className="jp-SandboxPanel-folder"
        title={
          s.work_folder
            ? trans.__(
                'Cells run in %1, your folder mounted at the same path; the workspace is /workspace',
                folder
              )
            : trans.__('Cells run in the workspace, %1', folder)
        }
      >
        <Breakable text={folder} />
      </Fact>
      {s.volumes && s.volumes.length > 0 && (
        <Fact
          label={trans.__('Mapped')}
          className="jp-SandboxPanel-mapped"
          title={trans.__('Folders the administrator maps into every sandbox')}
        >
          <SandboxMappings volumes={s.volumes} trans={trans} />
        </Fact>
      )}
      <Fact
        label={trans.__('Scope')}
        className="jp-SandboxPanel-scope"
        title={s.thread || s.user}
      >
        {scopeLabel(s, trans)}
      </Fact>
      <Fact label={trans.__('From')} className="jp-SandboxPanel-origin">
        <Breakable text={origin} />
      </Fact>
      <Fact label={trans.__('Flavor')} className="jp-SandboxPanel-flavor">
        {s.flavor || '–'} · {s.backend}
      </Fact>
      <Fact
        label={trans.__('Time')}
        title={trans.__('created %1', formatAgo(s.created, now, trans))}
      >
        {trans.__(
          '%1 · active %2',
          lifetime(s, now, trans),
          formatAgo(s.last_activity, now, trans)
        )}
      </Fact>
      <Fact label={trans.__('CPU')} className="jp-SandboxPanel-cpu">
        {formatCpu(s, trans)}
      </Fact>
      <Fact label={trans.__('Memory')} className="jp-SandboxPanel-memory">
        {memory}
        {memoryUse !== null && <Meter fraction={memoryUse} />}
      </Fact>
      {disk && (
        <Fact
          label={trans.__('Disk')}
          className="jp-SandboxPanel-disk"
          title={trans.__('Disk used, against the flavor’s disk size')}
        >
          {disk}
          {diskUse !== null && <Meter fraction={diskUse} />}
        </Fact>
      )}
      <Fact label={trans.__('Used by')} className="jp-SandboxPanel-kernels">
        {kernelsLabel(s, trans)}
      </Fact>
      {agents && (
        <Fact
          label={trans.__('Agents')}
          className="jp-SandboxPanel-agents"
          title={(s.agent_sessions ?? []).map(a => a.name).join(', ')}
        >
          {agents}
        </Fact>
      )}
      {next && (
        <Fact
          label={trans.__('Next')}
          className="jp-SandboxPanel-next"
          title={s.next?.reason}
        >
          {next}
        </Fact>
      )}
      {s.outdated && (
        <Fact label={trans.__('Outdated')} className="jp-SandboxPanel-outdated">
          {s.remake
            ? trans.__('%1; %2', s.outdated, s.remake)
            : trans.__(
                '%1; destroy it to remake it (the workspace is kept)',
                s.outdated
              )}
        </Fact>
      )}
      {s.exit_reason && (
        <Fact label={trans.__('Stopped')} className="jp-SandboxPanel-exit">
          {s.exit_reason}
        </Fact>
      )}
    </dl>
  );
}
