// Live figures next to a reply. `props` is injected globally by Chainlit.
// The server refreshes it ~10 times per second while streaming, then once more
// with the final, frozen measurement (see timing.py for the definitions).
const LABELS = {
  en: {
    ttft: "TTFT", rate: "tokens/s", tokens: "tokens", elapsed: "elapsed", tpot: "ms/token",
    queued: (n) => `queued: ${n} ahead`, starting: "sending…", streaming: "streaming",
    completed: "done", stopped: "stopped", error: "failed", estimated: "≈ estimated count",
    finish: "finish", server: "server counted",
  },
  zh: {
    ttft: "首 token 时间", rate: "tokens/秒", tokens: "tokens", elapsed: "耗时", tpot: "毫秒/token",
    queued: (n) => `排队中：前面还有 ${n} 个`, starting: "发送中…", streaming: "生成中",
    completed: "完成", stopped: "已停止", error: "失败", estimated: "≈ 估算的数量",
    finish: "结束原因", server: "服务端计数",
  },
};

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Math.round(ms)} ms`;
}

function fmt(value, digits) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

export default function Metrics() {
  const t = LABELS[props.lang] || LABELS.en;
  const state = props.state || "starting";
  const live = state === "streaming" || state === "queued" || state === "starting";
  // Inline styles: Chainlit's prebuilt Tailwind only has the classes its own UI uses.
  const dotColor = {
    starting: "#eab308", queued: "#eab308", streaming: "#3b82f6",
    completed: "#16a34a", stopped: "#f97316", error: "#dc2626",
  }[state] || "#9ca3af";
  const status = state === "queued" ? t.queued(props.queuePosition) : t[state] || state;
  const cell = (label, value, testid) => (
    <div style={{ display: "flex", flexDirection: "column", minWidth: "6.5rem" }} data-testid={testid}>
      <span className="text-muted-foreground" style={{ fontSize: "11px" }}>{label}</span>
      <span className="font-mono" style={{ fontVariantNumeric: "tabular-nums" }}>{value}</span>
    </div>
  );
  return (
    <div className="serving-lab-metrics rounded-md border text-sm"
         style={{ padding: "6px 12px", margin: "4px 0" }} data-state={state} data-testid="metrics">
      <div className="text-muted-foreground"
           style={{ display: "flex", alignItems: "center", gap: "6px", marginBottom: "4px", fontSize: "12px" }}>
        <span style={{ display: "inline-block", width: 8, height: 8, borderRadius: 4, background: dotColor }} />
        <span data-testid="metrics-status">{status}</span>
        <span>·</span>
        <span data-testid="metrics-backend">{props.backend}</span>
        {props.model ? <span className="font-mono" data-testid="metrics-model">{props.model}</span> : null}
      </div>
      <div style={{ display: "flex", flexWrap: "wrap", columnGap: "18px", rowGap: "4px" }}>
        {cell(t.ttft, fmtMs(props.ttftMs), "metrics-ttft")}
        {cell(t.rate, fmt(props.tokensPerS, 1), "metrics-rate")}
        {cell(t.tokens, `${props.tokens ?? 0}${props.tokensExact === false ? " ≈" : ""}`, "metrics-tokens")}
        {cell(t.elapsed, fmtMs(props.elapsedMs), "metrics-elapsed")}
        {!live && cell(t.tpot, fmt(props.msPerToken, 1), "metrics-tpot")}
      </div>
      {!live && (props.finishReason || props.disagreement || props.tokensExact === false) ? (
        <div className="text-muted-foreground" style={{ marginTop: "4px", fontSize: "12px" }}>
          {props.finishReason ? <span>{t.finish}: {props.finishReason} </span> : null}
          {props.serverTokens !== null && props.serverTokens !== undefined
            ? <span>· {t.server}: {props.serverTokens} </span> : null}
          {props.tokensExact === false ? <span>· {t.estimated} </span> : null}
          {props.disagreement ? <span style={{ color: "#ea580c" }} data-testid="metrics-disagreement">· ⚠ {props.disagreement}</span> : null}
        </div>
      ) : null}
    </div>
  );
}
