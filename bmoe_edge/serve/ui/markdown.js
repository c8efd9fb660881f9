// A small markdown renderer for model output, which is untrusted: it builds DOM nodes (createElement, text
// nodes) and never parses text as HTML, so `<script>`, `<img onerror=...>` and the like stay text. Links keep
// only http(s) targets (resolved by URL, so `javascript:`, `data:` and friends are shown as plain text), open
// apart and carry rel="noopener noreferrer". It takes a partial answer too (a stream): an unclosed fence is a
// code block to the end. What it knows: fenced and indented-free code blocks, headings, lists (nested by
// indent), block quotes, rules, paragraphs with line breaks; inline code, bold, italic, strikethrough, links
// and bare web addresses.

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const MAX_DEPTH = 16;   // nested quotes and lists past this are shown flat (hostile input cannot blow the stack)

function el(tag, text) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  return node;
}

// A link's target, if it may be one: an absolute http(s) address (relative ones would point into this server).
export function safeHref(raw) {
  let url;
  try {
    url = new URL(raw);
  } catch {
    return null;
  }
  return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
}

function link(parent, text, target, depth) {
  const href = safeHref(target);
  if (href === null) {   // not a web address: what the model wrote, as text
    parent.append(document.createTextNode(text === target ? text : `${text} (${target})`));
    return;
  }
  const a = el("a");
  a.href = href;
  a.rel = "noopener noreferrer";
  a.target = "_blank";
  if (text === target) a.textContent = text;
  else inline(text, a, depth + 1, true);   // no link inside a link
  parent.append(a);
}

