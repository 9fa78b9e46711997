// Chainlit's stand-in for the app's element (figures, compare rounds, engines), built from
// web/Metrics.template.jsx by scripts/build_web.mjs; public/serving-lab.js makes the element.
import { Markdown } from "@/components/markdown";
const Element = window.ServingLab.element("4f26d70b359f", React, Markdown);
export default <Element data={props} api={{ callAction }} />;
