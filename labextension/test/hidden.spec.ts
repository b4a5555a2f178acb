import { describe, expect, it } from 'vitest';

import {
  DEFAULT_HIDDEN_FILES,
  globToRegExp,
  hiddenNameFilter
} from '../src/hidden';

describe('hidden names', () => {
  it('reads globs as fnmatch does, over the whole name', () => {
    expect(globToRegExp('*.pyc').test('mod.cpython-312.pyc')).toBe(true);
    expect(globToRegExp('*.pyc').test('mod.pyc.txt')).toBe(false);
    expect(globToRegExp('*~').test('notes.txt~')).toBe(true);
    expect(globToRegExp('data?.csv').test('data1.csv')).toBe(true);
    expect(globToRegExp('data?.csv').test('data10.csv')).toBe(false);
    expect(globToRegExp('[ab]*').test('beta')).toBe(true);
    expect(globToRegExp('[!ab]*').test('beta')).toBe(false);
    expect(globToRegExp('[!ab]*').test('gamma')).toBe(true);
    expect(globToRegExp('[a-c]x').test('bx')).toBe(true);
    expect(globToRegExp('[]]').test(']')).toBe(true);
    // Regular expression characters are literal; an unclosed "[" too.
    expect(globToRegExp('a.b').test('axb')).toBe(false);
    expect(globToRegExp('(x)+$').test('(x)+$')).toBe(true);
    expect(globToRegExp('[abc').test('[abc')).toBe(true);
    expect(globToRegExp('__pycache__').test('__pycache__')).toBe(true);
  });

  it('leaves out what JupyterLab leaves out by default', () => {
    const isHidden = hiddenNameFilter();
    for (const name of [
      '.ipynb_checkpoints',
      '__pycache__',
      'm.pyc',
      'm.pyo',
      '.DS_Store',
      'a.txt~',
      '.bashrc',
      '.local'
    ]) {
      expect(isHidden(name), name).toBe(true);
    }
    for (const name of [
      'hello.txt',
      'analysis.ipynb',
      'data',
      'x.py',
      'pycache',
      'a~b'
    ]) {
      expect(isHidden(name), name).toBe(false);
    }
    expect(DEFAULT_HIDDEN_FILES).toContain('.ipynb_checkpoints');
  });

  it('shows dot-names on request, never the patterns', () => {
    const isHidden = hiddenNameFilter({ showHidden: true });
    expect(isHidden('.bashrc')).toBe(false);
    expect(isHidden('.ipynb_checkpoints')).toBe(true);
    expect(isHidden('__pycache__')).toBe(true);
    const custom = hiddenNameFilter({
      patterns: ['*.log', ''],
      showHidden: true
    });
    expect(custom('run.log')).toBe(true);
    expect(custom('.ipynb_checkpoints')).toBe(false);
    expect(custom('')).toBe(false);
  });
});
