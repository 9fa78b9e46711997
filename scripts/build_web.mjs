// Builds the app's custom element: web/metrics-view.jsx (JSX) into plain JavaScript the page
// loads once (public/serving-lab-metrics.js), and Chainlit's small stand-in for it
// (public/elements/Metrics.jsx, from web/Metrics.template.jsx) naming that build's version.
//
//   node scripts/build_web.mjs           # write both files
//   node scripts/build_web.mjs --check   # exit 1 if the committed files differ from a build now
//
// Needs `npm ci` (sucrase, the JSX transform Chainlit's own element runner uses).
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { transform } from "sucrase";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const SOURCE = "web/metrics-view.jsx";
const TEMPLATE = "web/Metrics.template.jsx";
const BUILT = "public/serving-lab-metrics.js";
const ELEMENT = "public/elements/Metrics.jsx";

function build() {
  const source = readFileSync(join(root, SOURCE), "utf8");
  const code = transform(source, { transforms: ["jsx"], production: true, disableESTransforms: true, filePath: SOURCE }).code;
  const version = createHash("sha256").update(code).digest("hex").slice(0, 12);
  const built = `// Built from ${SOURCE} by scripts/build_web.mjs: do not edit, edit the source and build.\n` +
    `(() => {\n${code.trimEnd()}\n\nconst lab = (window.ServingLab = window.ServingLab || {});\n` +
    `lab.builds = Object.assign(lab.builds || {}, { "${version}": defineView });\n})();\n`;
  const element = readFileSync(join(root, TEMPLATE), "utf8").replace("__VERSION__", version);
  return { [BUILT]: built, [ELEMENT]: element };
}

const files = build();
if (process.argv.includes("--check")) {
  const stale = Object.entries(files).filter(([path, text]) => {
    try {
      return readFileSync(join(root, path), "utf8") !== text;
    } catch {
      return true;
    }
  }).map(([path]) => path);
  if (stale.length) {
    console.error(`not built from ${SOURCE} as it is now: ${stale.join(", ")}; run: node scripts/build_web.mjs`);
    process.exit(1);
  }
  console.log(`${BUILT} and ${ELEMENT} match ${SOURCE}`);
} else {
  for (const [path, text] of Object.entries(files)) writeFileSync(join(root, path), text);
  console.log(`built ${BUILT} and ${ELEMENT} from ${SOURCE}`);
}
