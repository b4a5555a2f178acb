import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    environment: 'node',
    include: ['test/**/*.spec.ts'],
    // @jupyterlab packages ship ES modules without "type": "module": let vite transform them.
    server: { deps: { inline: [/@jupyterlab\//] } }
  }
});
