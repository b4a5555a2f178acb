/** Icons of the panel; the jp-icon3 class lets the theme pick their colour. */
import { LabIcon } from '@jupyterlab/ui-components';

const sandboxSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M12 2 3 6.5v11L12 22l9-4.5v-11L12 2zm0 2.24 6.53 3.26L12 10.76 5.47 7.5 12 4.24zM5 9.12l6 3v7.76l-6-3V9.12zm8 10.76v-7.76l6-3v7.76l-6 3z"/>
  </g>
</svg>`;

const cameraSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M9 3 7.17 5H4a2 2 0 0 0-2 2v12a2 2 0 0 0 2 2h16a2 2 0 0 0 2-2V7a2 2 0 0 0-2-2h-3.17L15 3H9zm3 4.5a5.5 5.5 0 1 1 0 11 5.5 5.5 0 0 1 0-11zm0 2a3.5 3.5 0 1 0 0 7 3.5 3.5 0 0 0 0-7z"/>
  </g>
</svg>`;

const filesSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M10 4H4a2 2 0 0 0-2 2v12a2 2 0 0 0 2 2h16a2 2 0 0 0 2-2V8a2 2 0 0 0-2-2h-8l-2-2zm-6 4h16v10H4V8z"/>
  </g>
</svg>`;

export const sandboxIcon = new LabIcon({
  name: 'sandbox-kernel:sandbox',
  svgstr: sandboxSvg
});
export const cameraIcon = new LabIcon({
  name: 'sandbox-kernel:camera',
  svgstr: cameraSvg
});
export const filesIcon = new LabIcon({
  name: 'sandbox-kernel:files',
  svgstr: filesSvg
});
