// Conversations and the API key live in this browser only (localStorage): the server keeps nothing.

const CONVERSATIONS = "bmoe-edge.conversations";
const KEY = "bmoe-edge.api-key";
const CURRENT = "bmoe-edge.current";

// The sampling settings a conversation carries, with the server's defaults (docs/serve.md): "" = the server's.
export const SETTINGS = {
  temperature: { label: "Temperature", min: 0, max: 2, step: 0.05, value: "" },
  max_tokens: { label: "Max tokens", min: 1, max: 32768, step: 1, value: 512 },
  presence_penalty: { label: "Presence penalty", min: -2, max: 2, step: 0.1, value: "" },
  frequency_penalty: { label: "Frequency penalty", min: -2, max: 2, step: 0.1, value: "" },
  repeat_penalty: { label: "Repeat penalty", min: 0, max: 10, step: 0.05, value: "" },
};

function read(name, fallback) {
  try {
    const raw = localStorage.getItem(name);
    return raw === null ? fallback : JSON.parse(raw);
  } catch {
    return fallback;
  }
}

export function apiKey() {
  return localStorage.getItem(KEY) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY, key);
  else localStorage.removeItem(KEY);
}

export function loadAll() {
  const found = read(CONVERSATIONS, []);
  return Array.isArray(found) ? found.filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages)) : [];
}

export function saveAll(conversations) {
  try {
    localStorage.setItem(CONVERSATIONS, JSON.stringify(conversations));
    return true;
  } catch {
    return false;   // the browser's quota: the caller says so
  }
}

export function currentId() {
  return localStorage.getItem(CURRENT);
}

export function setCurrentId(id) {
  localStorage.setItem(CURRENT, id);
}

export function create() {
  const settings = {};
  for (const [name, row] of Object.entries(SETTINGS)) settings[name] = row.value;
  const now = Date.now();
  return {
    id: `c${now.toString(36)}${Math.random().toString(36).slice(2, 8)}`,
    title: "New chat", created: now, updated: now, system: "", settings, messages: [],
  };
}

// A conversation as a JSON file the user downloads.
export function exportJson(conversation) {
  return JSON.stringify({ format: "bmoe-edge.conversation", version: 1, ...conversation }, null, 2);
}
