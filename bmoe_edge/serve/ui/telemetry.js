// The streamer's view of one answer: what the request's `streamer_stats` brings back (each step's wall time,
// reads and expert cache hits; the whole answer's summary at its end: bmoe_edge/serve/stats.py) and the time to
// the first token as this browser saw it. A panel of figures and a sparkline of each step's speed.

function figure(label, value, title) {
  const span = document.createElement("span");
  span.className = "figure";
  span.title = title;
  const name = document.createElement("b");
  name.textContent = label;
  span.append(name, document.createTextNode(` ${value}`));
  return span;
}

const fixed = (x, digits) => (typeof x === "number" && Number.isFinite(x) ? x.toFixed(digits) : "–");

// Figures from the steps seen so far, until the answer's own summary arrives.
export function summarize(stats) {
  if (stats.answer) return stats.answer;
  const decode = stats.steps.filter((s) => s.step > 0);
  const ms = decode.reduce((a, s) => a + s.wall_ms, 0);
  const lookups = decode.reduce((a, s) => a + s.cache_lookups, 0);
  const read = decode.reduce((a, s) => a + s.bytes_read, 0);
  const prompt = stats.steps.find((s) => s.step === 0);
  return {
    tok_s: ms > 0 ? (1000 * decode.length) / ms : null,
    ttft_ms: prompt ? prompt.wall_ms : null,
    hit_rate: lookups ? decode.reduce((a, s) => a + s.cache_hits, 0) / lookups : null,
    mb_per_token: decode.length ? read / 1e6 / decode.length : null,
    stall_ms: decode.reduce((a, s) => a + s.stall_ms, 0),
  };
}

function sparkline(steps) {
  const canvas = document.createElement("canvas");
  canvas.className = "sparkline";
  canvas.width = 160;
  canvas.height = 28;
  canvas.title = "tokens/s of each step";
  const speeds = steps.filter((s) => s.step > 0 && s.wall_ms > 0).map((s) => (1000 * s.n_tokens) / s.wall_ms);
  const ctx = canvas.getContext("2d");
  if (!ctx || speeds.length < 2) return canvas;
  const top = Math.max(...speeds);
  const shown = speeds.slice(-canvas.width);   // one pixel column a step at most
  ctx.strokeStyle = getComputedStyle(document.documentElement).getPropertyValue("--accent").trim() || "#3b82f6";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  shown.forEach((v, i) => {
    const x = (i / (shown.length - 1)) * (canvas.width - 2) + 1;
    const y = canvas.height - 2 - (v / top) * (canvas.height - 4);
    if (i) ctx.lineTo(x, y);
    else ctx.moveTo(x, y);
  });
  ctx.stroke();
  return canvas;
}

// The panel under an answer. `clientTtftMs`: from sending to the first piece of the answer, as seen here.
export function panel(stats, clientTtftMs) {
  const box = document.createElement("div");
  box.className = "stats";
  const s = summarize(stats);
  const hit = s.hit_rate === null || s.hit_rate === undefined ? "–" : `${(100 * s.hit_rate).toFixed(0)}%`;
  box.append(
    figure("tok/s", fixed(s.tok_s, 1), "decode speed after the prompt"),
    figure("TTFT", clientTtftMs === null ? `${fixed(s.ttft_ms, 0)} ms` : `${fixed(clientTtftMs, 0)} ms`,
      `time to the first token: as this page saw it (the engine's prompt step: ${fixed(s.ttft_ms, 0)} ms)`),
    figure("hit", hit, "expert cache hits / lookups while decoding"),
    figure("MB/tok", fixed(s.mb_per_token, s.mb_per_token < 0.1 ? 4 : 2),
      "megabytes read from storage per generated token"),
    figure("stall", `${fixed(s.stall_ms, 0)} ms`, "compute time spent waiting for expert reads"),
  );
  if (stats.answer && stats.answer.cache_budget_mb !== undefined) {
    box.append(figure("cache", `${fixed(stats.answer.cache_budget_mb, 0)} MiB`, "the expert cache's budget"));
  }
  box.append(sparkline(stats.steps));
  return box;
}
