// The page's own scripts, loaded with every page by `custom_js` in .chainlit/config.toml (Chainlit
// takes one), in the page's head, before Chainlit's own code runs.
//
// 1. The live tap (ui/live_tap.py). Chainlit re-renders every message of a chat, Markdown and
//    all, for each update of any element, and its message tree for each piece of text; ten updates
//    of the figures a second kept the page busy drawing them in a long chat, and the last text of
//    a fast reply waited behind Chainlit's drawing. So the page taps its own socket: once it has
//    offered (a window message, which Chainlit passes to the app) and the app has answered, a
//    reply's text comes as `lab_text` events and every refresh of its figures (the final one too)
//    as `lab_live` events, or with a piece of text when one falls due while text streams, which
//    only the figures' view reads (window.ServingLab.live): it shows
//    the text above the figures until Chainlit's final update of the message brings the whole
//    text, when the page drops its copy (the same frame, so one drawing swaps them). An `element`
//    event for an id drops the live props held for it: what arrived last is shown. Only frames on
//    a WebSocket are seen: a page offers once its socket carries messages on one, and the app
//    sends this way only while that socket is on a WebSocket (else through Chainlit, as before).
//    The tap also hands Chainlit the events that start a reply in one task (one drawing, not four),
//    and the app sends a reply's figures element ahead, while the page is idle (ui/session_view.py
//    `ready_next_figures`): with ten replies on the page those drawings took 60-100 ms of main
//    thread at the start of every reply, and a fast reply's text waited behind them.
// 2. The names and roles Chainlit's page leaves out (serving-lab-a11y.js), and the custom element's
//    built view (serving-lab-metrics.js, from web/metrics-view.jsx), so the first reply or compare
//    round on a fresh page does not wait for it while it streams (its last token reached the page
//    117-150 ms late in the first of three 4-column rounds, 31-37 ms in the others).
//    The element's own loader (3.) still loads the view it names if this copy is missing or older.
//    The stand-in's source is read once per page (Chainlit fetched it at every element's mount,
//    and drew the element only once the busy app had answered).
// 3. The custom element's one lasting type (`ServingLab.element`), which Chainlit's stand-in
//    public/elements/Metrics.jsx asks for. Chainlit compiles the stand-in's source again (sucrase)
//    each time the element re-renders, which many of Chainlit's events cause for every element on
//    the page: 1.9 KB of loader there cost the page 8 ms of main thread per reply with ten replies
//    on it; the loader here is read once per page and the stand-in is four lines (2 ms).
// ---- the live tap (servers/browser.py serve_without_live_tap serves this file without it, for controls)
(() => {
  const lab = (window.ServingLab = window.ServingLab || {});
  if (lab.live) return;
  const held = new Map(); // element id -> the latest live props
  const texts = new Map(); // element id -> the reply's text so far, until its message's final update
  const textOf = new Map(); // message id -> the element id whose view shows its text
  const listeners = new Map(); // element id -> Set of callbacks
  const tell = (id) => (listeners.get(id) || []).forEach((listener) => listener(held.get(id)));
  // A reply's text is drawn at the end of the task its frame arrived in. An update the view makes
  // from a socket event goes in a render task of React's own, queued behind whatever Chainlit has
  // scheduled (at the start of a fast reply, its drawing of the new message). React (the page's,
  // 18) draws an update made while a discrete event (`input`) is dispatched at once, before the
  // next task, and only the components it touches; dispatched on an EventTarget of the tap's own,
  // no one else sees it. Frame to DOM, median: 2 ms instead of 3 (120 replies at 2000 and 5000
  // tokens/s; docs/engineers/class-burst.md). A piece that comes before Chainlit has drawn the
  // reply's message still waits for that drawing: the view does not exist yet.
  const urgent = new EventTarget();
  urgent.addEventListener("input", (event) => tell(event.detail));
  const tellNow = (id) => urgent.dispatchEvent(new CustomEvent("input", { detail: id }));
  lab.live = {
    props: (id) => held.get(id),
    text: (id) => texts.get(id),
    subscribe(id, listener) {
      if (!listeners.has(id)) listeners.set(id, new Set());
      listeners.get(id).add(listener);
      return () => {
        const set = listeners.get(id);
        set.delete(listener);
        if (!set.size) listeners.delete(id);
      };
    },
    acked: null, // the WebSocket on which the app agreed to send live props
  };

  // The offer goes once a WebSocket carries socket.io messages (Chainlit's socket starts on
  // long-polling and moves to a WebSocket), again on each new one (a reconnect), until answered.
  const OFFER = { servingLab: "serving-lab-live-tap", version: 3 };
  const TRIES = 5;
  let current = null; // the WebSocket that carries the chat now
  const offer = (socket, tries) => {
    if (lab.live.acked === socket || current !== socket || tries <= 0) return;
    window.postMessage(OFFER, window.location.origin);
    setTimeout(() => offer(socket, tries - 1), 2000);
  };
  // socket.io on engine.io: '42["name",data]' is an event. Parsed only for the kinds the tap acts on.
  const frame = (socket, data) => {
    if (current !== socket) {
      current = socket;
      offer(socket, TRIES);
    }
    if (data.startsWith('42["lab_live",')) {
      const { id, props } = JSON.parse(data.slice(2))[1];
      held.set(id, props);
      tell(id);
    } else if (data.startsWith('42["lab_text",')) {
      // A refresh of the figures that fell due while text streams comes with the text: one drawing.
      const { id, for: message, text, props } = JSON.parse(data.slice(2))[1];
      texts.set(id, (texts.get(id) || "") + text);
      textOf.set(message, id);
      if (props) held.set(id, props);
      tellNow(id);
    } else if (data.startsWith('42["element",') || data.startsWith('42["remove_element",')) {
      // No one is told: Chainlit renders the element with these props next, and the view, reading
      // what is held as it renders, then finds nothing newer.
      const element = JSON.parse(data.slice(2))[1];
      if (element) held.delete(element.id);
    } else if (textOf.size && data.startsWith('42["update_message",')) {
      // The message's final update: Chainlit draws its whole text next, in the same drawing as
      // the view that drops its copy.
      const step = JSON.parse(data.slice(2))[1];
      const id = step && textOf.get(step.id);
      if (id !== undefined) {
        textOf.delete(step.id);
        texts.delete(id);
        tell(id);
      }
    } else if (data.startsWith('42["lab_live_ack",')) {
      lab.live.acked = socket;
    }
  };
  // A reply starts with several of Chainlit's events in a row (task_start, the run step, the
  // message, its figures element unless the app sent it ahead), each of which makes Chainlit draw
  // the whole chat again. On a tapped page Chainlit gets them in one go, from task_start up to the
  // assistant's message or an element, or HOLD_MS, whichever comes first, so React draws them once;
  // any other event hands over what is held first, in order (lab_live is the tap's: it waits too).
  const HOLD_MS = 40;
  const MOUNTING = ['42["new_message",', '42["element",', '42["lab_live",'];
  const ENDS_MOUNT = /^42\["element",|^42\["new_message",\{[^]*?"type":\s*"assistant_message"/;
  let held_frames = null; // [socket, event] pairs Chainlit has not been given yet
  let timer = null;
  const give = (socket, event) => socket.chainlitHandler && socket.chainlitHandler.call(socket, event);
  const release = () => {
    const frames = held_frames;
    held_frames = null;
    clearTimeout(timer);
    for (const [socket, event] of frames || []) give(socket, event);
  };
  const deliver = (socket, event) => {
    const data = typeof event.data === "string" ? event.data : "";
    if (held_frames) {
      if (!data.startsWith("4") || MOUNTING.some((kind) => data.startsWith(kind))) {
        held_frames.push([socket, event]);
        if (ENDS_MOUNT.test(data)) release();
        return;
      }
      release();
    } else if (lab.live.acked === socket && data.startsWith('42["task_start"')) {
      held_frames = [[socket, event]];
      timer = setTimeout(release, HOLD_MS);
      return;
    }
    give(socket, event);
  };
  const NativeWebSocket = window.WebSocket;
  window.WebSocket = class extends NativeWebSocket {
    constructor(...args) {
      super(...args);
      this.addEventListener("message", (event) => {
        if (typeof event.data !== "string" || !event.data.startsWith("4")) return; // engine.io messages only
        try {
          frame(this, event.data);
        } catch (error) {
          console.warn("serving-lab live tap: a frame it could not read", error);
        }
      });
    }
    get onmessage() {
      return this.chainlitHandler || null;
    }
    set onmessage(handler) {
      if (this.chainlitHandler === undefined) this.addEventListener("message", (event) => deliver(this, event));
      this.chainlitHandler = handler;
    }
  };
})();
// ---- end of the live tap
(() => {
  for (const src of ["/public/serving-lab-a11y.js", "/public/serving-lab-metrics.js"]) {
    const script = document.createElement("script");
    script.src = src;
    document.head.appendChild(script);
  }
})();
(() => {
  // Chainlit fetches the stand-in's source each time it mounts a custom element (every reply's
  // figures), and draws the element only once that answer is in: with the app busy streaming the
  // reply, the first text waited on it. The page reads it once (at load) and answers from memory.
  const STAND_IN = "/public/elements/Metrics.jsx";
  const nativeFetch = window.fetch;
  let source = null; // a promise of the stand-in's source text
  const read = (input, init) => {
    const answer = nativeFetch.call(window, input, init);
    source = answer.then((response) => (response.ok ? response.clone().text() : Promise.reject(response)));
    source.catch(() => (source = null));
    return answer;
  };
  window.fetch = function (input, init) {
    const url = typeof input === "string" ? input : input instanceof Request ? input.url : String(input);
    const method = (init && init.method) || (input instanceof Request ? input.method : "GET");
    if (method.toUpperCase() !== "GET" || !new URL(url, window.location.href).pathname.endsWith(STAND_IN)) {
      return nativeFetch.apply(this, arguments);
    }
    if (!source) return read(input, init);
    const ask = () => nativeFetch.call(window, input, init); // the first read failed: as Chainlit would
    return source.then((text) => new Response(text, { status: 200, headers: { "Content-Type": "text/javascript" } }), ask);
  };
  const here = document.currentScript && document.currentScript.src;
  if (here) read(new URL(STAND_IN.slice(1), new URL("../", here)).href, { credentials: "include" });
})();
(() => {
  const lab = (window.ServingLab = window.ServingLab || {});
  const kept = (lab.kept = lab.kept || {}); // build version -> {View, Element}
  // The element for the view build `version`, made with the page's React and Chainlit's Markdown
  // (the stand-in passes them). It loads that build's script unless the page has it, and renders
  // nothing until it has come; React keeps it in place across the stand-in's evaluations.
  lab.element = (version, React, Markdown) => {
    if (kept[version]) return kept[version].Element;
    const { createElement, useEffect, useState } = React;
    const view = () => {
      const define = lab.builds && lab.builds[version];
      if (!kept[version].View && define) kept[version].View = define(React, Markdown);
      return kept[version].View || null;
    };
    kept[version] = {
      View: null,
      Element: function ServingLabElement({ data, api }) {
        const [View, setView] = useState(view);
        useEffect(() => {
          if (View) return undefined;
          let script = document.querySelector(`script[data-serving-lab="${version}"]`);
          if (!script) {
            script = document.createElement("script");
            script.src = `/public/serving-lab-metrics.js?v=${version}`;
            script.dataset.servingLab = version;
            document.head.appendChild(script);
          }
          const ready = () => setView(view);
          script.addEventListener("load", ready);
          ready();
          return () => script.removeEventListener("load", ready);
        }, [View]);
        return View ? createElement(View, { data, api }) : null;
      },
    };
    return kept[version].Element;
  };
})();
