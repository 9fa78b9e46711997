// The app's custom element (live figures, compare rounds, the engine panel), as Chainlit loads it.
// Written by `node scripts/build_web.mjs` from web/Metrics.template.jsx: edit the view in
// web/metrics-view.jsx, then build. Chainlit evaluates this file again on every update of the
// element's props, so it is kept tiny: it loads the built view once per page
// (/public/serving-lab-metrics.js) and exports an element of one lasting type, which React
// re-renders in place instead of re-mounting (see web/metrics-view.jsx).
import { useEffect, useState } from "react";
import { Markdown } from "@/components/markdown";

const VERSION = "52378d120666";
const SCRIPT = `/public/serving-lab-metrics.js?v=${VERSION}`;
const lab = (window.ServingLab = window.ServingLab || {});
const kept = (lab.kept = lab.kept || {});

if (!kept[VERSION]) {
  const view = () => {
    const define = lab.builds && lab.builds[VERSION];
    if (!kept[VERSION].View && define) kept[VERSION].View = define(React, Markdown);
    return kept[VERSION].View || null;
  };
  kept[VERSION] = {
    View: null,
    Element: function ServingLabElement({ data, api }) {
      const [View, setView] = useState(view);
      useEffect(() => {
        if (View) return undefined;
        let script = document.querySelector(`script[data-serving-lab="${VERSION}"]`);
        if (!script) {
          script = document.createElement("script");
          script.src = SCRIPT;
          script.dataset.servingLab = VERSION;
          document.head.appendChild(script);
        }
        const ready = () => setView(view);
        script.addEventListener("load", ready);
        ready();
        return () => script.removeEventListener("load", ready);
      }, [View]);
      return View ? <View data={data} api={api} /> : null;
    },
  };
}

const Element = kept[VERSION].Element;
export default <Element data={props} api={{ callAction }} />;
