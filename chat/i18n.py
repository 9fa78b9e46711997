"""The app's own UI strings in English and Simplified Chinese.

Chainlit translates its own chrome (.chainlit/translations); these are the
strings this app adds. The language comes from the browser (session.language).
"""

from __future__ import annotations

STRINGS: dict[str, dict[str, str]] = {
    "en": {
        "backend": "Backend",
        "backend_help": "Which serving stack answers. Applies from the next message; the conversation stays.",
        "unavailable": "unavailable",
        "temperature": "Temperature",
        "top_p": "Top-p",
        "max_new_tokens": "Max new tokens",
        "top_k": "Top-k (optional)",
        "min_p": "Min-p (optional)",
        "repetition_penalty": "Repetition penalty (optional)",
        "seed": "Seed (optional)",
        "optional_placeholder": "empty = not sent",
        "optional_help": "{minimum}..{maximum}. Empty: not sent, the engine's own default applies. An engine that cannot honour it says so next to the reply.",
        "settings_rejected": "⚠️ These settings were not applied (the previous ones stay in effect):\n{problems}\n\nFix them in the settings panel and confirm again.",
        "none_set": "none",
        "system_preset": "System prompt preset",
        "system_preset_help": "Presets live in prompts/. A custom system prompt below wins over the preset.",
        "system_custom": "Custom system prompt",
        "system_custom_placeholder": "Leave empty to use the preset",
        "status_title": "**Backends**",
        "status_ok": "ready · `{model}` · context {context} tokens{version}",
        "status_down": "unavailable: {reason}",
        "loading_model": "Loading the llama.cpp model `{name}`…",
        "loaded_model": "llama.cpp model `{name}` loaded in {seconds:.1f} s (shared by all sessions).",
        "settings_applied": "Settings apply from your next message: **{backend}**, temperature {temperature}, top-p {top_p}, max {max_new_tokens} new tokens, optional settings: {optional}, system prompt: {system}.",
        "trimmed": "Trimmed {dropped} earlier message(s) so the conversation fits {backend}'s context of {context} tokens.",
        "capped": "Only {tokens} new tokens fit in {backend}'s context; the reply is capped there.",
        "error_title": "⚠️ **{backend}** could not answer.",
        "error_keep": "Your message is kept: press **Retry** (after switching backend in the settings if you like), or just send the next message.",
        "retry": "Retry",
        "retry_gone": "Nothing to retry.",
        "unknown_backend": "{error}",
        "custom": "custom (below)",
    },
    "zh": {
        "backend": "后端",
        "backend_help": "由哪个推理服务回答。从下一条消息开始生效，对话历史保留。",
        "unavailable": "不可用",
        "temperature": "温度 (temperature)",
        "top_p": "Top-p",
        "max_new_tokens": "最大生成 token 数",
        "top_k": "Top-k（可选）",
        "min_p": "Min-p（可选）",
        "repetition_penalty": "重复惩罚（可选）",
        "seed": "随机种子（可选）",
        "optional_placeholder": "留空 = 不发送",
        "optional_help": "{minimum}..{maximum}。留空则不发送，使用引擎自己的默认值。引擎不支持时会在回复旁说明。",
        "settings_rejected": "⚠️ 以下设置未生效（仍使用之前的设置）：\n{problems}\n\n请在设置面板中修改后再次确认。",
        "none_set": "无",
        "system_preset": "系统提示词预设",
        "system_preset_help": "预设位于 prompts/ 目录。下方填写的自定义系统提示词优先于预设。",
        "system_custom": "自定义系统提示词",
        "system_custom_placeholder": "留空则使用预设",
        "status_title": "**后端状态**",
        "status_ok": "就绪 · `{model}` · 上下文 {context} tokens{version}",
        "status_down": "不可用：{reason}",
        "loading_model": "正在加载 llama.cpp 模型 `{name}`……",
        "loaded_model": "llama.cpp 模型 `{name}` 已加载，用时 {seconds:.1f} 秒（所有会话共享）。",
        "settings_applied": "设置将从下一条消息开始生效：**{backend}**，温度 {temperature}，top-p {top_p}，最多 {max_new_tokens} 个新 token，可选设置：{optional}，系统提示词：{system}。",
        "trimmed": "为适应 {backend} 的上下文长度（{context} tokens），已省略前面的 {dropped} 条消息。",
        "capped": "{backend} 的上下文只够再生成 {tokens} 个 token，回复将在此截止。",
        "error_title": "⚠️ **{backend}** 无法回答。",
        "error_keep": "您的消息已保留：点击 **重试**（可先在设置中切换后端），或直接发送下一条消息。",
        "retry": "重试",
        "retry_gone": "没有可重试的消息。",
        "unknown_backend": "{error}",
        "custom": "自定义（见下方）",
    },
}


def language_of(locale: str | None) -> str:
    """'zh-CN' / 'zh' -> 'zh'; anything else -> 'en'."""
    return "zh" if (locale or "").lower().startswith("zh") else "en"


def text(key: str, lang: str = "en", **values: object) -> str:
    template = STRINGS.get(lang, STRINGS["en"]).get(key) or STRINGS["en"][key]
    return template.format(**values) if values else template
