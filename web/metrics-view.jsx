// Live figures next to a reply, a compare round's columns side by side, and the engine panel:
// every component of the app's one custom element. Chainlit shows the element through
// public/elements/Metrics.jsx, a small stand-in that hands this view the element's props (`data`)
// and Chainlit's `callAction` (`api`); this file is built (JSX to plain JavaScript, by
// `node scripts/build_web.mjs`) into public/serving-lab-metrics.js, which the page loads once.
//
// Why not the whole view in Metrics.jsx, as Chainlit's docs show: Chainlit transpiles and
// evaluates an element's .jsx again on every update of its props (about ten times a second while a
// reply streams), and each evaluation made a new component, so React re-mounted the element.
// Profiled in chromium, that took ~80 ms of the page's main thread per reply, and the last token of
// a 2000 tok/s reply reached the page 100-300 ms after the server sent it. Built once and loaded
// once, the components keep their identity: React re-renders only what changed.
//
// The server refreshes the props ~10 times per second while streaming (on the page's tapped
// socket, past Chainlit's elements: `useLatest`), then once more with the final, frozen
// measurement and the reply's timeline (see core/timing.py for the definitions). The timeline is
// drawn only from the final props, so nothing heavy renders while a reply streams. On a tapped
// page the reply's text streams here too, above the figures, until the message's final update. With
// `kind === "compare"` the element is a grid with one column per
// backend (core/rounds.py decides what a blind round may show).

