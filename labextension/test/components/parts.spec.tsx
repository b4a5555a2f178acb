// @vitest-environment jsdom
/**
 * The small parts of the panel: buttons, state dots, meters, facts, breakable text,
 * the error banner and upload progress.
 */
import { deleteIcon } from '@jupyterlab/ui-components';
import { render, screen } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import * as React from 'react';
import { describe, expect, it, vi } from 'vitest';

import { ApiError } from '../../src/api';
import { ActionButton } from '../../src/components/ActionButton';
import { Breakable, breakParts } from '../../src/components/Breakable';
import { ErrorBanner } from '../../src/components/ErrorBanner';
import { Fact } from '../../src/components/Fact';
import { Meter } from '../../src/components/Meter';
import { StateDot } from '../../src/components/StateDot';
import { UploadProgress } from '../../src/components/UploadProgress';
import { trans } from './helpers';

// -- ActionButton ----------------------------------------------------------
describe('ActionButton', () => {
  it('is named by its label, shown as its tooltip, and clicks', async () => {
    const onClick = vi.fn();
    render(
      <ActionButton
        icon={deleteIcon}
        label="Destroy sk-alice"
        className="jp-mod-danger"
        onClick={onClick}
      />
    );
    const button = screen.getByRole('button', { name: 'Destroy sk-alice' });
    expect(button.title).toBe('Destroy sk-alice');
    expect(button.className).toContain('jp-mod-danger');
    expect(button.querySelector('svg')).not.toBeNull();
    await userEvent.click(button);
    expect(onClick).toHaveBeenCalledTimes(1);
  });

  it('does nothing while disabled', async () => {
    const onClick = vi.fn();
    render(
      <ActionButton icon={deleteIcon} label="x" onClick={onClick} disabled />
    );
    await userEvent.click(screen.getByRole('button', { name: 'x' }));
    expect(onClick).not.toHaveBeenCalled();
  });
});

// -- StateDot --------------------------------------------------------------
describe('StateDot', () => {
  it('colours by state and says the state in words', () => {
    render(<StateDot state="stopped" label="stopped" />);
    const dot = screen.getByRole('img', { name: 'stopped' });
    expect(dot.className).toBe(
      'jp-SandboxPanel-dot jp-SandboxPanel-dot-stopped'
    );
    expect(dot.title).toBe('stopped');
  });
});

// -- Meter -----------------------------------------------------------------
function width(fraction: number): string {
  const { container } = render(<Meter fraction={fraction} />);
  const meter = container.querySelector(
    '.jp-SandboxPanel-meter'
  ) as HTMLElement;
  expect(meter.getAttribute('aria-hidden')).toBe('true');
  return (meter.firstElementChild as HTMLElement).style.width;
}

describe('Meter', () => {
  it('fills in whole percent, within 0 and 100', () => {
    expect(width(0.254)).toBe('25%');
    expect(width(0)).toBe('0%');
    expect(width(1)).toBe('100%');
    expect(width(3)).toBe('100%');
    expect(width(-1)).toBe('0%');
  });
});

// -- Fact ------------------------------------------------------------------
describe('Fact', () => {
  it('is a label and its value in the card’s list', () => {
    const { container } = render(
      <dl>
        <Fact label="Next" className="jp-SandboxPanel-next" title="idle 15m">
          stops in 12m
        </Fact>
      </dl>
    );
    const [dt, dd] = Array.from(container.querySelector('dl')!.children);
    expect(dt.tagName).toBe('DT');
    expect(dt.textContent).toBe('Next');
    expect(dd.tagName).toBe('DD');
    expect(dd.textContent).toBe('stops in 12m');
    expect(dd.className).toBe('jp-SandboxPanel-next');
    expect((dd as HTMLElement).title).toBe('idle 15m');
  });
});

// -- Breakable -------------------------------------------------------------
describe('Breakable', () => {
  it.each([
    ['/home/alice/analysis', ['/home/', 'alice/', 'analysis']],
    [
      'http://127.0.0.1:8888/sandbox-kernel/dav/sk-alice/',
      ['http://', '127.0.0.1:', '8888/', 'sandbox-kernel/', 'dav/', 'sk-alice/']
    ],
    ['python:3.12-slim', ['python:', '3.12-slim']],
    ['user@host:/srv', ['user@', 'host:/', 'srv']],
    ['snake_case_name', ['snake_', 'case_', 'name']],
    ['plain', ['plain']],
    ['', ['']]
  ])('splits %j after its separators', (text, parts) => {
    expect(breakParts(text)).toEqual(parts);
    expect(breakParts(text).join('')).toBe(text);
  });

  it('renders the same text with a line-break chance between the parts', () => {
    const text = 'registry.example.org/team/image:tag';
    const { container } = render(
      <code>
        <Breakable text={text} />
      </code>
    );
    const code = container.querySelector('code') as HTMLElement;
    expect(code.textContent).toBe(text);
    expect(code.querySelectorAll('wbr').length).toBe(3);
    expect(code.innerHTML).toBe(
      'registry.example.org/<wbr>team/<wbr>image:<wbr>tag'
    );
  });
});

// -- ErrorBanner -----------------------------------------------------------
describe('ErrorBanner', () => {
  it('says what the status means, the server’s words and what happens next', () => {
    render(
      <ErrorBanner
        error={new ApiError(503, 'the Docker engine does not answer')}
        trans={trans}
        hint="Retrying."
      />
    );
    const parts = Array.from(screen.getByRole('alert').children);
    expect(parts.map(p => p.textContent)).toEqual([
      'Sandbox engine unavailable',
      'the Docker engine does not answer',
      'Retrying.'
    ]);
  });

  it('names an unreachable server as such, without a hint when none is given', () => {
    render(
      <ErrorBanner
        error={new ApiError(0, 'the Jupyter server does not answer')}
        trans={trans}
      />
    );
    const alert = screen.getByRole('alert');
    expect(alert.querySelector('strong')?.textContent).toBe(
      'Server unreachable'
    );
    expect(alert.querySelector('.jp-SandboxPanel-hint')).toBeNull();
  });
});

// -- UploadProgress --------------------------------------------------------
describe('UploadProgress', () => {
  it('is a progress bar named by the file, with its size and percent', () => {
    render(
      <UploadProgress
        upload={{ name: 'big.bin', size: 24 * 2 ** 20, fraction: 0.416 }}
        trans={trans}
      />
    );
    const bar = screen.getByRole('progressbar', { name: 'Uploading big.bin' });
    expect(bar.getAttribute('aria-valuenow')).toBe('42');
    expect(bar.textContent).toBe('big.bin · 24.0\u00a0MiB · 42%');
    expect(
      (bar.querySelector('.jp-SandboxPanel-meter > span') as HTMLElement).style
        .width
    ).toBe('42%');
  });
});
