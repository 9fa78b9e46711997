// The page's own scripts, loaded with every page by `custom_js` in .chainlit/config.toml (Chainlit
// takes one): the names and roles Chainlit's page leaves out (serving-lab-a11y.js), and the custom
// element's built view (serving-lab-metrics.js, from web/metrics-view.jsx), so the first reply or
// compare round on a fresh page does not wait for it while it streams (its last token reached the
// page 117-150 ms late in the first of three 4-column rounds, 31-37 ms in the others).
// public/elements/Metrics.jsx still loads the view it names itself if this copy is missing or older.
(() => {
  for (const src of ["/public/serving-lab-a11y.js", "/public/serving-lab-metrics.js"]) {
    const script = document.createElement("script");
    script.src = src;
    document.head.appendChild(script);
  }
})();
