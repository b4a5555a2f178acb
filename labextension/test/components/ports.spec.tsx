// @vitest-environment jsdom
/**
 * A card's listening ports (SandboxPorts, which reads them, and PortList, which shows
 * them), over the real API client on a fake server: what is shown, the links, and when
 * the ports are asked for (never on the list's own polls).
 */
import { act, fireEvent, render, screen } from '@testing-library/react';
import * as React from 'react';
import { afterEach, describe, expect, it, vi } from 'vitest';

import { ISandbox, SandboxAPI } from '../../src/api';
import { PortList } from '../../src/components/PortList';
import {
  ACTIVITY_GAP_MS,
  SandboxPorts
} from '../../src/components/SandboxPorts';
import { FakeServer, jsonResponse, sandbox } from '../server';
import { calls, trans } from './helpers';

const PORTS = '/base/api/sandboxes/sk-alice/ports';

function listing(ports: unknown[], extra: Record<string, unknown> = {}): any {
  return {
    sandbox_id: 'sk-alice',
    state: 'running',
    ports,
    preview: true,
    preview_note: '',
    ...extra
  };
}

function port(n: number, address = '0.0.0.0'): any {
  return {
    port: n,
    address,
    reachable: address !== '127.0.0.1' && address !== '::1',
    url: `/base/sandbox-kernel/proxy/sk-alice/${n}/`
  };
}

/** Let the fake server answer and React draw it (the timers may be fake). */
async function settle(): Promise<void> {
  await act(async () => {
    for (let i = 0; i < 20; i++) {
      await new Promise(resolve => setImmediate(resolve));
    }
  });
}

/** SandboxPorts over a fake server answering ``answer``, drawn again by ``redraw``. */
function mount(
  s: ISandbox,
  answer: unknown = listing([port(8000)]),
  visible = true
): {
  server: FakeServer;
  reads: () => number;
  redraw: (s: ISandbox, visible?: boolean) => void;
} {
  const server = new FakeServer().json('GET', PORTS, answer);
  const api = new SandboxAPI(server.settings());
  const view = (current: ISandbox, shown: boolean) => (
    <SandboxPorts sandbox={current} api={api} trans={trans} visible={shown} />
  );
  const { rerender } = render(view(s, visible));
  return {
    server,
    reads: () => calls(server).filter(c => c === `GET ${PORTS}`).length,
    redraw: (next, shown = true) => rerender(view(next, shown))
  };
}

afterEach(() => {
  vi.useRealTimers();
});

