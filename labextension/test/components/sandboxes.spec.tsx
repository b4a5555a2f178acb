// @vitest-environment jsdom
/**
 * The Sandboxes section: a card's facts, actions and WebDAV link, the card, the list
 * and the widget, over the real models and API client on a fake server.
 */
import { Widget } from '@lumino/widgets';
import {
  act,
  fireEvent,
  render,
  screen,
  waitFor
} from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import * as React from 'react';
import { afterEach, describe, expect, it, vi } from 'vitest';

import { ISandbox, SandboxAPI } from '../../src/api';
import { COPIED_MS, DavLink } from '../../src/components/DavLink';
import { SandboxActions } from '../../src/components/SandboxActions';
import { SandboxCard } from '../../src/components/SandboxCard';
import { SandboxFacts } from '../../src/components/SandboxFacts';
import { SandboxList } from '../../src/components/SandboxList';
import { SandboxesView } from '../../src/components/SandboxesView';
import { NBSP } from '../../src/format';
import { SandboxesModel } from '../../src/model';
import { FakeServer, jsonResponse, sandbox } from '../server';
import {
  answerDialog,
  calls,
  notifications,
  sandboxesModel,
  trans
} from './helpers';

// -- SandboxFacts ----------------------------------------------------------
const NOW = 10_000 * 1000;

/** The card's facts as label -> value text, and the value elements by label. */
function facts(s: ISandbox): {
  text: Record<string, string>;
  value: Record<string, HTMLElement>;
} {
  const { container } = render(
    <SandboxFacts sandbox={s} trans={trans} now={NOW} />
  );
  const text: Record<string, string> = {};
  const value: Record<string, HTMLElement> = {};
  for (const dt of Array.from(container.querySelectorAll('dt'))) {
    const dd = dt.nextElementSibling as HTMLElement;
    expect(dd.tagName).toBe('DD');
    text[dt.textContent ?? ''] = (dd.textContent ?? '').replace(/\u00a0/g, ' ');
    value[dt.textContent ?? ''] = dd;
  }
  return { text, value };
}

