// Names and roles Chainlit's own page leaves out, for screen readers and keyboards.
// Loaded on every page by `custom_js` in .chainlit/config.toml. Chainlit 2.12 draws several buttons
// as an icon alone (new chat, history, search, settings, send, stop, copy, feedback, scroll down):
// a screen reader announces each as "button", with no name. axe-core (run on every view by
// scripts/screenshots.py) flags them, and a few more of its markup slips (a div with aria-expanded
// but no role, a list whose items are divs, a scrolling table a keyboard cannot reach).
// This adds the missing names and roles, after each change of the page, at most ~4 times a second
// (a streaming reply changes the page often; this does nothing for a node already named).
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

  function fix() {
    for (const id of ["new-chat-button", "sidebar-trigger-button", "search-chats-button", "chat-settings-open-modal",
                      "chat-submit", "stop-button"]) {
      const element = document.getElementById(id);
      if (element) name(element, id);
    }
    for (const button of document.querySelectorAll("button")) {
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
    for (const element of document.querySelectorAll('div#thread-options, div[type="button"][aria-haspopup]')) {
      if (!element.getAttribute("role")) element.setAttribute("role", "button");
      name(element, "thread-options");
    }
    // The history list's groups: divs directly in a list are list items.
    for (const child of document.querySelectorAll('ul[data-sidebar="menu"] > div:not([role])')) {
      child.setAttribute("role", "listitem");
    }
    // A wide table scrolls sideways: a keyboard must be able to reach it to scroll it (whether it
    // scrolls changes with the window's width, so every table's box takes focus).
    for (const box of document.querySelectorAll("div.relative.w-full.overflow-auto:not([tabindex])")) {
      if (box.querySelector("table")) box.setAttribute("tabindex", "0");
    }
  }

  let pending = null;
  const later = () => { if (pending === null) pending = setTimeout(() => { pending = null; fix(); }, 250); };
  new MutationObserver(later).observe(document.documentElement, { subtree: true, childList: true });
  window.addEventListener("resize", later);
  document.addEventListener("DOMContentLoaded", fix);
  fix();
})();
