// The chat page: conversations (this browser's localStorage), one answer streamed at a time from
// /v1/chat/completions, stopped by aborting its fetch (the server cancels a request whose client hangs up, so the
// engine is free at once). Model text only ever reaches the page through markdown.js (DOM nodes, no HTML).

import { ApiError, getJson, streamChat } from "./api.js";
import { render } from "./markdown.js";
import * as store from "./store.js";
import { panel } from "./telemetry.js";

const $ = (id) => document.getElementById(id);
const state = { conversations: store.loadAll(), current: null, controller: null, renderQueued: false };
window.bmoeMarkdown = { render };   // the renderer, for the tests (tests/test_serve_ui.py) and the curious

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function current() {
  return state.conversations.find((c) => c.id === state.current);
}

function save() {
  if (!store.saveAll(state.conversations)) showError("This browser's storage is full: export and delete old chats.");
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

// ---- the list of conversations ----

function renderList() {
  const list = $("conversations");
  list.replaceChildren();
  const sorted = [...state.conversations].sort((a, b) => b.updated - a.updated);
  for (const c of sorted) {
    const item = el("li", c.id === state.current ? "active" : "");
    item.dataset.id = c.id;
    const title = el("button", "title", c.title || "Untitled");
    title.addEventListener("click", () => select(c.id));
    const rename = el("button", "rename", "✎");
    rename.title = "Rename";
    rename.addEventListener("click", () => startRename(item, c));
    const remove = el("button", "delete", "✕");
    remove.title = "Delete";
    remove.addEventListener("click", () => {
      if (remove.dataset.armed) return deleteConversation(c.id);
      remove.dataset.armed = "1";   // a second click deletes
      remove.textContent = "Delete?";
      setTimeout(() => { delete remove.dataset.armed; remove.textContent = "✕"; }, 3000);
      return undefined;
    });
    item.append(title, rename, remove);
    list.append(item);
  }
}

function startRename(item, c) {
  const input = el("input", "rename-input");
  input.value = c.title;
  input.maxLength = 120;
  const done = (keep) => {
    if (keep && input.value.trim()) {
      c.title = input.value.trim();
      save();
    }
    renderList();
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") done(true);
    if (e.key === "Escape") done(false);
  });
  input.addEventListener("blur", () => done(true));
  item.replaceChildren(input);
  input.focus();
  input.select();
}

function deleteConversation(id) {
  state.conversations = state.conversations.filter((c) => c.id !== id);
  save();
  if (state.current === id) {
    state.current = null;
    ensureCurrent();
  }
  renderAll();
}

function ensureCurrent() {
  if (!current()) {
    const stored = state.conversations.find((c) => c.id === store.currentId());
    const latest = [...state.conversations].sort((a, b) => b.updated - a.updated)[0];
    state.current = (stored || latest || newConversation()).id;
  }
  store.setCurrentId(state.current);
}

function newConversation() {
  const c = store.create();
  state.conversations.push(c);
  return c;
}

function select(id) {
  if (state.controller) return;   // one answer at a time: stop it first
  state.current = id;
  store.setCurrentId(id);
  renderAll();
}

// ---- one conversation's settings ----

function renderSettings() {
  const c = current();
  $("system").value = c.system || "";
  const box = $("sampling");
  box.replaceChildren();
  for (const [name, row] of Object.entries(store.SETTINGS)) {
    const label = el("label", "setting", row.label);
    const input = el("input");
    Object.assign(input, { type: "number", min: row.min, max: row.max, step: row.step, id: `set-${name}` });
    input.placeholder = row.value === "" ? "server's" : String(row.value);
    input.value = c.settings[name] ?? "";
    input.addEventListener("change", () => {
      c.settings[name] = input.value === "" ? "" : Number(input.value);
      save();
    });
    label.append(input);
    box.append(label);
  }
}

// ---- the transcript ----

function toolCalls(calls) {
  const box = el("div", "tool-calls");
  for (const call of calls) {
    const item = el("div", "tool-call");
    item.append(el("div", "tool-name", `tool call: ${call.function?.name || "?"}`));
    item.append(el("pre", "tool-args", call.function?.arguments || ""));
    box.append(item);
  }
  return box;
}

function messageNode(m) {
  const node = el("div", `msg ${m.role}`);
  node.append(el("div", "role", m.role === "user" ? "You" : "Model"));
  if (m.reasoning) {
    const thinking = el("details", "thinking");
    thinking.append(el("summary", "", m.pending && !m.content ? "Thinking…" : "Thinking"));
    const body = el("div", "thinking-body");
    body.append(render(m.reasoning));
    thinking.append(body);
    node.append(thinking);
  }
  const content = el("div", "content");
  if (m.role === "user") content.textContent = m.content;
  else content.append(render(m.content));
  node.append(content);
  if (m.tool_calls?.length) node.append(toolCalls(m.tool_calls));
  if (m.stopped) node.append(el("div", "note", "stopped"));
  if (m.error) node.append(el("div", "msg-error", m.error));
  if (m.stats) node.append(panel(m.stats, m.ttft_ms ?? null));
  if (m.pending) node.classList.add("pending");
  return node;
}