// Every component, made with the page's own React and Chainlit's Markdown (the stand-in passes them).
function defineView(React, Markdown) {
  const { memo, useEffect, useLayoutEffect, useRef, useState } = React;

  const LABELS = {
    en: {
      ttft: "TTFT", rate: "tokens/s", tokens: "tokens", elapsed: "elapsed", tpot: "TPOT ms/token",
      queued: (n) => `queued: ${n} ahead`, starting: "sending…", streaming: "streaming",
      completed: "done", stopped: "stopped", error: "failed", estimated: "≈ estimated count",
      finish: "finish", server: "server counted", showTimeline: "timeline ▸", hideTimeline: "timeline ▾",
      requestSent: "request sent", firstByte: "first byte", firstToken: "first token", end: "end of generation",
      closed: "stream closed",
      prepared: "prepared before the clock",
      itlTitle: "Gaps between tokens (inter-token latency, ITL)", median: "median", p90: "p90", p99: "p99",
      stall: "longest stall", afterTokens: (n) => `after token ${n}`, gapAxis: "gap (ms)", tokenAxis: "token →",
      perPoint: (k) => `each bar = the longest of ${k} gaps`,
      ours: "this app (client)", theirs: "server", notReported: "not reported",
      queue: "queue", prompt: "prompt processing", decode: "decode time", inference: "inference",
      perToken: "time per output token", decodeRate: "decode tokens/s", outputRate: "output tokens/s (incl. prefill)",
      promptRate: "prompt tokens/s", outTokens: "output tokens", inTokens: "prompt tokens",
      cachedTokens: "prompt tokens from cache", computedTokens: "prompt tokens computed",
      prompt: "prompt tokens", fromCache: (n) => `${n} cached`, cacheNotReported: "cache not reported",
      prefill: "prefill tokens/s", pending: "…",
      sent: "sent to the engine", noServer: "This engine reported no figures of its own for this reply.",
      engineAtStart: "engine when the request left",
      compareRound: "Compare", blindRound: "Blind round", sequential: "one after another", concurrent: "all at once",
      revealFinished: "text shown when every column has finished", revealPace: "text shown at one common pace",
      generating: "generating…", waiting: "waiting", better: "better", tie: "Tie", bothBad: "Both bad", allBad: "All bad",
      good: "good", bad: "bad", comment: "Comment (optional)", voted: "Your vote", won: (l) => `${l} better`,
      voteHint: "Which answer is better? Names and figures appear after your vote.", voteHintNamed: "Which answer is better?",
    },
    zh: {
      ttft: "首 token 时间", rate: "tokens/秒", tokens: "tokens", elapsed: "耗时", tpot: "TPOT 毫秒/token",
      queued: (n) => `排队中：前面还有 ${n} 个`, starting: "发送中…", streaming: "生成中",
      completed: "完成", stopped: "已停止", error: "失败", estimated: "≈ 估算的数量",
      finish: "结束原因", server: "服务端计数", showTimeline: "时间线 ▸", hideTimeline: "时间线 ▾",
      requestSent: "请求发出", firstByte: "首字节", firstToken: "首 token", end: "生成结束", closed: "流关闭",
      prepared: "计时开始前的准备",
      itlTitle: "token 之间的间隔（ITL）", median: "中位数", p90: "p90", p99: "p99",
      stall: "最长停顿", afterTokens: (n) => `第 ${n} 个 token 之后`, gapAxis: "间隔（毫秒）", tokenAxis: "token →",
      perPoint: (k) => `每根柱 = ${k} 个间隔中的最大值`,
      ours: "本应用（客户端）", theirs: "服务端", notReported: "未报告",
      queue: "排队", prompt: "提示词处理", decode: "解码时间", inference: "推理",
      perToken: "每个输出 token 的时间", decodeRate: "解码 tokens/秒", outputRate: "输出 tokens/秒（含预填充）",
      promptRate: "提示词 tokens/秒", outTokens: "输出 tokens", inTokens: "提示词 tokens",
      cachedTokens: "来自缓存的提示词 tokens", computedTokens: "重新计算的提示词 tokens",
      prompt: "提示词 tokens", fromCache: (n) => `${n} 个来自缓存`, cacheNotReported: "缓存未报告",
      prefill: "预填充 tokens/秒", pending: "…",
      sent: "发送给引擎的参数", noServer: "该引擎没有为这条回复报告自己的数据。",
      engineAtStart: "请求发出时引擎的状态",
      compareRound: "比较", blindRound: "盲评", sequential: "依次运行", concurrent: "同时运行",
      revealFinished: "所有列完成后显示文本", revealPace: "以相同节奏显示文本",
      generating: "生成中…", waiting: "等待中", better: "更好", tie: "平局", bothBad: "都不好", allBad: "都不好",
      good: "好", bad: "差", comment: "评论（可选）", voted: "你的投票", won: (l) => `${l} 更好`,
      voteHint: "哪个回答更好？投票后显示名称和指标。", voteHintNamed: "哪个回答更好？",
    },
  };

  const FINAL = ["completed", "stopped", "error"];
  const MAX_BARS = 240;

  function fmtMs(ms) {
    if (ms === null || ms === undefined) return "–";
    return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms < 10 ? ms.toFixed(1) : Math.round(ms)} ms`;
  }

  function fmt(value, digits) {
    return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
  }

  // What the prompt cost, from the engine's own report: "412 · 380 cached"; "not reported" once the
  // reply has ended without the engine saying (until then it may still say, on its last chunk).
  function promptText(prompt, final, t) {
    if (!prompt || prompt.tokens === null || prompt.tokens === undefined) return final ? t.notReported : t.pending;
    const cached = prompt.cached === null || prompt.cached === undefined ? t.cacheNotReported : t.fromCache(prompt.cached);
    return `${prompt.tokens} · ${cached}`;
  }

  function prefillText(prompt, final, t) {
    if (!prompt || prompt.prefillTokensPerS === null || prompt.prefillTokensPerS === undefined) {
      return final ? t.notReported : t.pending;
    }
    return fmt(prompt.prefillTokensPerS, 0);
  }

  // Inline styles: Chainlit's prebuilt Tailwind only has the classes its own UI uses.
  function Cell({ label, value, testid }) {
    return (
      <div style={{ display: "flex", flexDirection: "column", minWidth: "6.5rem" }} data-testid={testid}>
        <span className="text-muted-foreground" style={{ fontSize: "11px" }}>{label}</span>
        <span className="font-mono" style={{ fontVariantNumeric: "tabular-nums" }}>{value}</span>
      </div>
    );
  }

  // Gaps between successive token chunks, max-pooled into at most MAX_BARS bars so a stall stays visible.
  function gapBars(chunkTimesMs) {
    const gaps = [];
    for (let i = 1; i < chunkTimesMs.length; i++) gaps.push(chunkTimesMs[i] - chunkTimesMs[i - 1]);
    const perBar = Math.max(1, Math.ceil(gaps.length / MAX_BARS));
    const bars = [];
    for (let i = 0; i < gaps.length; i += perBar) bars.push(Math.max(...gaps.slice(i, i + perBar)));
    return { bars, perBar };
  }

  function GapChart({ timeline, t }) {
    const { bars, perBar } = gapBars(timeline.chunkTimesMs || []);
    if (!bars.length || !timeline.itl) return null;
    const itl = timeline.itl;
    const width = 600, height = 110, left = 40, bottom = 16, top = 6;
    const top_ms = Math.max(...bars, itl.medianMs * 2) || 1;
    const y = (ms) => top + (height - top - bottom) * (1 - ms / top_ms);
    const barWidth = (width - left) / bars.length;
    return (
      <svg viewBox={`0 0 ${width} ${height}`} style={{ width: "100%", maxWidth: "640px", height: "auto" }}
           data-testid="metrics-gap-chart" role="img" aria-label={t.itlTitle}>
        <line x1={left} y1={y(0)} x2={width} y2={y(0)} stroke="currentColor" strokeOpacity="0.3" />
        <text x={left - 4} y={y(top_ms) + 8} fontSize="9" textAnchor="end" fill="currentColor">{Math.round(top_ms)}</text>
        <text x={left - 4} y={y(0)} fontSize="9" textAnchor="end" fill="currentColor">0</text>
        <text x={2} y={height / 2} fontSize="9" fill="currentColor">{t.gapAxis}</text>
        <text x={width - 2} y={height - 3} fontSize="9" textAnchor="end" fill="currentColor">{t.tokenAxis}</text>
        {bars.map((ms, i) => (
          <rect key={i} x={left + i * barWidth} y={y(ms)} width={Math.max(barWidth - 0.5, 0.5)}
                height={Math.max(y(0) - y(ms), 0.5)}
                fill={ms >= itl.maxMs ? "#dc2626" : "#3b82f6"} fillOpacity="0.75" />
        ))}
        <line x1={left} x2={width} y1={y(itl.medianMs)} y2={y(itl.medianMs)} stroke="#16a34a" strokeDasharray="4 3" />
        <text x={width - 2} y={y(itl.medianMs) - 2} fontSize="9" textAnchor="end" fill="#16a34a">
          {t.median} {fmtMs(itl.medianMs)}
        </text>
        {perBar > 1 ? <text x={left + 2} y={top + 8} fontSize="9" fill="currentColor">{t.perPoint(perBar)}</text> : null}
      </svg>
    );
  }

  function Milestones({ timeline, t }) {
    const total = timeline.totalMs || 1;
    // Time 0 is when the request left (the clock starts then; preparing it came before).
    const marks = [
      [t.requestSent, timeline.requestSentMs, "#a855f7", "timeline-request-sent"],
      [t.firstByte, timeline.firstByteMs, "#9ca3af", "timeline-first-byte"],
      [t.firstToken, timeline.firstTokenMs, "#3b82f6", "timeline-first-token"],
      [t.end, timeline.lastChunkMs, "#16a34a", "timeline-end"],
      [t.closed, timeline.totalMs, "#6b7280", "timeline-closed"],
    ].filter((m) => m[1] !== null && m[1] !== undefined);
    return (
      <div style={{ margin: "4px 0" }}>
        <div style={{ position: "relative", height: "6px", background: "rgba(127,127,127,0.2)", borderRadius: "3px" }}>
          {(timeline.chunkTimesMs || []).length > 1 ? (
            <div style={{ position: "absolute", left: `${(100 * timeline.firstTokenMs) / total}%`,
                          width: `${(100 * ((timeline.lastChunkMs || total) - timeline.firstTokenMs)) / total}%`,
                          top: 0, bottom: 0, background: "#3b82f6", opacity: 0.35, borderRadius: "3px" }} />
          ) : null}
          {marks.map(([label, ms, color]) => (
            <div key={label} title={`${label}: ${fmtMs(ms)}`}
                 style={{ position: "absolute", left: `calc(${(100 * ms) / total}% - 1px)`, top: "-3px",
                          width: "2px", height: "12px", background: color }} />
          ))}
        </div>
        <div style={{ display: "flex", flexWrap: "wrap", columnGap: "14px", fontSize: "12px", marginTop: "4px" }}>
          {timeline.prepareMs !== null && timeline.prepareMs !== undefined ? (
            <span className="text-muted-foreground">{t.prepared}: <span className="font-mono">{fmtMs(timeline.prepareMs)}</span></span>
          ) : null}
          {marks.map(([label, ms, color, testid]) => (
            <span key={label} data-testid={testid}>
              <span style={{ color }}>■</span> {label}: <span className="font-mono">{fmtMs(ms)}</span>
            </span>
          ))}
        </div>
      </div>
    );
  }

  function ServerTable({ p, t }) {
    const timeline = p.timeline || {};
    const server = timeline.server;
    if (!server) return <div className="text-muted-foreground" data-testid="metrics-server-none">{t.noServer}</div>;
    const rows = [
      [t.ttft, fmtMs(p.ttftMs), server.firstTokenMs, fmtMs],
      [t.queue, "–", server.queueMs, fmtMs],
      [t.prompt, "–", server.promptMs, fmtMs],
      [t.decode, fmtMs(timeline.firstTokenMs !== null && timeline.lastChunkMs !== null
                       ? timeline.lastChunkMs - timeline.firstTokenMs : null), server.decodeMs, fmtMs],
      [t.inference, "–", server.inferenceMs, fmtMs],
      [t.perToken, fmtMs(p.msPerToken), server.tpotMs, fmtMs],
      [t.decodeRate, fmt(p.tokensPerS, 1), server.decodeTokensPerS, (v) => fmt(v, 1)],
      [t.outputRate, "–", server.outputTokensPerS, (v) => fmt(v, 1)],
      [t.promptRate, "–", server.promptTokensPerS, (v) => fmt(v, 1)],
      [t.outTokens, String(p.tokens ?? "–"), server.outputTokens, (v) => String(v)],
      [t.inTokens, "–", server.inputTokens, (v) => String(v)],
      [t.cachedTokens, "–", server.cachedTokens, (v) => String(v)],
      [t.computedTokens, "–", server.computedTokens, (v) => String(v)],
    ];
    const cellStyle = { padding: "1px 10px 1px 0", textAlign: "left" };
    return (
      <table style={{ fontSize: "12px", borderCollapse: "collapse", margin: "4px 0" }} data-testid="metrics-server">
        <thead>
          <tr className="text-muted-foreground">
            <th style={cellStyle}></th><th style={cellStyle}>{t.ours}</th>
            <th style={cellStyle}>{t.theirs}: {server.source}</th>
          </tr>
        </thead>
        <tbody>
          {rows.map(([label, ours, value, format]) => (
            <tr key={label}>
              <td style={cellStyle} className="text-muted-foreground">{label}</td>
              <td style={cellStyle} className="font-mono">{ours}</td>
              <td style={cellStyle} className="font-mono">
                {value === null || value === undefined ? <span className="text-muted-foreground">{t.notReported}</span> : format(value)}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    );
  }

  function Timeline({ p, t }) {
    const timeline = p.timeline;
    const itl = timeline.itl;
    const sent = Object.entries(timeline.sent || {});
    return (
      <div data-testid="metrics-timeline" style={{ marginTop: "6px", fontSize: "12px" }}>
        <Milestones timeline={timeline} t={t} />
        {timeline.engineAtStart ? (
          <div data-testid="engine-at-start"><span className="text-muted-foreground">{t.engineAtStart}: </span>{timeline.engineAtStart}</div>
        ) : null}
        {itl ? (
          <div style={{ marginTop: "6px" }}>
            <div className="text-muted-foreground">{t.itlTitle}</div>
            <div style={{ display: "flex", flexWrap: "wrap", columnGap: "18px" }}>
              <Cell label={t.median} value={fmtMs(itl.medianMs)} testid="itl-median" />
              <Cell label={t.p90} value={fmtMs(itl.p90Ms)} testid="itl-p90" />
              <Cell label={t.p99} value={fmtMs(itl.p99Ms)} testid="itl-p99" />
              <Cell label={t.stall} value={`${fmtMs(itl.maxMs)} · ${t.afterTokens(itl.stallAfterTokens)}`} testid="itl-max" />
            </div>
            <GapChart timeline={timeline} t={t} />
          </div>
        ) : null}
        <ServerTable p={p} t={t} />
        {sent.length ? (
          <div data-testid="metrics-sent">
            <span className="text-muted-foreground">{t.sent}: </span>
            <span className="font-mono">{sent.map(([k, v]) => `${k}=${v}`).join(", ")}</span>
          </div>
        ) : null}
        {(timeline.notes || []).map((note) => (
          <div key={note} className="text-muted-foreground">· {note}</div>
        ))}
      </div>
    );
  }

  // Seen by screen readers only: what the live region below says.
  const VISUALLY_HIDDEN = { position: "absolute", width: "1px", height: "1px", padding: 0, margin: "-1px",
                            overflow: "hidden", clip: "rect(0, 0, 0, 0)", whiteSpace: "nowrap", border: 0 };

  // What a screen reader announces, politely: the first token's time once it is known, then the final
  // figures; the same text between those moments, so the ten refreshes a second announce nothing.
  function announcement(p, state, final, t) {
    if (final) {
      return `${t[state] || state} · ${t.ttft} ${fmtMs(p.ttftMs)} · ${fmt(p.tokensPerS, 1)} ${t.rate} · ` +
             `${p.tokens ?? 0} ${t.tokens}`;
    }
    if (p.ttftMs !== null && p.ttftMs !== undefined) return `${t.firstToken}: ${fmtMs(p.ttftMs)}`;
    return "";
  }

  function Figures({ p }) {
    const [open, setOpen] = useState(false);
    const t = LABELS[p.lang] || LABELS.en;
    const state = p.state || "starting";
    const final = FINAL.includes(state);
    const dotColor = {
      starting: "#eab308", queued: "#eab308", streaming: "#3b82f6",
      completed: "#16a34a", stopped: "#f97316", error: "#dc2626",
    }[state] || "#9ca3af";
    const status = state === "queued" ? t.queued(p.queuePosition) : t[state] || state;
    return (
      <div className="serving-lab-metrics rounded-md border text-sm"
           style={{ padding: "6px 12px", margin: "4px 0", position: "relative" }} data-state={state}
           data-testid="metrics">
        <div className="text-muted-foreground"
             style={{ display: "flex", alignItems: "center", gap: "6px", marginBottom: "4px", fontSize: "12px" }}>
          <span style={{ display: "inline-block", width: 8, height: 8, borderRadius: 4, background: dotColor }} />
          <span data-testid="metrics-status">{status}</span>
          <span>·</span>
          <span data-testid="metrics-backend">{p.backend}</span>
          {p.model ? <span className="font-mono" data-testid="metrics-model">{p.model}</span> : null}
        </div>
        <span role="status" aria-live="polite" style={VISUALLY_HIDDEN} data-testid="metrics-announce">
          {announcement(p, state, final, t)}
        </span>
        <div style={{ display: "flex", flexWrap: "wrap", columnGap: "18px", rowGap: "4px" }}>
          <Cell label={t.ttft} value={fmtMs(p.ttftMs)} testid="metrics-ttft" />
          <Cell label={t.rate} value={fmt(p.tokensPerS, 1)} testid="metrics-rate" />
          <Cell label={t.tokens} value={`${p.tokens ?? 0}${p.tokensExact === false ? " ≈" : ""}`} testid="metrics-tokens" />
          <Cell label={t.elapsed} value={fmtMs(p.elapsedMs)} testid="metrics-elapsed" />
          {final ? <Cell label={t.tpot} value={fmt(p.msPerToken, 1)} testid="metrics-tpot" /> : null}
          <Cell label={t.prompt} value={promptText(p.prompt, final, t)} testid="metrics-prompt" />
          <Cell label={t.prefill} value={prefillText(p.prompt, final, t)} testid="metrics-prefill" />
        </div>
        {(p.ignored || []).map((line) => (
          <div key={line} style={{ color: "#ea580c", fontSize: "12px", marginTop: "2px" }} data-testid="metrics-ignored">
            ⚠ {line}
          </div>
        ))}
        {final && (p.finishReason || p.disagreement || p.tokensExact === false) ? (
          <div className="text-muted-foreground" style={{ marginTop: "4px", fontSize: "12px" }}>
            {p.finishReason ? <span>{t.finish}: {p.finishReason} </span> : null}
            {p.serverTokens !== null && p.serverTokens !== undefined
              ? <span>· {t.server}: {p.serverTokens} </span> : null}
            {p.tokensExact === false ? <span>· {t.estimated} </span> : null}
            {p.disagreement ? <span style={{ color: "#ea580c" }} data-testid="metrics-disagreement">· ⚠ {p.disagreement}</span> : null}
          </div>
        ) : null}
        {final && p.timeline ? (
          <div>
            <button type="button" onClick={() => setOpen(!open)} data-testid="metrics-timeline-toggle"
                    className="text-muted-foreground"
                    style={{ fontSize: "12px", background: "none", border: "none", padding: 0, cursor: "pointer",
                             textDecoration: "underline", marginTop: "4px" }}>
              {open ? t.hideTimeline : t.showTimeline}
            </button>
            {open ? <Timeline p={p} t={t} /> : null}
          </div>
        ) : null}
      </div>
    );
  }

  const STATE_COLORS = { waiting: "#9ca3af", generating: "#3b82f6", streaming: "#3b82f6", completed: "#16a34a",
                         stopped: "#f97316", error: "#dc2626" };

  function Column({ c, t }) {
    const textRef = useRef(null);
    const live = c.state === "streaming" || c.state === "generating";
    // Keep a streaming column scrolled to its newest text.
    useEffect(() => {
      if (live && textRef.current) textRef.current.scrollTop = textRef.current.scrollHeight;
    });
    const stateText = { completed: t.completed, stopped: t.stopped, error: t.error, streaming: t.streaming,
                        generating: t.generating, waiting: t.waiting }[c.state] || c.state;
    return (
      <div className="rounded-md border" data-testid={`column-${c.label}`} data-state={c.state}
           style={{ display: "flex", flexDirection: "column", minWidth: 0, padding: "8px 10px" }}>
        <div style={{ display: "flex", alignItems: "center", gap: "6px", flexWrap: "wrap", fontSize: "13px" }}>
          <span style={{ fontWeight: 700 }} data-testid="column-label">{c.label}</span>
          {c.backend ? <span data-testid="column-backend">{c.backend}</span> : null}
          {c.model ? <span className="font-mono text-muted-foreground" style={{ fontSize: "11px" }}
                           data-testid="column-model">{c.model}</span> : null}
          <span style={{ marginLeft: "auto", display: "flex", alignItems: "center", gap: "4px", fontSize: "12px" }}
                className="text-muted-foreground">
            <span style={{ display: "inline-block", width: 8, height: 8, borderRadius: 4,
                           background: STATE_COLORS[c.state] || "#9ca3af" }} />
            <span data-testid="column-state">{stateText}</span>
          </span>
        </div>
        {(c.notes || []).map((note) => (
          <div key={note} className="text-muted-foreground" style={{ fontSize: "12px" }}>· {note}</div>
        ))}
        {c.error ? (
          <div data-testid="column-error" style={{ color: "#dc2626", fontSize: "12px", margin: "4px 0",
                                                   whiteSpace: "pre-wrap", overflowWrap: "anywhere" }}>⚠ {c.error}</div>
        ) : null}
        <div ref={textRef} data-testid="column-text"
             style={{ maxHeight: "420px", overflowY: "auto", overflowWrap: "anywhere", marginTop: "4px" }}>
          <Markdown allowHtml={false} latex={false}>{c.text || ""}</Markdown>
        </div>
        {c.figures ? <Figures p={c.figures} /> : null}
      </div>
    );
  }

  function VoteBar({ p, t, api }) {
    const [judgements, setJudgements] = useState({});
    const [comment, setComment] = useState("");
    const [answer, setAnswer] = useState(null);
    const [busy, setBusy] = useState(false);
    const labels = (p.columns || []).map((c) => c.label);
    const cast = async (outcome, winner) => {
      setBusy(true);
      try {
        const reply = await api.callAction({ name: "vote", payload: { round_id: p.roundId, outcome, winner, judgements, comment } });
        setAnswer((reply && reply.response && reply.response.message) || null);
      } finally {
        setBusy(false);
      }
    };
    const judge = (label, value) => setJudgements({ ...judgements, [label]: judgements[label] === value ? undefined : value });
    const button = { padding: "3px 10px", borderRadius: "6px", border: "1px solid rgba(127,127,127,0.5)",
                     background: "transparent", cursor: busy ? "wait" : "pointer", fontSize: "13px" };
    return (
      <div data-testid="vote" style={{ marginTop: "8px", fontSize: "13px" }}>
        <div className="text-muted-foreground" style={{ marginBottom: "4px" }}>{p.blind ? t.voteHint : t.voteHintNamed}</div>
        <div style={{ display: "flex", flexWrap: "wrap", gap: "6px" }}>
          {labels.map((label) => (
            <button key={label} type="button" disabled={busy} style={button} data-testid={`vote-${label}`}
                    onClick={() => cast("win", label)}>{label} {t.better}</button>
          ))}
          <button type="button" disabled={busy} style={button} data-testid="vote-tie" onClick={() => cast("tie", null)}>{t.tie}</button>
          <button type="button" disabled={busy} style={button} data-testid="vote-both-bad"
                  onClick={() => cast("both_bad", null)}>{labels.length > 2 ? t.allBad : t.bothBad}</button>
        </div>
        <div style={{ display: "flex", flexWrap: "wrap", gap: "10px", marginTop: "6px" }}>
          {labels.map((label) => (
            <span key={label} data-testid={`judge-${label}`}>
              {label}:{" "}
              {["good", "bad"].map((value) => (
                <label key={value} style={{ marginRight: "6px", cursor: "pointer" }}>
                  <input type="checkbox" checked={judgements[label] === value} onChange={() => judge(label, value)}
                         data-testid={`judge-${label}-${value}`} /> {t[value]}
                </label>
              ))}
            </span>
          ))}
        </div>
        <textarea value={comment} onChange={(event) => setComment(event.target.value)} placeholder={t.comment}
                  maxLength={2000} rows={2} data-testid="vote-comment"
                  style={{ width: "100%", marginTop: "6px", background: "transparent", border: "1px solid rgba(127,127,127,0.4)",
                           borderRadius: "6px", padding: "4px 6px", fontSize: "13px" }} />
        {answer ? <div data-testid="vote-answer" style={{ marginTop: "4px" }}>{answer}</div> : null}
      </div>
    );
  }

  function CompareGrid({ p, api }) {
    const t = LABELS[p.lang] || LABELS.en;
    const vote = p.vote;
    const summary = vote ? (vote.outcome === "win" ? t.won(vote.winner) : vote.outcome === "tie" ? t.tie
                            : (p.columns || []).length > 2 ? t.allBad : t.bothBad) : null;
    return (
      <div data-testid="compare" data-blind={String(!!p.blind)} data-revealed={String(!!p.revealed)}
           data-final={String(!!p.final)} style={{ margin: "4px 0" }}>
        <div className="text-muted-foreground" style={{ fontSize: "12px", marginBottom: "6px" }}>
          {p.blind ? t.blindRound : t.compareRound} · {t[p.runOrder] || p.runOrder}
          {p.blind && !p.revealed ? ` · ${p.reveal === "pace" ? t.revealPace : t.revealFinished}` : ""}
          {summary ? <span data-testid="vote-summary"> · {t.voted}: {summary}</span> : null}
        </div>
        <div style={{ display: "grid", gridTemplateColumns: "repeat(auto-fit, minmax(260px, 1fr))", gap: "10px" }}>
          {(p.columns || []).map((c) => <Column key={c.label} c={c} t={t} />)}
        </div>
        {p.final && !vote ? <VoteBar p={p} t={t} api={api} /> : null}
      </div>
    );
  }

  const PANEL = {
    en: { simulate: (n) => `Simulate ${n} user${n > 1 ? "s" : ""}`, close: "Close", none: "no metrics",
          running: (s) => `Simulating ${s.users} user(s) on ${s.backend}: ${s.finished}/${s.total} done, ${s.inFlight} in flight`,
          rate: "tokens/s now (all)", ttft: "median TTFT", chartRate: "output tokens/s (all users)", chartTtft: "mean TTFT (ms)",
          users: "simulated users", teacher: "Only a teacher may start a simulation.",
          sweep: "Capacity sweep", sweepTitle: (b) => `Capacity sweep on ${b}`, people: "people at once",
          sweepRunning: (r) => `measuring ${r.level} at once: ${r.finished}/${r.total} done, ${r.inFlight} in flight`,
          ttftChart: "TTFT p50 / p90 (ms)", perUserChart: "tokens/s per person (median)", sloMet: "SLO met",
          earlier: "Earlier sweeps", stopped: "stopped",
          lesson: "Prefix-cache lesson", lessonTitle: "The same conversations, prefix cache on and off",
          lessonRunning: (r) => `${r.backend}: ${r.finished}/${r.total} replies, ${r.inFlight} in flight`,
          turn: "turn", ttftMean: "TTFT (mean)", cached: "prompt from cache", notReported: "not reported",
          byTurn: "TTFT by turn", classFit: "Would today's class fit?",
          replayRunning: (r) => `${r.stage}: ${r.finished}/${r.total} replies` },
    zh: { simulate: (n) => `模拟 ${n} 个用户`, close: "关闭", none: "无指标",
          running: (s) => `正在 ${s.backend} 上模拟 ${s.users} 个用户：已完成 ${s.finished}/${s.total}，进行中 ${s.inFlight}`,
          rate: "当前 tokens/秒（总计）", ttft: "TTFT 中位数", chartRate: "输出 tokens/秒（所有用户）", chartTtft: "平均 TTFT（毫秒）",
          users: "模拟用户数", teacher: "只有教师可以开始模拟。",
          sweep: "容量扫描", sweepTitle: (b) => `${b} 的容量扫描`, people: "同时使用人数",
          sweepRunning: (r) => `正在测 ${r.level} 人同时使用：已完成 ${r.finished}/${r.total}，进行中 ${r.inFlight}`,
          ttftChart: "TTFT p50 / p90（毫秒）", perUserChart: "每人 tokens/秒（中位数）", sloMet: "达到 SLO",
          earlier: "以往的扫描", stopped: "已停止",
          lesson: "前缀缓存演示", lessonTitle: "同样的对话：前缀缓存开启与关闭",
          lessonRunning: (r) => `${r.backend}：已完成 ${r.finished}/${r.total} 条回复，进行中 ${r.inFlight}`,
          turn: "轮次", ttftMean: "首 token 时间（平均）", cached: "来自缓存的提示词", notReported: "未报告",
          byTurn: "按轮次的首 token 时间", classFit: "今天的课能撑住吗？",
          replayRunning: (r) => `${r.stage}：已完成 ${r.finished}/${r.total} 条回复` },
  };
  const LINE_COLORS = ["#3b82f6", "#16a34a", "#ea580c", "#9333ea", "#dc2626"];

  // The "as N grows" chart: one line per backend over the simulated user counts.
  function UsersChart({ points, users, field, title, testid }) {
    const backends = [...new Set(points.map((p) => p.backend))];
    const values = points.map((p) => p[field]).filter((v) => v !== null && v !== undefined);
    if (!values.length) return null;
    const width = 300, height = 140, left = 40, right = 8, top = 16, bottom = 22;
    const top_value = Math.max(...values) * 1.1 || 1;
    const x = (n) => left + (users.indexOf(n) / Math.max(users.length - 1, 1)) * (width - left - right);
    const y = (v) => top + (height - top - bottom) * (1 - v / top_value);
    return (
      <svg viewBox={`0 0 ${width} ${height}`} style={{ width: "100%", maxWidth: "340px" }} data-testid={testid}>
        <text x={left} y={11} fontSize="10" fill="currentColor">{title}</text>
        <line x1={left} x2={width - right} y1={y(0)} y2={y(0)} stroke="currentColor" strokeOpacity="0.3" />
        <text x={left - 4} y={y(top_value) + 8} fontSize="9" textAnchor="end" fill="currentColor">{Math.round(top_value)}</text>
        {users.map((n) => <text key={n} x={x(n)} y={height - 6} fontSize="9" textAnchor="middle" fill="currentColor">{n}</text>)}
        {backends.map((backend, index) => {
          const mine = points.filter((p) => p.backend === backend && p[field] !== null).sort((a, b) => a.users - b.users);
          const color = LINE_COLORS[index % LINE_COLORS.length];
          return (
            <g key={backend}>
              <polyline fill="none" stroke={color} strokeWidth="2" points={mine.map((p) => `${x(p.users)},${y(p[field])}`).join(" ")} />
              {mine.map((p) => <circle key={p.users} cx={x(p.users)} cy={y(p[field])} r="3" fill={color} />)}
              <text x={left + 4 + index * 90} y={top + 10} fontSize="9" fill={color}>{backend}</text>
            </g>
          );
        })}
      </svg>
    );
  }

  // The capacity sweep: TTFT percentiles and tokens/s per person against N, drawn as each level ends.
  function SweepView({ sweep, t }) {
    const ttftPoints = sweep.points.flatMap((p) => [
      { backend: "p50", users: p.users, value: p.ttftP50 }, { backend: "p90", users: p.users, value: p.ttftP90 }]);
    const perUser = sweep.points.map((p) => ({ backend: sweep.backend, users: p.users, value: p.tokensPerUser }));
    return (
      <div data-testid="sweep" data-done={String(!!sweep.done)} style={{ marginTop: "6px" }}>
        <div style={{ fontWeight: 600 }}>📈 {t.sweepTitle(sweep.backend)} · SLO: {sweep.slo} ({sweep.percentile}%)</div>
        {sweep.running ? <div data-testid="sweep-running">{t.sweepRunning(sweep.running)}</div> : null}
        {sweep.points.length ? (
          <div style={{ display: "flex", flexWrap: "wrap", gap: "12px" }}>
            <UsersChart points={ttftPoints} users={sweep.levels} field="value" title={`${t.ttftChart} × ${t.people}`} testid="sweep-chart-ttft" />
            <UsersChart points={perUser} users={sweep.levels} field="value" title={`${t.perUserChart} × ${t.people}`} testid="sweep-chart-per-user" />
          </div>
        ) : null}
        <table style={{ borderCollapse: "collapse" }} data-testid="sweep-levels">
          <tbody>
            {sweep.points.map((p) => (
              <tr key={p.users} data-testid="sweep-level">
                <td style={{ paddingRight: "10px" }}>{p.users}</td>
                <td className="font-mono" style={{ paddingRight: "10px" }}>{t.sloMet}: {p.sloShare === null ? "–" : `${Math.round(p.sloShare * 100)}%`}</td>
                <td className="font-mono" style={{ paddingRight: "10px" }}>{p.tokensPerS} tok/s</td>
                <td className="text-muted-foreground">{p.saturation || ""}</td>
              </tr>
            ))}
          </tbody>
        </table>
        {sweep.answer ? <div data-testid="sweep-answer" style={{ marginTop: "4px" }}>{sweep.answer}</div> : null}
        {sweep.problem ? <div data-testid="sweep-problem">⚠️ {sweep.problem}</div> : null}
      </div>
    );
  }

  // One backend's TTFT by turn number, with the share of each turn's prompt its engine took from its cache.
  function TurnTable({ turns, t, testid }) {
    if (!(turns || []).length) return null;
    return (
      <table style={{ borderCollapse: "collapse", fontSize: "12px" }} data-testid={testid}>
        <thead><tr className="text-muted-foreground">
          <th style={{ paddingRight: "10px", textAlign: "left" }}>{t.turn}</th>
          <th style={{ paddingRight: "10px", textAlign: "left" }}>{t.ttftMean}</th>
          <th style={{ textAlign: "left" }}>{t.cached}</th>
        </tr></thead>
        <tbody>
          {turns.map((turn) => (
            <tr key={turn.turn} data-testid="turn-row">
              <td style={{ paddingRight: "10px" }}>{turn.turn}</td>
              <td className="font-mono" style={{ paddingRight: "10px" }} data-testid="turn-ttft">
                {turn.meanTtftMs === null ? "–" : `${Math.round(turn.meanTtftMs)} ms`}</td>
              <td className="font-mono" data-testid="turn-cached">
                {turn.cachedShare === null ? t.notReported : `${Math.round(turn.cachedShare * 100)}% (${turn.meanCachedTokens}/${turn.meanPromptTokens})`}</td>
            </tr>
          ))}
        </tbody>
      </table>
    );
  }

  // The prefix-cache lesson: the same conversations on a backend with its prefix cache and one without.
  function LessonView({ lesson, t }) {
    return (
      <div data-testid="lesson" data-done={String(!!lesson.done)} style={{ marginTop: "6px" }}>
        <div style={{ fontWeight: 600 }}>🧠 {t.lessonTitle}</div>
        {lesson.running ? <div data-testid="lesson-running">{t.lessonRunning(lesson.running)}</div> : null}
        <div style={{ display: "grid", gridTemplateColumns: "repeat(auto-fit, minmax(220px, 1fr))", gap: "8px" }}>
          {lesson.columns.map((c) => (
            <div key={c.label} className="rounded-md border" style={{ padding: "4px 8px" }} data-testid="lesson-column">
              <div style={{ fontWeight: 600 }}>{c.label}</div>
              <TurnTable turns={c.turns} t={t} testid="lesson-turns" />
            </div>
          ))}
        </div>
        {lesson.answer ? <div data-testid="lesson-answer" style={{ marginTop: "4px" }}>{lesson.answer}</div> : null}
        {lesson.problem ? <div data-testid="lesson-problem">⚠️ {lesson.problem}</div> : null}
      </div>
    );
  }

  // "Would today's class fit?": the class's own traffic replayed on the engines, in plain words.
  function ReplayView({ replay, t }) {
    return (
      <div data-testid="class-fit" data-done={String(!!replay.done)} style={{ marginTop: "6px" }}>
        <div style={{ fontWeight: 600 }}>🏫 {replay.title}</div>
        {replay.running ? <div data-testid="class-fit-running">{t.replayRunning(replay.running)}</div> : null}
        {replay.answer ? <div data-testid="class-fit-answer" style={{ marginTop: "4px" }}>{replay.answer}</div> : null}
        {replay.problem ? <div data-testid="class-fit-problem">⚠️ {replay.problem}</div> : null}
      </div>
    );
  }

  function EnginePanel({ p, api }) {
    const t = PANEL[p.lang] || PANEL.en;
    const [answer, setAnswer] = useState(null);
    const startSweep = async () => {
      const reply = await api.callAction({ name: "capacity_sweep", payload: {} });
      setAnswer((reply && reply.response && reply.response.message) || null);
    };
    const startLesson = async () => {
      const reply = await api.callAction({ name: "cache_lesson", payload: {} });
      setAnswer((reply && reply.response && reply.response.message) || null);
    };
    const classFit = async () => {
      const reply = await api.callAction({ name: "class_fit", payload: {} });
      setAnswer((reply && reply.response && reply.response.message) || null);
    };
    const simulate = async (users) => {
      const reply = await api.callAction({ name: "simulate", payload: { users } });
      setAnswer((reply && reply.response && reply.response.message) || null);
    };
    const sim = p.simulation;
    const button = { padding: "2px 8px", borderRadius: "6px", border: "1px solid rgba(127,127,127,0.5)",
                     background: "transparent", cursor: "pointer", fontSize: "12px" };
    return (
      <div data-testid="engines" data-closed={String(!!p.closed)} style={{ fontSize: "13px", margin: "4px 0" }}>
        <div style={{ display: "grid", gridTemplateColumns: "repeat(auto-fit, minmax(240px, 1fr))", gap: "8px" }}>
          {(p.engines || []).map((engine) => (
            <div key={engine.name} className="rounded-md border" style={{ padding: "6px 10px" }} data-testid={`engine-${engine.name}`}>
              <div style={{ fontWeight: 600 }}>{engine.label}
                {engine.source ? <span className="text-muted-foreground" style={{ fontWeight: 400, fontSize: "11px" }}> · {engine.source}</span> : null}
              </div>
              {engine.problem ? <div className="text-muted-foreground" data-testid="engine-problem">{engine.problem}</div> : null}
              <table style={{ borderCollapse: "collapse", marginTop: "2px" }}>
                <tbody>
                  {(engine.rows || []).map((row) => (
                    <tr key={row.key} data-testid={`engine-row-${row.key}`}>
                      <td className="text-muted-foreground" style={{ paddingRight: "10px" }}>{row.label}</td>
                      <td className="font-mono" data-testid="engine-value">{row.value}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          ))}
        </div>
        {sim ? (
          <div data-testid="simulation" style={{ marginTop: "6px" }}>
            🚦 {t.running(sim)} · {t.rate}: <span className="font-mono" data-testid="simulation-rate">{sim.tokensPerS === null ? "–" : sim.tokensPerS.toFixed(1)}</span>
            {" "}· {t.ttft}: <span className="font-mono">{sim.medianTtftMs === null ? "–" : `${Math.round(sim.medianTtftMs)} ms`}</span>
          </div>
        ) : null}
        {(p.points || []).length ? (
          <div style={{ display: "flex", flexWrap: "wrap", gap: "12px", marginTop: "6px" }}>
            <UsersChart points={p.points} users={p.users} field="tokensPerS" title={`${t.chartRate} × ${t.users}`} testid="users-chart-rate" />
            <UsersChart points={p.points} users={p.users} field="meanTtftMs" title={`${t.chartTtft} × ${t.users}`} testid="users-chart-ttft" />
          </div>
        ) : null}
        {(p.points || []).filter((point) => (point.turns || []).length > 1).map((point) => (
          <div key={`${point.backend}-${point.users}`} style={{ marginTop: "4px" }} data-testid="simulation-turns">
            <div className="text-muted-foreground">{t.byTurn}: {point.backend} · {point.users} {t.users}</div>
            <TurnTable turns={point.turns} t={t} testid="simulation-turn-table" />
          </div>
        ))}
        {p.lesson ? <LessonView lesson={p.lesson} t={t} /> : null}
        {p.replay ? <ReplayView replay={p.replay} t={t} /> : null}
        {p.sweep ? <SweepView sweep={p.sweep} t={t} /> : null}
        {(p.sweeps || []).length ? (
          <details data-testid="sweeps" style={{ marginTop: "6px" }}>
            <summary>{t.earlier} ({p.sweeps.length})</summary>
            <ul>
              {p.sweeps.map((s) => (
                <li key={s.id} data-testid="sweep-listed">{s.at} · {s.backend}{s.interrupted ? ` (${t.stopped})` : ""}: {s.answer}</li>
              ))}
            </ul>
          </details>
        ) : null}
        {!p.closed ? (
          <div style={{ display: "flex", flexWrap: "wrap", gap: "6px", marginTop: "6px", alignItems: "center" }}>
            {p.canSimulate ? (p.users || []).map((n) => (
              <button key={n} type="button" style={button} data-testid={`simulate-${n}`} onClick={() => simulate(n)}>{t.simulate(n)}</button>
            )) : <span className="text-muted-foreground">{t.teacher}</span>}
            {p.canSimulate ? (
              <button type="button" style={button} data-testid="capacity-sweep" onClick={startSweep}>{t.sweep}</button>
            ) : null}
            {p.canSimulate && p.canLesson ? (
              <button type="button" style={button} data-testid="cache-lesson" onClick={startLesson}>{t.lesson}</button>
            ) : null}
            {p.canSimulate ? (
              <button type="button" style={button} data-testid="class-fit-button" onClick={classFit}>{t.classFit}</button>
            ) : null}
            <button type="button" style={button} data-testid="close-panel"
                    onClick={() => api.callAction({ name: "close_panel", payload: {} })}>{t.close}</button>
          </div>
        ) : null}
        {p.message ? <div className="text-muted-foreground" data-testid="panel-message">{p.message}</div> : null}
        {answer ? <div data-testid="simulate-answer">{answer}</div> : null}
      </div>
    );
  }

  // The element's props as they are now, and the reply's text while it streams by the tap (else
  // undefined): the live props the page's socket tap holds for this
  // element (public/serving-lab.js, ui/live_tap.py) when they came after Chainlit's last update of
  // it, else Chainlit's. Read as the view renders; the tap's news only asks for a render. The view
  // listens from the commit that mounts it (a layout effect, in the task of that render), and what
  // came between that render and listening is caught up at once: with a passive effect, a piece of
  // text arriving in the tasks before React ran it (the last piece of a fast reply, just as its
  // message was drawn) told no one, and waited for the next piece or the message's final update.
  function useLatest(data) {
    const live = window.ServingLab && window.ServingLab.live;
    const id = data.liveId;
    const [, setNews] = useState(0);
    const props = live && id ? live.props(id) : undefined;
    const text = live && id && live.text ? live.text(id) : undefined;
    useLayoutEffect(() => {
      if (!live || !id) return undefined;
      const unsubscribe = live.subscribe(id, () => setNews((n) => n + 1));
      // `props` and `text` as the render being committed read them.
      if (live.props(id) !== props || (live.text && live.text(id) !== text)) setNews((n) => n + 1);
      return unsubscribe;
    }, [live, id]);
    return [props || data, text];
  }

  function Metrics({ data, api }) {
    // `text`: a reply's text while it streams, when it came by the page's tap: Chainlit shows the
    // message's whole text from its final update on, and the tap then drops this copy (ui/live_tap.py).
    const [p, text] = useLatest(data);
    if (p.kind === "compare") return <CompareGrid p={p} api={api} />;
    if (p.kind === "engines") return <EnginePanel p={p} api={api} />;
    if (text === undefined) return <ReplyFigures p={p} />;
    return (
      <>
        <LiveText text={text} />
        <ReplyFigures p={p} />
      </>
    );
  }

  // Each drawn again only when its own part changed: a piece of text does not draw the figures,
  // nor a refresh of the figures the text (its Markdown parsed again).
  const ReplyFigures = memo(Figures);
  const LiveText = memo(function LiveText({ text }) {
    return (
      <div className="serving-lab-live-text" data-testid="live-text">
        <Markdown allowHtml={false} latex={false}>{text}</Markdown>
      </div>
    );
  });

  return Metrics;
}

// scripts/build_web.mjs wraps this file and registers `defineView` under its build's version.
