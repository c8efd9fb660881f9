// Talking to this server: its own origin (the page is served by it), the API key (if the user gave one) as
// the bearer, answers streamed as server-sent events. Every failure becomes an ApiError with a message for
// the user: the server's own (OpenAI's error object) when it answered, else what went wrong on the way.

export class ApiError extends Error {
  constructor(status, message, code = null) {
    super(message);
    this.status = status;   // 0: no answer (unreachable, or the stream broke)
    this.code = code;
  }
}

function headers(key) {
  const out = { "Content-Type": "application/json" };
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

// What a refused request means to the user, with the server's own words.
export function explain(status, message, retryAfter) {
  if (status === 401) return `The server needs a valid API key (Settings → API key). The server said: ${message}`;
  if (status === 429) {
    const wait = retryAfter ? ` in ${retryAfter} s` : " shortly";
    return `The server is busy (its queue is full): try again${wait}. The server said: ${message}`;
  }
  if (status === 403) return `The server refused this page: ${message}`;
  if (status >= 500) return `The server failed (${status}): ${message}`;
  return `The server refused the request (${status}): ${message}`;
}

async function refusal(response) {
  let message = response.statusText || "no reason given";
  let code = null;
  try {
    const body = await response.json();
    if (body && body.error) {
      message = body.error.message || message;
      code = body.error.code || null;
    }
  } catch {
    // not JSON: the status line says it
  }
  return new ApiError(response.status, explain(response.status, message, response.headers.get("Retry-After")), code);
}

async function send(path, init) {
  try {
    return await fetch(path, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, "The server cannot be reached: is it running, and is this page's address still " +
      `the board's? (${error.message})`);
  }
}

export async function getJson(path, key) {
  const response = await send(path, { headers: headers(key) });
  if (!response.ok) throw await refusal(response);
  return response.json();
}

// POST a chat request with "stream": true; yields each event's JSON until [DONE].
export async function* streamChat(body, key, signal) {
  const response = await send("v1/chat/completions", {
    method: "POST", headers: headers(key), body: JSON.stringify(body), signal,
  });
  if (!response.ok) throw await refusal(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (error) {
        if (error.name === "AbortError") throw error;
        throw new ApiError(0, `The answer's stream broke off: ${error.message}`);
      }
      if (chunk.done) break;
      buffer += chunk.value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart())
          .join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        const parsed = JSON.parse(data);
        if (parsed.error) {   // a failure mid-answer: OpenAI's error object as the last event
          throw new ApiError(parsed.error.code || 500, `The answer failed: ${parsed.error.message}`);
        }
        yield parsed;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
  throw new ApiError(0, "The answer's stream ended before its end (the server went away?)");
}
