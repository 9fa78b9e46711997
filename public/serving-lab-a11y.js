// Names and roles Chainlit's own page leaves out, for screen readers and keyboards.
// Loaded on every page by `custom_js` in .chainlit/config.toml. Chainlit 2.12 draws several buttons
// as an icon alone (new chat, history, search, settings, send, stop, copy, feedback, scroll down):
// a screen reader announces each as "button", with no name. axe-core (run on every view by
// scripts/screenshots.py) flags them, and a few more of its markup slips (a div with aria-expanded
// but no role, a list whose items are divs, a scrolling table a keyboard cannot reach).
// This adds the missing names and roles to each element as it is added to the page (a few
// selector checks per added element; nothing for text that streams into an existing one).
(() => {
  const zh = (navigator.language || "").toLowerCase().startsWith("zh");
  const NAMES = zh ? {
    "new-chat-button": "新对话", "sidebar-trigger-button": "显示或隐藏对话记录", "search-chats-button": "搜索对话",
    "chat-settings-open-modal": "设置", "chat-submit": "发送", "stop-button": "停止", "thread-options": "对话选项",
    copy: "复制", copied: "已复制", password: "显示或隐藏密码", good: "有帮助", bad: "没有帮助", down: "滚动到最新消息", close: "关闭",
  } : {
    "new-chat-button": "New chat", "sidebar-trigger-button": "Show or hide the chat history",
    "search-chats-button": "Search chats", "chat-settings-open-modal": "Settings", "chat-submit": "Send message",
    "stop-button": "Stop", "thread-options": "Chat options",
    copy: "Copy", copied: "Copied", password: "Show or hide the password", good: "Helpful", bad: "Not helpful", down: "Scroll to the newest message",
    close: "Close",
  };
  // Icon-only buttons without an id, told apart by their class or their lucide icon.
  const BY_LOOK = [
    [".positive-feedback-on, .positive-feedback-off", "good"],
    [".negative-feedback-on, .negative-feedback-off", "bad"],
    ["svg.lucide-copy", "copy"], ["svg.lucide-check", "copied"],
    ["svg.lucide-arrow-down", "down"], ["svg.lucide-x", "close"],
    ["svg.lucide-eye, svg.lucide-eye-off", "password"],
  ];

  const hasName = (element) =>
    element.getAttribute("aria-label") || element.getAttribute("aria-labelledby") || element.getAttribute("title") ||
    (element.textContent || "").trim();

  function name(element, key) {
    if (!hasName(element) && NAMES[key]) element.setAttribute("aria-label", NAMES[key]);
  }

  // `root` itself and the elements under it that match `selector`.
  const within = (root, selector) =>
    [...(root.matches && root.matches(selector) ? [root] : []), ...root.querySelectorAll(selector)];

  function fix(root) {
    for (const id of ["new-chat-button", "sidebar-trigger-button", "search-chats-button", "chat-settings-open-modal",
                      "chat-submit", "stop-button"]) {
      for (const element of within(root, `#${id}`)) name(element, id);
    }
    for (const button of within(root, "button")) {
      if (hasName(button)) continue;
      for (const [selector, key] of BY_LOOK) {
        if (button.matches(selector) || button.querySelector(selector)) { name(button, key); break; }
      }
      // The login page's eye beside the password.
      if (!hasName(button) && button.parentElement && button.parentElement.querySelector("input#password")) {
        name(button, "password");
      }
    }
    // The history's "…" menu: a div Chainlit makes act as a button (aria-expanded needs the role).
    // It sits inside the chat's own link-button, so it stays out of the Tab order (no tabindex).
    for (const element of within(root, 'div#thread-options, div[type="button"][aria-haspopup]')) {
      if (!element.getAttribute("role")) element.setAttribute("role", "button");
      name(element, "thread-options");
    }
    // The history list's groups: divs directly in a list are list items.
    for (const child of within(root, 'ul[data-sidebar="menu"] > div:not([role])')) {
      child.setAttribute("role", "listitem");
    }
    // A wide table scrolls sideways: a keyboard must be able to reach it to scroll it (whether it
    // scrolls changes with the window's width, so every table's box takes focus).
    for (const table of within(root, "table")) {
      const box = table.closest("div.relative.w-full.overflow-auto");
      if (box && !box.hasAttribute("tabindex")) box.setAttribute("tabindex", "0");
    }
  }

  // Each added element is fixed as it arrives, before the page is drawn again: an element that
  // re-renders (a streaming reply, the engine panel) is never shown, or read, without its names.
  new MutationObserver((mutations) => {
    for (const mutation of mutations) {
      for (const node of mutation.addedNodes) {
        if (node.nodeType !== 1) continue;
        fix(node);
        const button = node.parentElement && node.parentElement.closest("button");  // an icon drawn into it later
        if (button) fix(button);
      }
    }
  }).observe(document.documentElement, { subtree: true, childList: true });
  fix(document);
})();