describe('SandboxFacts', () => {
  it('says which folder the cells run in: the work folder, else /workspace', () => {
    const mounted = facts(
      sandbox({ work_folder: '/home/alice/projects/analysis' })
    );
    expect(mounted.text['Folder']).toBe('/home/alice/projects/analysis');
    expect(mounted.value['Folder'].title).toMatch(
      /your folder mounted at the same path/
    );
    expect(facts(sandbox()).text['Folder']).toBe('/workspace');
    expect(facts(sandbox({ work_folder: '' })).text['Folder']).toBe(
      '/workspace'
    );
    // The scope is still said, beside the folder.
    expect(facts(sandbox()).text['Scope']).toBe('user');
  });

  it('shows long paths and image names whole, breakable after / and :', () => {
    const image = 'registry.example.org/team/data-science-notebook:2025.11';
    const { text, value } = facts(
      sandbox({ image, work_folder: '/srv/notebooks/alice/analysis' })
    );
    expect(text['From']).toBe(image);
    expect(value['From'].querySelectorAll('wbr').length).toBe(3);
    expect(value['Folder'].querySelectorAll('wbr').length).toBe(3);
    // Nothing is cut for a tooltip to complete: no value needs its title to be read.
    expect(value['From'].title).toBe('');
  });

  it('gets plurals right', () => {
    expect(facts(sandbox({ kernels: 1 })).text['Used by']).toBe('1 kernel');
    expect(facts(sandbox({ kernels: 0, kernel_ids: [] })).text['Used by']).toBe(
      '0 kernels'
    );
    expect(
      facts(sandbox({ kernels: 3, busy_kernel_ids: ['k-1'] })).text['Used by']
    ).toBe('3 kernels (1 busy)');
    expect(facts(sandbox()).text['CPU']).toBe('25% of 1 CPU');
    expect(
      facts(sandbox({ limits: { cpus: 2, memory: 1 << 30 } })).text['CPU']
    ).toBe('25% of 2 CPUs');
  });

  it('leaves the disk line out when the server does not give disk figures', () => {
    const { text, value } = facts(sandbox());
    expect(Object.keys(text)).not.toContain('Disk');
    expect(Object.keys(text)).toEqual([
      'Folder',
      'Scope',
      'From',
      'Flavor',
      'Time',
      'CPU',
      'Memory',
      'Used by'
    ]);
    expect(value['Memory'].querySelector('.jp-SandboxPanel-meter')).not.toBe(
      null
    );
  });

  it('shows disk use against the flavor’s disk size when the server gives them', () => {
    const { text, value } = facts(
      sandbox({
        limits: { cpus: 1, memory: 1 << 30, disk: 10 * 2 ** 30 },
        usage: { cpu: 0.25, memory: 256 << 20, disk: 2 ** 30 }
      })
    );
    expect(text['Disk']).toBe('1.00 GiB / 10.0 GiB');
    expect(value['Disk'].textContent).toContain(`1.00${NBSP}GiB`);
    expect(value['Disk'].className).toBe('jp-SandboxPanel-disk');
    const bar = value['Disk'].querySelector(
      '.jp-SandboxPanel-meter > span'
    ) as HTMLElement;
    expect(bar.style.width).toBe('10%');
    // The line sits after memory.
    expect(Object.keys(text).indexOf('Disk')).toBe(
      Object.keys(text).indexOf('Memory') + 1
    );
  });

  it('shows what it has when only the use or only the size is given', () => {
    const usedOnly = facts(
      sandbox({ usage: { cpu: 0.1, memory: 1 << 20, disk: 5 << 20 } })
    );
    expect(usedOnly.text['Disk']).toBe('5.00 MiB');
    expect(usedOnly.value['Disk'].querySelector('.jp-SandboxPanel-meter')).toBe(
      null
    );
    const sizeOnly = facts(
      sandbox({
        state: 'stopped',
        limits: { cpus: 1, memory: 1 << 30, disk: 10 * 2 ** 30 },
        usage: {}
      })
    );
    expect(sizeOnly.text['Disk']).toBe('– / 10.0 GiB');
  });

  it('says what comes next, why it is outdated or stopped, and which agents use it', () => {
    const { text, value } = facts(
      sandbox({
        next: { action: 'destroy', at: 10_000 + 5400, reason: 'stopped 30m' },
        outdated: 'made with flavor small; yours is now medium',
        exit_reason: 'out of memory (limit 1 GiB)',
        agent_sessions: [{ id: 'a1', name: 'analysis', busy: true }]
      })
    );
    expect(text['Next']).toBe('removed (workspace kept) in 1h 30m');
    expect(value['Next'].title).toBe('stopped 30m');
    expect(text['Outdated']).toBe(
      'made with flavor small; yours is now medium; destroy it to remake it (the workspace is kept)'
    );
    expect(text['Stopped']).toBe('out of memory (limit 1 GiB)');
    expect(text['Agents']).toBe('analysis (busy)');
    // A long session name is shortened on the card; the tooltip has them whole.
    const long = 'a-session-name-longer-than-the-card-shows';
    const agents = facts(
      sandbox({ agent_sessions: [{ id: 'a2', name: long, busy: false }] })
    ).value['Agents'];
    expect(agents.textContent).toBe('a-session-name-longer-t…');
    expect(agents.title).toBe(long);
  });
});