// Inline spans, tried where their first character is; anything else is text.
const LINK = true;
const SPANS = [
  [/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/y, (m, p) => p.append(el("code", m[2].replace(/^ (.+) $/, "$1")))],
  [/\*\*(?=\S)([\s\S]*?\S)\*\*/y, (m, p, d, l) => inline(m[1], p.appendChild(el("strong")), d + 1, l)],
  [/__(?=\S)([\s\S]*?\S)__(?!\w)/y, (m, p, d, l) => inline(m[1], p.appendChild(el("strong")), d + 1, l)],
  [/~~(?=\S)([\s\S]*?\S)~~/y, (m, p, d, l) => inline(m[1], p.appendChild(el("del")), d + 1, l)],
  [/\*(?=[^\s*])([\s\S]*?[^\s*])\*/y, (m, p, d, l) => inline(m[1], p.appendChild(el("em")), d + 1, l)],
  [/_(?=[^\s_])([\s\S]*?[^\s_])_(?!\w)/y, (m, p, d, l) => inline(m[1], p.appendChild(el("em")), d + 1, l)],
  [/\[([^\]\n]*)\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"\n]*")?\s*\)/y, (m, p, d) => link(p, m[1], m[2], d), LINK],
  [/<(https?:[^\s<>]+)>/y, (m, p, d) => link(p, m[1], m[1], d), LINK],
  [/https?:\/\/[^\s<>"'`]*[^\s<>"'`.,;:!?)\]]/y, (m, p, d) => link(p, m[0], m[0], d), LINK],
  [/\\([\\`*_{}[\]()#+\-.!~>|])/y, (m, p) => p.append(document.createTextNode(m[1]))],
];
const STARTS = new Set("`*_~[<h\\");

export function inline(text, parent, depth = 0, inLink = false) {
  let plain = "";
  const flush = () => {
    if (plain) parent.append(document.createTextNode(plain));
    plain = "";
  };
  for (let i = 0; i < text.length;) {
    const c = text[i];
    let matched = null;
    if (STARTS.has(c) && depth < MAX_DEPTH && !(c === "_" && /\w/.test(text[i - 1] || "")) &&
        !(c === "h" && /\w/.test(text[i - 1] || ""))) {
      for (const [re, make, makesLink] of SPANS) {
        if (makesLink && inLink) continue;
        re.lastIndex = i;
        const m = re.exec(text);
        if (m) {
          matched = [m, make];
          break;
        }
      }
    }
    if (!matched) {
      plain += c;
      i += 1;
      continue;
    }
    flush();
    const [m, make] = matched;
    make(m, parent, depth, inLink);
    i += m[0].length;
  }
  flush();
}

// A paragraph's lines: inline spans, a line break between lines.
function paragraph(lines, parent, depth) {
  const p = el("p");
  lines.forEach((line, n) => {
    if (n) p.append(el("br"));
    inline(line.trim(), p, depth);
  });
  parent.append(p);
}

function list(lines, start, parent, depth) {
  // Items at the first item's indent; deeper lines belong to the item above them.
  const indent = ITEM.exec(lines[start])[1].length;
  const ordered = /\d/.test(ITEM.exec(lines[start])[2]);
  const node = el(ordered ? "ol" : "ul");
  if (ordered) {
    const first = parseInt(ITEM.exec(lines[start])[2], 10);
    if (first !== 1) node.start = first;
  }
  let i = start;
  while (i < lines.length) {
    const m = ITEM.exec(lines[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const body = [m[3]];
    i += 1;
    while (i < lines.length && lines[i].trim() !== "") {
      const sub = ITEM.exec(lines[i]);
      const lead = lines[i].length - lines[i].trimStart().length;
      if (sub && sub[1].length <= indent) break;   // the next item, or the list's end
      if (!sub && lead <= indent && (FENCE.test(lines[i]) || HEADING.test(lines[i]))) break;
      body.push(lead > indent ? lines[i].slice(Math.min(lead, indent + 2)) : lines[i].trimStart());
      i += 1;
    }
    const li = el("li");
    blocks(body, li, depth + 1, true);
    node.append(li);
    if (i < lines.length && lines[i].trim() === "" && i + 1 < lines.length) {
      const next = ITEM.exec(lines[i + 1]);
      if (next && next[1].length === indent) i += 1;   // a blank line between items: the same list
    }
  }
  parent.append(node);
  return i;
}

// Block structure, line by line. `tight`: a list item's text is inline, not a paragraph.
function blocks(lines, parent, depth = 0, tight = false) {
  if (depth > MAX_DEPTH) {
    parent.append(el("p", lines.join("\n")));
    return;
  }
  let i = 0;
  let para = [];
  const endPara = () => {
    if (!para.length) return;
    if (tight && parent.tagName === "LI" && !parent.childNodes.length) {
      para.forEach((line, n) => {
        if (n) parent.append(el("br"));
        inline(line.trim(), parent, depth);
      });
    } else {
      paragraph(para, parent, depth);
    }
    para = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {   // everything up to the closing fence (or the end: a stream in progress) is code
      endPara();
      const mark = fence[1];
      const code = [];
      i += 1;
      while (i < lines.length && !new RegExp(`^ {0,3}${mark[0]}{${mark.length},}\\s*$`).test(lines[i])) {
        code.push(lines[i]);
        i += 1;
      }
      i += 1;
      const pre = el("pre");
      const codeNode = el("code", code.join("\n"));
      const lang = fence[2].replace(/[^\w+#.-]/g, "").slice(0, 32);
      if (lang) {
        codeNode.className = `language-${lang}`;
        pre.dataset.lang = lang;
      }
      pre.append(codeNode);
      parent.append(pre);
      continue;
    }
    if (line.trim() === "") {
      endPara();
      i += 1;
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      endPara();
      const h = el(`h${Math.min(6, heading[1].length + 2)}`);   // the page's own headings stay above
      inline(heading[2], h, depth);
      parent.append(h);
      i += 1;
      continue;
    }
    if (RULE.test(line) && !para.length) {
      parent.append(el("hr"));
      i += 1;
      continue;
    }
    const item = ITEM.exec(line);
    if (item && (!para.length || !/\d/.test(item[2]) || /^1[.)]$/.test(item[2]))) {   // CommonMark's interruptions
      endPara();
      i = list(lines, i, parent, depth);
      continue;
    }
    if (QUOTE.test(line)) {
      endPara();
      const quoted = [];
      while (i < lines.length && QUOTE.test(lines[i])) {
        quoted.push(QUOTE.exec(lines[i])[1]);
        i += 1;
      }
      const q = el("blockquote");
      blocks(quoted, q, depth + 1);
      parent.append(q);
      continue;
    }
    para.push(line);
    i += 1;
  }
  endPara();
}

// The rendered text as a fragment of DOM nodes (nothing is parsed as HTML).
export function render(text) {
  const out = document.createDocumentFragment();
  blocks(String(text).replace(/\r\n?/g, "\n").split("\n"), out);
  return out;
}
