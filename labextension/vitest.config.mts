import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    // The data layer runs in node; the component tests (test/components/) say
    // `@vitest-environment jsdom` at their top, with what jsdom lacks in setup-dom.ts.
    environment: 'node',
    include: ['test/**/*.spec.{ts,tsx}'],
    setupFiles: ['test/setup-dom.ts'],
    // @jupyterlab packages (and @jupyter/web-components, which ui-components imports) ship
    // ES modules without "type": "module": let vite transform them.
    server: { deps: { inline: [/@jupyterlab\//, /@jupyter\/web-components/] } }
  }
});