// -- SandboxActions --------------------------------------------------------
describe('SandboxActions', () => {
  it('stops a running sandbox through the API', async () => {
    const { server, model } = await sandboxesModel([sandbox()]);
    server.json('POST', '/base/api/sandboxes/sk-alice/stop', sandbox());
    render(
      <SandboxActions
        sandbox={model.sandboxes[0]}
        model={model}
        trans={trans}
        onBrowse={() => undefined}
      />
    );
    expect(screen.queryByRole('button', { name: 'Start sk-alice' })).toBeNull();
    await userEvent.click(
      screen.getByRole('button', { name: 'Stop sk-alice' })
    );
    await waitFor(() =>
      expect(calls(server)).toContain('POST /base/api/sandboxes/sk-alice/stop')
    );
  });

  it('starts a stopped one, and says why when the server refuses', async () => {
    const stopped = sandbox({ state: 'stopped' });
    const { server, model } = await sandboxesModel([stopped]);
    server.json(
      'POST',
      '/base/api/sandboxes/sk-alice/start',
      { message: 'memory quota of 2 GiB reached' },
      409
    );
    render(
      <SandboxActions
        sandbox={stopped}
        model={model}
        trans={trans}
        onBrowse={() => undefined}
      />
    );
    await userEvent.click(
      screen.getByRole('button', { name: 'Start sk-alice' })
    );
    await waitFor(() =>
      expect(notifications('error')).toEqual([
        'Starting sk-alice failed. Quota reached: memory quota of 2 GiB reached'
      ])
    );
  });

  it('disables what changes the sandbox while an action runs', async () => {
    const { server, model } = await sandboxesModel([sandbox()]);
    let finish: (r: Response) => void = () => undefined;
    server.on(
      'POST',
      '/base/api/sandboxes/sk-alice/stop',
      () => new Promise<Response>(resolve => (finish = resolve))
    );
    const onBrowse = vi.fn();
    const view = () => (
      <SandboxActions
        sandbox={model.sandboxes[0]}
        model={model}
        trans={trans}
        onBrowse={onBrowse}
      />
    );
    const { rerender } = render(view());
    model.changed.connect(() => rerender(view()));
    await userEvent.click(
      screen.getByRole('button', { name: 'Stop sk-alice' })
    );
    await waitFor(() => expect(model.isBusy('sk-alice')).toBe(true));
    for (const name of [
      'Stop sk-alice',
      'Snapshot sk-alice',
      'Destroy sk-alice'
    ]) {
      expect(screen.getByRole('button', { name })).toHaveProperty(
        'disabled',
        true
      );
    }
    // Browsing files changes nothing: it stays available.
    await userEvent.click(
      screen.getByRole('button', { name: 'Browse files of sk-alice' })
    );
    expect(onBrowse).toHaveBeenCalledWith('sk-alice');
    finish(jsonResponse(sandbox({ state: 'stopped' })));
    await waitFor(() => expect(model.isBusy('sk-alice')).toBe(false));
    expect(
      screen.getByRole('button', { name: 'Stop sk-alice' })
    ).toHaveProperty('disabled', false);
  });

  it('asks for a snapshot name, offering one made of the id and the time', async () => {
    const { server, model } = await sandboxesModel([sandbox()]);
    server.json('POST', '/base/api/sandboxes/sk-alice/snapshots', {
      name: 'offered',
      size: 3 * 2 ** 20
    });
    render(
      <SandboxActions
        sandbox={model.sandboxes[0]}
        model={model}
        trans={trans}
        onBrowse={() => undefined}
      />
    );
    await userEvent.click(
      screen.getByRole('button', { name: 'Snapshot sk-alice' })
    );
    const input = await waitFor(
      () => document.querySelector('.jp-Dialog input') as HTMLInputElement
    );
    expect(input.value).toMatch(/^alice-\d{12}$/);
    await answerDialog('Snapshot sk-alice', true);
    await waitFor(() =>
      expect(notifications('success')).toEqual([
        'Snapshot offered saved (3.00\u00a0MiB)'
      ])
    );
    const post = server.requests.find(r => r.method === 'POST');
    expect(JSON.parse(post!.body)).toEqual({ name: input.value });
  });

  it('destroys only after the user agrees, saying the workspace is kept', async () => {
    const { server, model } = await sandboxesModel([sandbox({ kernels: 2 })]);
    server.on(
      'DELETE',
      '/base/api/sandboxes/sk-alice',
      () => new Response(null, { status: 204 })
    );
    render(
      <SandboxActions
        sandbox={model.sandboxes[0]}
        model={model}
        trans={trans}
        onBrowse={() => undefined}
      />
    );
    const destroy = screen.getByRole('button', { name: 'Destroy sk-alice' });
    await userEvent.click(destroy);
    expect(document.querySelector('.jp-Dialog-body')?.textContent).toMatch(
      /Your files in \/workspace are kept\. 2 kernels using it will lose their variables\./
    );
    await answerDialog('Destroy sk-alice?', false);
    expect(calls(server)).not.toContain('DELETE /base/api/sandboxes/sk-alice');
    await userEvent.click(destroy);
    await answerDialog('Destroy sk-alice?', true);
    await waitFor(() =>
      expect(calls(server)).toContain('DELETE /base/api/sandboxes/sk-alice')
    );
    await waitFor(() =>
      expect(notifications('success')).toEqual([
        'Destroyed sk-alice; its workspace is kept'
      ])
    );
  });
});

