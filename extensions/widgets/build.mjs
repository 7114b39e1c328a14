// Bundles each widget into one ES module under pathways_nb/viz/static/, so the wheel
// carries everything the browser needs: no CDN, no network at run time.
import { build } from "esbuild";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(here, "../../pathways_nb/viz/static");
mkdirSync(out, { recursive: true });

await build({
  entryPoints: ["timeline", "graph", "status", "devices"].map((n) => resolve(here, "src", `${n}.js`)),
  outdir: out,
  bundle: true,
  format: "esm",
  minify: true,
  legalComments: "none",
  target: "es2020",
  logLevel: "warning",
});
// graph.js carries @viz-js/viz and, inside it, Graphviz: their notices travel with it.
const viz = JSON.parse(readFileSync(resolve(here, "node_modules/@viz-js/viz/package.json"), "utf8"));
writeFileSync(
  resolve(out, "THIRD_PARTY_NOTICES.txt"),
  [
    "graph.js bundles third-party code:",
    "",
    `- ${viz.name} ${viz.version} (${viz.homepage ?? "https://github.com/mdaines/viz-js"}),`,
    `  licence ${viz.license}. Copyright (c) Michael Daines.`,
    "- Graphviz, compiled to WebAssembly inside it (https://graphviz.org),",
    "  licence Eclipse Public License 2.0 (https://www.eclipse.org/legal/epl-2.0/).",
    "  Source: https://gitlab.com/graphviz/graphviz",
    "",
  ].join("\n"),
);