function renderMessages() {
  const box = $("messages");
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 60;
  box.replaceChildren(...current().messages.map(messageNode));
  if (atBottom) box.scrollTop = box.scrollHeight;
}

// Re-rendering on every chunk would be quadratic in a long answer: at most one render a frame's worth.
function queueRender() {
  if (state.renderQueued) return;
  state.renderQueued = true;
  setTimeout(() => {
    state.renderQueued = false;
    renderMessages();
  }, 40);
}

function renderAll() {
  ensureCurrent();
  renderList();
  renderSettings();
  renderMessages();
  $("send").hidden = !!state.controller;
  $("stop").hidden = !state.controller;
}

// ---- asking ----

function requestBody(c) {
  const messages = [];
  if (c.system.trim()) messages.push({ role: "system", content: c.system });
  for (const m of c.messages) {
    if (m.role === "assistant" && !m.content) continue;   // a failed or empty answer: nothing to send back
    messages.push({ role: m.role, content: m.content });
  }
  const body = { messages, stream: true, stream_options: { include_usage: true }, streamer_stats: true };
  for (const [name, value] of Object.entries(c.settings)) if (value !== "" && value !== null) body[name] = value;
  return body;
}

function mergeToolCalls(answer, pieces) {
  for (const piece of pieces) {
    const at = piece.index ?? answer.tool_calls.length;
    const call = answer.tool_calls[at] || (answer.tool_calls[at] = { id: "", type: "function",
      function: { name: "", arguments: "" } });
    if (piece.id) call.id = piece.id;
    if (piece.function?.name) call.function.name += piece.function.name;
    if (piece.function?.arguments) call.function.arguments += piece.function.arguments;
  }
}

async function ask() {
  const text = $("prompt").value;
  if (!text.trim() || state.controller) return;
  showError("");
  const c = current();
  c.messages.push({ role: "user", content: text });
  if (c.title === "New chat") c.title = text.trim().split("\n")[0].slice(0, 60);
  const answer = { role: "assistant", content: "", reasoning: "", tool_calls: [], pending: true,
    stats: { steps: [] } };
  c.messages.push(answer);
  c.updated = Date.now();
  $("prompt").value = "";
  save();
  state.controller = new AbortController();
  renderAll();
  const started = performance.now();
  try {
    for await (const chunk of streamChat(requestBody(c), store.apiKey(), state.controller.signal)) {
      const delta = chunk.choices?.[0]?.delta || {};
      if ((delta.content || delta.reasoning_content || delta.tool_calls) && answer.ttft_ms === undefined) {
        answer.ttft_ms = performance.now() - started;
      }
      answer.content += delta.content || "";
      answer.reasoning += delta.reasoning_content || "";
      if (delta.tool_calls) mergeToolCalls(answer, delta.tool_calls);
      if (chunk.streamer?.steps) answer.stats.steps.push(...chunk.streamer.steps);
      if (chunk.streamer?.answer) answer.stats.answer = chunk.streamer.answer;
      if (chunk.choices?.[0]?.finish_reason) answer.finish_reason = chunk.choices[0].finish_reason;
      if (chunk.usage) answer.usage = chunk.usage;
      queueRender();
    }
  } catch (error) {
    if (error.name === "AbortError") {
      answer.stopped = true;
    } else {
      answer.error = error instanceof ApiError ? error.message : `The page failed: ${error.message}`;
      showError(answer.error);
    }
  } finally {
    delete answer.pending;
    if (!answer.stats.steps.length) delete answer.stats;
    state.controller = null;
    c.updated = Date.now();
    save();
    renderAll();
  }
}

function stop() {
  if (state.controller) state.controller.abort();
}

function download(c) {
  const blob = new Blob([store.exportJson(c)], { type: "application/json" });
  const a = el("a");
  a.href = URL.createObjectURL(blob);
  a.download = `${(c.title || "chat").replace(/[^\w.-]+/g, "_").slice(0, 60)}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

// ---- the server's name and state (/health is public) ----

async function refreshHealth() {
  try {
    const health = await getJson("health", "");
    $("model").textContent = health.model || "";
    $("status").textContent = health.busy ? "busy" : health.status;
  } catch (error) {
    $("status").textContent = error.status === 0 ? "unreachable" : `error ${error.status}`;
  }
}

function wire() {
  $("send").addEventListener("click", ask);
  $("stop").addEventListener("click", stop);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      ask();
    }
  });
  $("new-chat").addEventListener("click", () => {
    if (state.controller) return;
    const existing = current();
    if (existing && !existing.messages.length) return;   // already on an empty one
    state.current = newConversation().id;
    save();
    renderAll();
  });
  $("export").addEventListener("click", () => download(current()));
  $("system").addEventListener("change", () => {
    current().system = $("system").value;
    save();
  });
  $("api-key").value = store.apiKey();
  $("api-key").addEventListener("change", () => store.setApiKey($("api-key").value.trim()));
  window.addEventListener("storage", () => {   // another tab changed the conversations
    if (state.controller) return;
    state.conversations = store.loadAll();
    renderAll();
  });
}

wire();
renderAll();
refreshHealth();
setInterval(refreshHealth, 5000);
document.body.dataset.ready = "1";