// -- SandboxCard -----------------------------------------------------------
describe('SandboxCard', () => {
  it('names the sandbox and its state, then its facts, actions, ports and WebDAV URL', async () => {
    const { server, model } = await sandboxesModel([sandbox()]);
    server.json('GET', '/base/api/sandboxes/sk-alice/ports', {
      sandbox_id: 'sk-alice',
      state: 'running',
      ports: [
        {
          port: 8000,
          address: '0.0.0.0',
          reachable: true,
          url: '/base/sandbox-kernel/proxy/sk-alice/8000/'
        }
      ],
      preview: true,
      preview_note: ''
    });
    render(
      <ul>
        <SandboxCard
          sandbox={model.sandboxes[0]}
          model={model}
          trans={trans}
          onBrowse={() => undefined}
        />
      </ul>
    );
    const card = screen.getByRole('listitem', {
      name: 'sandbox sk-alice, running'
    });
    expect(card.dataset.sandboxId).toBe('sk-alice');
    expect(card.tabIndex).toBe(0);
    expect(card.querySelector('.jp-SandboxPanel-name')?.textContent).toBe(
      'sk-alice'
    );
    screen.getByRole('img', { name: 'running' });
    expect(card.querySelector('.jp-SandboxPanel-state')?.textContent).toBe(
      'running'
    );
    expect(card.querySelector('.jp-SandboxPanel-folder')?.textContent).toBe(
      '/workspace'
    );
    // Tab order: the card's buttons, its ports, then the copy button at its foot.
    await screen.findByRole('link', {
      name: 'Open port 8000 of sk-alice in a new tab'
    });
    const controls = Array.from(card.querySelectorAll('button, a')).map(
      b => b.getAttribute('aria-label') ?? ''
    );
    expect(controls).toEqual([
      'Stop sk-alice',
      'Browse files of sk-alice',
      'Snapshot sk-alice',
      'Destroy sk-alice',
      'Read the listening ports of sk-alice again',
      'Open port 8000 of sk-alice in a new tab',
      'Copy the WebDAV URL of sk-alice'
    ]);
    expect(card.querySelector('.jp-SandboxPanel-davUrl')?.textContent).toBe(
      'http://lab.test/base/sandbox-kernel/dav/sk-alice/'
    );
  });

  it('is marked while revealed and says it is working while an action runs', async () => {
    const { server, model } = await sandboxesModel([sandbox()]);
    let finish: () => void = () => undefined;
    server.on(
      'POST',
      '/base/api/sandboxes/sk-alice/stop',
      () =>
        new Promise<Response>(resolve => {
          finish = () =>
            resolve(new Response(JSON.stringify(sandbox()), { status: 200 }));
        })
    );
    const view = () => (
      <ul>
        <SandboxCard
          sandbox={model.sandboxes[0]}
          model={model}
          trans={trans}
          onBrowse={() => undefined}
        />
      </ul>
    );
    const { rerender, container } = render(view());
    model.changed.connect(() => rerender(view()));
    const card = container.querySelector('li') as HTMLElement;
    expect(card.className).toBe('jp-SandboxPanel-card');
    model.reveal('sk-alice');
    await waitFor(() =>
      expect(card.className).toContain('jp-SandboxPanel-revealed')
    );
    await userEvent.click(
      screen.getByRole('button', { name: 'Stop sk-alice' })
    );
    await waitFor(() => expect(card.className).toContain('jp-mod-busy'));
    expect(card.querySelector('.jp-SandboxPanel-state')?.textContent).toBe(
      'working…'
    );
    finish();
    await waitFor(() => expect(card.className).not.toContain('jp-mod-busy'));
  });

  it('wraps a long id rather than cutting it', async () => {
    const id = 'sk-alice--t0123456789ab--w0123abcd';
    const { model } = await sandboxesModel([sandbox({ id })]);
    const { container } = render(
      <ul>
        <SandboxCard
          sandbox={model.sandboxes[0]}
          model={model}
          trans={trans}
          onBrowse={() => undefined}
        />
      </ul>
    );
    const name = container.querySelector(
      '.jp-SandboxPanel-name'
    ) as HTMLElement;
    expect(name.textContent).toBe(id);
    expect(name.title).toBe('');
  });
});

// -- DavLink ---------------------------------------------------------------
const URL_ = 'http://lab.test:8888/user/alice/sandbox-kernel/dav/sk-alice/';

/** Give the page a clipboard whose writeText does ``write`` (jsdom has none). */
function clipboard(write: (text: string) => Promise<void>): void {
  Object.defineProperty(navigator, 'clipboard', {
    configurable: true,
    value: { writeText: write }
  });
}

/** Let the copy's promise settle and React draw what it changed. */
async function settle(): Promise<void> {
  await act(async () => {
    await Promise.resolve();
  });
}

afterEach(() => {
  delete (navigator as any).clipboard;
  vi.useRealTimers();
});