describe('SandboxPorts', () => {
  it('lists the ports with links that open their previews in a new tab', async () => {
    const { reads } = mount(
      sandbox(),
      listing([port(8000), port(8501, '::'), port(5432, '127.0.0.1')])
    );
    await settle();
    const link = screen.getByRole('link', {
      name: 'Open port 8000 of sk-alice in a new tab'
    }) as HTMLAnchorElement;
    expect(link.href).toBe(
      'http://lab.test/base/sandbox-kernel/proxy/sk-alice/8000/'
    );
    expect(link.target).toBe('_blank');
    expect(link.rel.split(' ').sort()).toEqual(['noopener', 'noreferrer']);
    expect(link.textContent).toBe('8000');
    screen.getByRole('link', {
      name: 'Open port 8501 of sk-alice in a new tab'
    });
    // Loopback only: no link, and the note says what to do.
    expect(screen.queryByRole('link', { name: /port 5432/ })).toBeNull();
    const loopback = document.querySelector(
      '[data-port="5432"]'
    ) as HTMLElement;
    expect(loopback.textContent).toBe(
      '5432listens on 127.0.0.1 only: start it on 0.0.0.0 to preview it'
    );
    expect(reads()).toBe(1);
    expect(screen.getByRole('status').textContent).toBe('');
  });

  it('says when nothing listens, and when the server serves no previews', async () => {
    mount(sandbox(), listing([]));
    await settle();
    expect(
      document.querySelector('.jp-SandboxPanel-portsNone')?.textContent
    ).toBe(
      'Nothing listens on a port yet. Start a web app on 0.0.0.0 and it shows here.'
    );
    document.body.innerHTML = '';
    const note =
      "the local backend cannot reach a sandbox's ports, so it serves no previews";
    mount(
      sandbox({ backend: 'local' }),
      listing([port(8000)], { preview: false, preview_note: note })
    );
    await settle();
    expect(
      document.querySelector('.jp-SandboxPanel-portsNote')?.textContent
    ).toBe(note);
    expect(screen.queryByRole('link')).toBeNull();
    expect(document.querySelector('[data-port="8000"]')?.textContent).toBe(
      '8000'
    );
  });

  it('shows the server’s message when the ports cannot be read', async () => {
    const server = new FakeServer().on('GET', PORTS, () =>
      jsonResponse({ message: 'sandbox sk-alice belongs to another user' }, 403)
    );
    render(
      <SandboxPorts
        sandbox={sandbox()}
        api={new SandboxAPI(server.settings())}
        trans={trans}
        visible={true}
      />
    );
    await settle();
    expect(
      document.querySelector('.jp-SandboxPanel-portsError')?.textContent
    ).toBe('Not allowed: sandbox sk-alice belongs to another user');
  });

  it('reads nothing for a sandbox that is not running, and reads when it starts', async () => {
    const { reads, redraw, server } = mount(sandbox({ state: 'stopped' }));
    await settle();
    expect(document.querySelector('.jp-SandboxPanel-ports')).toBeNull();
    expect(server.requests).toEqual([]);
    redraw(sandbox({ state: 'running' }));
    await settle();
    expect(reads()).toBe(1);
    screen.getByRole('link', {
      name: 'Open port 8000 of sk-alice in a new tab'
    });
    redraw(sandbox({ state: 'stopped' }));
    await settle();
    expect(document.querySelector('.jp-SandboxPanel-ports')).toBeNull();
  });

  it('reads once per showing, not on the list’s polls; the button reads again', async () => {
    const { reads, redraw } = mount(sandbox());
    await settle();
    for (let i = 0; i < 3; i++) {
      redraw(sandbox()); // a poll: the same sandbox, drawn again
      await settle();
    }
    expect(reads()).toBe(1);
    fireEvent.click(
      screen.getByRole('button', {
        name: 'Read the listening ports of sk-alice again'
      })
    );
    await settle();
    expect(reads()).toBe(2);
    // Hidden, it reads nothing; shown again, it reads.
    redraw(sandbox(), false);
    await settle();
    expect(reads()).toBe(2);
    redraw(sandbox(), true);
    await settle();
    expect(reads()).toBe(3);
  });

  it('reads again after the sandbox was used, at most every ACTIVITY_GAP_MS', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'Date'] });
    const { reads, redraw } = mount(sandbox({ last_activity: 2000 }));
    await settle();
    expect(reads()).toBe(1);
    redraw(sandbox({ last_activity: 2001 })); // a cell ran
    await settle();
    act(() => vi.advanceTimersByTime(ACTIVITY_GAP_MS - 1));
    await settle();
    expect(reads()).toBe(1);
    redraw(sandbox({ last_activity: 2002 })); // and another, meanwhile
    await settle();
    act(() => vi.advanceTimersByTime(1));
    await settle();
    expect(reads()).toBe(2);
    // Used again long after: read at once; not used: never again.
    act(() => vi.advanceTimersByTime(10 * ACTIVITY_GAP_MS));
    redraw(sandbox({ last_activity: 2100 }));
    await settle();
    act(() => vi.advanceTimersByTime(0));
    await settle();
    expect(reads()).toBe(3);
    act(() => vi.advanceTimersByTime(10 * ACTIVITY_GAP_MS));
    await settle();
    expect(reads()).toBe(3);
  });
});

describe('PortList', () => {
  it('wraps nothing it needs into a tooltip: the note is text in the card', () => {
    const api = new SandboxAPI(new FakeServer().settings());
    render(
      <PortList
        sandbox={sandbox()}
        found={{ ports: [port(3000, '::1')], preview: true, note: '' }}
        api={api}
        trans={trans}
      />
    );
    const line = document.querySelector('[data-port="3000"]') as HTMLElement;
    expect(line.title).toBe('');
    expect(line.textContent).toContain('listens on ::1 only');
  });
});
