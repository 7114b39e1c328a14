// Who is who in the timeline: a swatch of each tenant's colour (as the timeline draws its
// programs) and its name, and the grey of transfers.
import { PALETTE } from '../../widgets/src/common.js';
import { TimelineRow } from '../../widgets/src/timeline.js';

export function legend(rows: TimelineRow[], tenants: Record<string, string>): HTMLElement {
  const box = document.createElement('div');
  box.className = 'pw-legend';
  const item = (colour: string, text: string, cls: string) => {
    const span = document.createElement('span');
    span.className = cls;
    const swatch = document.createElement('i');
    swatch.style.background = colour;
    span.append(swatch, text);
    box.appendChild(span);
  };
  const seen = [...new Set(rows.filter(r => r.kind === 'program').map(r => r.tenant))];
  for (const t of seen.sort((a, b) => a - b)) {
    item(PALETTE[t % PALETTE.length], `tenant ${t} ${tenants[String(t)] ?? ''}`.trim(), 'pw-legend-tenant');
  }
  if (rows.some(r => r.kind === 'transfer')) item('#999', 'transfers', 'pw-legend-transfer');
  return box;
}