describe('DavLink', () => {
  it('shows the whole URL, its copy button and how to mount it', () => {
    const { container } = render(
      <DavLink id="sk-alice" url={URL_} trans={trans} />
    );
    const code = container.querySelector(
      '.jp-SandboxPanel-davUrl'
    ) as HTMLElement;
    expect(code.textContent).toBe(URL_);
    expect(code.title).toBe(URL_);
    // It may wrap after its slashes; the text stays the URL.
    expect(code.querySelectorAll('wbr').length).toBeGreaterThan(3);
    screen.getByRole('button', { name: 'Copy the WebDAV URL of sk-alice' });
    expect(container.textContent).toContain('your Jupyter token as password');
  });

  it('copies the URL and says so for a while', async () => {
    // Only the timeouts: jsdom's animation frames must keep their real timer.
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    const written: string[] = [];
    clipboard(async text => {
      written.push(text);
    });
    render(<DavLink id="sk-alice" url={URL_} trans={trans} />);
    const status = screen.getByRole('status');
    expect(status.textContent).toBe('');
    fireEvent.click(
      screen.getByRole('button', { name: 'Copy the WebDAV URL of sk-alice' })
    );
    await settle();
    expect(written).toEqual([URL_]);
    expect(status.textContent).toBe('Copied');
    expect(status.className).toContain('jp-mod-copied');
    act(() => vi.advanceTimersByTime(COPIED_MS - 100));
    expect(status.textContent).toBe('Copied');
    act(() => vi.advanceTimersByTime(200));
    expect(status.textContent).toBe('');
  });

  it('selects the URL for a copy by hand when no clipboard works', async () => {
    clipboard(() => Promise.reject(new DOMException('no', 'NotAllowedError')));
    const { container } = render(
      <DavLink id="sk-alice" url={URL_} trans={trans} />
    );
    fireEvent.click(
      screen.getByRole('button', { name: 'Copy the WebDAV URL of sk-alice' })
    );
    await settle();
    expect(screen.getByRole('status').textContent).toBe(
      'No clipboard access: copy the selected URL by hand'
    );
    const code = container.querySelector('.jp-SandboxPanel-davUrl');
    expect(window.getSelection()?.toString()).toBe(URL_);
    expect(window.getSelection()?.anchorNode).toBe(code);
  });
});

// -- SandboxList -----------------------------------------------------------
function show(model: SandboxesModel): HTMLElement {
  return render(
    <SandboxList model={model} trans={trans} onBrowse={() => undefined} />
  ).container;
}

describe('SandboxList', () => {
  it('says it is loading before the first answer', () => {
    const model = new SandboxesModel({
      api: new SandboxAPI(new FakeServer().settings()),
      poll: false
    });
    expect(show(model).textContent).toBe('Loading…');
  });

  it('says how to make a first sandbox when there is none', async () => {
    const { model } = await sandboxesModel([]);
    expect(show(model).textContent).toMatch(
      /No sandboxes\. Run a cell in a notebook with the “Python 3 \(sandbox\)” kernel/
    );
  });

  it('lists one card per sandbox', async () => {
    const { model } = await sandboxesModel([
      sandbox(),
      sandbox({ id: 'sk-alice--t1', scope: 'thread', state: 'stopped' })
    ]);
    show(model);
    const list = screen.getByRole('list', { name: 'Sandboxes' });
    expect(
      Array.from(list.children).map(c => (c as HTMLElement).dataset.sandboxId)
    ).toEqual(['sk-alice', 'sk-alice--t1']);
  });

  it('shows the error and no stale list when the server stops answering', async () => {
    const { server, model } = await sandboxesModel([sandbox()]);
    server.down = true;
    await model.update();
    const container = show(model);
    expect(screen.getByRole('alert').textContent).toMatch(
      /^Server unreachable.*Retrying with backoff/
    );
    expect(container.querySelector('.jp-SandboxPanel-card')).toBeNull();
  });
});

// -- SandboxesView ---------------------------------------------------------
let view: SandboxesView | null = null;

afterEach(() => {
  view?.dispose();
  view = null;
});

describe('SandboxesView', () => {
  it('draws the list again on each change, and reveals a card by focusing it', async () => {
    const { server, model } = await sandboxesModel([sandbox()]);
    view = new SandboxesView(model, trans, () => undefined);
    Widget.attach(view, document.body);
    expect(view.node.className).toContain('jp-SandboxPanel-body');
    await waitFor(() =>
      expect(view!.node.querySelectorAll('.jp-SandboxPanel-card').length).toBe(
        1
      )
    );
    server.json('GET', '/base/api/sandboxes', [
      sandbox(),
      sandbox({ id: 'sk-alice--t1' })
    ]);
    await model.update();
    await waitFor(() =>
      expect(view!.node.querySelectorAll('.jp-SandboxPanel-card').length).toBe(
        2
      )
    );
    model.reveal('sk-alice--t1');
    await waitFor(() =>
      expect(
        (document.activeElement as HTMLElement | null)?.dataset.sandboxId
      ).toBe('sk-alice--t1')
    );
    expect(document.activeElement?.className).toContain(
      'jp-SandboxPanel-revealed'
    );
  });
});
