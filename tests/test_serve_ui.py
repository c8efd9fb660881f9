"""The chat page `serve` answers at / (bmoe_edge/serve/ui/), driven in a real browser: Debian's headless Chromium
and its driver (scripts/setup.sh installs them), selenium from PyPI (a dev dependency). A real server on the
tiny fixture streams the answers; the page's markdown renderer is fed hostile model output in the same browser.

Without Chromium these tests skip with the reason, except in CI (CI=true), where its absence is a failure."""

from __future__ import annotations

import http.client as http_client
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bmoe_edge.serve import ui
from bmoe_edge.synthetic import tinymoe

from test_serve import KEY, Server, http, post, start, stop

# a path: the page's screenshot is saved there (bench-data/2026-12-05/chat-page/chat-page.png, in docs/serve.md)
SCREENSHOT_ENV = "BMOE_EDGE_UI_SCREENSHOT"
LONG = 6000          # a long answer's max_tokens: several seconds on the tiny model, stopped long before
WAIT_S = 30


def _browser_paths() -> tuple[str, str] | str:
    """Chromium and its driver, or why they cannot be had."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (a dev dependency: scripts/setup.sh)"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        return "Chromium or chromedriver is missing (apt: chromium chromium-driver; scripts/setup.sh installs them)"
    return chromium, driver


def _need_browser() -> tuple[str, str]:
    found = _browser_paths()
    if isinstance(found, str):
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the browser tests: {found}", pytrace=False)
        pytest.skip(found)
    return found


@contextmanager
def chromium() -> Iterator[Any]:
    """Headless Chromium under selenium (skips, or fails in CI, without them)."""
    chromium_path, driver_path = _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium_path
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,860",
                "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_script_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


@pytest.fixture(scope="module")
def server(model: Path) -> Iterator[Server]:
    s = start(model, "--ctx", str(LONG + 256))
    yield s
    stop(s)


def wait_for(what: Callable[[], Any], timeout: float = WAIT_S, message: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting: {message or what}")
        time.sleep(0.02)


def open_page(driver: Any, url: str) -> None:
    driver.get(url + "/")
    wait_for(lambda: driver.execute_script("return document.body.dataset.ready === '1'"), message="the page's script")


def by_css(driver: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, css)


def texts(driver: Any, css: str) -> list[str]:
    """The elements' text, read in the page at once (the transcript is re-rendered as an answer streams)."""
    return driver.execute_script("return [...document.querySelectorAll(arguments[0])].map(e => e.innerText)", css)


def answers(driver: Any) -> list[str]:
    return texts(driver, ".msg.assistant .content")


def set_field(driver: Any, css: str, value: str) -> None:
    """Type into a field and leave it (its change event: what the page saves on)."""
    from selenium.webdriver.common.keys import Keys

    [field] = by_css(driver, css)
    field.clear()
    field.send_keys(value, Keys.TAB)


def send(driver: Any, text: str) -> None:
    [prompt] = by_css(driver, "#prompt")
    prompt.send_keys(text)
    by_css(driver, "#send")[0].click()


def idle(driver: Any) -> bool:
    return driver.execute_script("return document.getElementById('stop').hidden && "
                                 "!document.querySelector('.msg.pending')")


def ask_once(driver: Any, url: str, question: str, *, max_tokens: int, key: str | None = None,
             timeout: float = WAIT_S) -> str:
    """Open the page at `url`, give it the key, ask one question in a new conversation: the answer's text."""
    open_page(driver, url)
    by_css(driver, "#new-chat")[0].click()
    if key is not None:
        by_css(driver, "#access summary")[0].click()
        set_field(driver, "#api-key", key)
    set_field(driver, "#set-max_tokens", str(max_tokens))
    send(driver, question)
    wait_for(lambda: idle(driver) and answers(driver), timeout=timeout, message="the answer")
    assert texts(driver, "#error") in ([""], []) or by_css(driver, "#error")[0].get_attribute("hidden") is not None
    return answers(driver)[-1]


def test_the_page_is_static_same_origin_and_locked_down(server: Server, model: Path) -> None:
    page = http(server.url, "GET", "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    for directive in ("default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "object-src 'none'"):
        assert directive in csp, csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert not re.search(r"https?://", page.text)   # what `curl -s / | grep -E 'https?://'` looks for
    # every file it loads is served from here, as its type, with no other host named in it
    files = ui.files()
    assert {"index.html", "app.js", "markdown.js", "style.css"} <= set(files)
    for name, (body, media_type) in files.items():
        r = http(server.url, "GET", "/" if name == ui.INDEX else ui.PREFIX + name)
        assert r.status_code == 200 and r.headers["content-type"] == media_type and r.text.encode() == body, name
        assert r.headers["content-security-policy"] == csp
        assert not re.search(r"https?://", r.text), name
    assert not re.search(r"<script(?![^>]*\bsrc=)", page.text), "an inline script"
    assert http(server.url, "GET", "/ui/../app.py").status_code == 404
    # the API beside it is unchanged: /health public, the rest as before
    assert http(server.url, "GET", "/health").json()["status"] == "ok"


def test_no_ui_turns_the_page_off(model: Path) -> None:
    s = start(model, "--no-ui")
    try:
        r = http(s.url, "GET", "/")
        assert r.status_code == 404 and r.json()["error"]["message"], r.text
        assert http(s.url, "GET", ui.PREFIX + "app.js").status_code == 404
        assert http(s.url, "GET", "/health").status_code == 200
    finally:
        stop(s)


def test_a_same_origin_page_passes_the_gate_and_others_still_do_not(server: Server) -> None:
    port = server.url.rsplit(":", 1)[1]
    body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json"}
    same = http(server.url, "POST", "/v1/chat/completions", body, headers | {"Origin": f"http://127.0.0.1:{port}"})
    assert same.status_code == 200, same.text
    for origin in ("https://evil.example", f"http://localhost:{port}", f"http://127.0.0.1:{int(port) + 1}", "null"):
        r = http(server.url, "POST", "/v1/chat/completions", body, headers | {"Origin": origin})
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", origin
    # a rebound name is refused by the Host check before its (same-looking) Origin is looked at
    rebound = http(server.url, "POST", "/v1/chat/completions", body,
                   headers | {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"})
    assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "host_not_allowed"


def test_streamer_stats_come_per_step_and_per_answer(server: Server) -> None:
    whole = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
                                                  "temperature": 0, "streamer_stats": True}, key=None).json()
    answer = whole["streamer"]["answer"]
    assert answer["tokens"] == 5 and answer["tok_s"] > 0 and answer["ttft_ms"] > 0 and 0 <= answer["hit_rate"] <= 1
    plain = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
                                                  "temperature": 0}, key=None).json()
    assert "streamer" not in plain
    assert plain["choices"][0]["message"]["content"] == whole["choices"][0]["message"]["content"]
    streamed = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                     "max_tokens": 5, "temperature": 0, "stream": True,
                                                     "streamer_stats": True}, key=None).text
    chunks = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: {")]
    steps = [s["step"] for c in chunks for s in c.get("streamer", {}).get("steps", [])]
    assert steps == list(range(len(steps))) and len(steps) >= 5, steps   # the prompt's step 0, then each token's
    assert chunks[-1]["streamer"]["answer"]["tokens"] == 5
    bad = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                "streamer_stats": "yes"}, key=None)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "streamer_stats"


def test_chat_streams_stops_frees_the_engine_and_survives_a_reload(server: Server, browser: Any) -> None:
    open_page(browser, server.url)
    wait_for(lambda: texts(browser, "#model") == [server.model_id], message="the model's name")
    set_field(browser, "#set-max_tokens", str(LONG))
    send(browser, "Tell me a long story")
    # the answer streams in: its text grows across polls while the stop button is up
    seen = [len(wait_for(lambda: (answers(browser) or [""])[-1], message="a first piece"))]
    while len(seen) < 3:
        length = len(answers(browser)[-1])
        if length > seen[-1]:
            seen.append(length)
        assert not idle(browser), f"the answer ended before it was seen growing: {seen}"
        time.sleep(0.03)
    assert by_css(browser, "#stop")[0].is_displayed()
    # the next question is typed (and its settings changed) while the long answer streams, then: stop, send
    set_field(browser, "#set-max_tokens", "4")
    by_css(browser, "#prompt")[0].send_keys("And now briefly")
    by_css(browser, "#stop")[0].click()
    stopped_at = time.monotonic()
    wait_for(lambda: idle(browser), message="the stop")
    by_css(browser, "#send")[0].click()
    # the engine is free: the next answer is there, whole, within a second of the stop
    wait_for(lambda: len(answers(browser)) == 2 and answers(browser)[-1] and idle(browser), timeout=5,
             message="the next answer")
    took = time.monotonic() - stopped_at
    assert took < 1.0, f"the next answer came {took:.2f} s after the stop"
    assert texts(browser, ".msg.assistant .note") == ["stopped"]
    metrics = http(server.url, "GET", "/metrics").text
    assert float(re.search(r"^bmoe_requests_cancelled_total (\S+)$", metrics, re.M)[1]) >= 1
    stopped = answers(browser)[0]
    assert stopped and len(stopped) < LONG   # cut short: far fewer than the tokens asked for
    # the streamer's view under each answer: figures and a sparkline
    stats = texts(browser, ".msg.assistant .stats")
    assert len(stats) == 2 and "tok/s" in stats[-1] and "MB/tok" in stats[-1] and "hit" in stats[-1], stats
    assert by_css(browser, ".msg.assistant .stats canvas.sparkline")
    # a reload finds the conversation (this browser's storage), both answers and its settings
    browser.refresh()
    wait_for(lambda: browser.execute_script("return document.body.dataset.ready === '1'"))
    assert answers(browser) == [stopped, answers(browser)[1]] and len(answers(browser)) == 2
    assert texts(browser, ".msg.user .content") == ["Tell me a long story", "And now briefly"]
    assert by_css(browser, "#set-max_tokens")[0].get_attribute("value") == "4"
    titles = texts(browser, "#conversations .title")
    assert titles == ["Tell me a long story"], titles
    saved = json.loads(browser.execute_script("return localStorage.getItem('bmoe-edge.conversations')"))
    assert saved[0]["messages"][1]["stopped"] is True
    if os.environ.get(SCREENSHOT_ENV):
        browser.save_screenshot(os.environ[SCREENSHOT_ENV])
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]]


def test_conversations_are_listed_renamed_exported_and_deleted(server: Server, browser: Any) -> None:
    open_page(browser, server.url)   # this browser's storage may hold others' conversations, or none
    by_css(browser, "#new-chat")[0].click()
    set_field(browser, "#set-max_tokens", "2")
    send(browser, "First chat")
    wait_for(lambda: idle(browser) and answers(browser), message="the first answer")
    by_css(browser, "#new-chat")[0].click()
    set_field(browser, "#set-max_tokens", "3")
    set_field(browser, "#system", "Be brief.")
    send(browser, "Second chat")
    wait_for(lambda: idle(browser) and answers(browser), message="the answer")
    assert len(by_css(browser, "#conversations li")) >= 2
    [active] = by_css(browser, "#conversations li.active")
    active.find_element("css selector", ".rename").click()
    by_css(browser, "#conversations .rename-input")[0].send_keys("Renamed\n")   # its old title is selected
    assert "Renamed" in texts(browser, "#conversations .title")
    exported = json.loads(browser.execute_script(
        "const all = JSON.parse(localStorage.getItem('bmoe-edge.conversations'));"
        "return JSON.stringify(all.find(c => c.title === 'Renamed'))"))
    assert exported["system"] == "Be brief." and exported["settings"]["max_tokens"] == 3
    assert [m["role"] for m in exported["messages"]] == ["user", "assistant"]
    before = len(by_css(browser, "#conversations li"))
    [active] = by_css(browser, "#conversations li.active")
    delete = active.find_element("css selector", ".delete")
    delete.click()
    delete.click()   # the second click deletes
    wait_for(lambda: len(by_css(browser, "#conversations li")) == before - 1, message="the deletion")
    assert "Renamed" not in texts(browser, "#conversations .title")


HOSTILE = """Hello <img src=x onerror="window.__pwned = 'img'"> and <script>window.__pwned = 'script'</script>
[click me](javascript:window.__pwned='link') [again](JaVaScRiPt:alert(1)) [data](data:text/html,<script>x</script>)
[ok](https://example.org/a?b=1) <svg onload="window.__pwned='svg'"></svg> **<b onmouseover=x>bold</b>**
<a href="javascript:window.__pwned='a'">raw anchor</a> <iframe src="javascript:window.__pwned='frame'"></iframe>

````markdown
```html
<img src=y onerror="window.__pwned='fence'">
```
````

* a list item with `<style>*{}</style>` in code
* [nested **link**](vbscript:msgbox)

> quoted <img src=z onerror="window.__pwned='quote'">
""" + "[" * 3000 + "deep" + "]" * 3000 + "\n" + "> " * 200 + "deep quote\n"

INSPECT = """
window.__pwned = false;
const box = document.createElement('div');
document.body.append(box);
box.append(window.bmoeMarkdown.render(arguments[0]));
const all = [...box.querySelectorAll('*')];
return {
  tags: [...new Set(all.map(e => e.tagName.toLowerCase()))].sort(),
  handlers: all.flatMap(e => [...e.attributes].filter(a => a.name.startsWith('on')).map(a => a.name)),
  hrefs: [...box.querySelectorAll('a')].map(a => [a.getAttribute('href'), a.rel, a.target]),
  code: [...box.querySelectorAll('pre code')].map(c => [c.className, c.textContent]),
  text: box.textContent,
};
"""


def test_hostile_model_output_renders_as_text_and_nothing_runs(server: Server, browser: Any) -> None:
    open_page(browser, server.url)
    got = browser.execute_script(INSPECT, HOSTILE)
    allowed = {"a", "p", "br", "strong", "em", "del", "code", "pre", "ul", "ol", "li", "blockquote", "hr",
               "h3", "h4", "h5", "h6"}
    assert set(got["tags"]) <= allowed, got["tags"]
    assert not got["handlers"]
    # the one link is the web address, opened apart; the others are text
    assert got["hrefs"] == [["https://example.org/a?b=1", "noopener noreferrer", "_blank"]], got["hrefs"]
    for shown in ('<img src=x onerror="window.__pwned', "<script>window.__pwned", "javascript:window.__pwned='link'",
                  "<svg onload", "vbscript:msgbox"):
        assert shown in got["text"], shown
    # the nested fence is one code block, its inner fence and markup its text
    [(lang, code)] = got["code"]
    assert lang == "language-markdown" and code.startswith("```html\n<img src=y onerror=") and code.endswith("```")
    time.sleep(0.3)   # an image's error handler would have run by now
    assert browser.execute_script("return window.__pwned") is False
    # and the page's own policy refuses an inline script outright, were one ever to reach the document
    ran = browser.execute_script("""
        window.__inline = false;
        const s = document.createElement('script');
        s.textContent = 'window.__inline = true';
        document.body.append(s);
        return window.__inline;""")
    assert ran is False


def test_markdown_renders_what_models_write(server: Server, browser: Any) -> None:
    open_page(browser, server.url)
    text = ("# Title\n\nSome **bold**, *italic*, `code` and a_snake_case_name.\n\n1. one\n2. two\n   - inner\n\n"
            "```python\nprint('hi')\n```\n\nSee <https://example.org> or https://example.org/x.")
    got = browser.execute_script(INSPECT, text)
    assert {"h3", "strong", "em", "code", "ol", "ul", "li", "pre", "a"} <= set(got["tags"]), got["tags"]
    assert got["code"] == [["language-python", "print('hi')"]]
    assert [h[0] for h in got["hrefs"]] == ["https://example.org/", "https://example.org/x"], got["hrefs"]
    assert "a_snake_case_name" in got["text"]


def test_with_an_api_key_a_wrong_key_is_shown_and_the_right_one_works(model: Path, browser: Any) -> None:
    s = start(model, "--api-key", KEY)
    try:
        assert http(s.url, "GET", "/").status_code == 200   # the page itself needs no key
        assert http(s.url, "GET", "/v1/models").status_code == 401   # its API calls do
        open_page(browser, s.url)
        set_field(browser, "#set-max_tokens", "3")
        send(browser, "Hello without a key")
        error = wait_for(lambda: texts(browser, "#error")[0], message="the error")
        assert "API key" in error and "a valid API key is needed" in error, error   # the server's own words
        by_css(browser, "#access summary")[0].click()
        set_field(browser, "#api-key", "wrong-key")
        send(browser, "Hello with a wrong key")
        wait_for(lambda: idle(browser) and len(by_css(browser, ".msg-error")) == 2, message="the second error")
        assert "a valid API key is needed" in texts(browser, "#error")[0]
        set_field(browser, "#api-key", KEY)
        send(browser, "Hello with the key")
        wait_for(lambda: idle(browser) and by_css(browser, "#error")[0].get_attribute("hidden") is not None
                 and answers(browser)[-1], message="the answer")
        assert browser.execute_script("return localStorage.getItem('bmoe-edge.api-key')") == KEY
    finally:
        stop(s)


def _hold(s: Server, *, running: bool) -> http_client.HTTPConnection:
    """A long streamed answer asked for and left open: `running`, its first piece read (the engine is on it);
    else only sent (it waits in the queue)."""
    host, port = s.url.removeprefix("http://").rsplit(":", 1)
    conn = http_client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "Go", "max_tokens": LONG, "stream": True}),
                 headers={"Content-Type": "application/json"})
    if running:
        response = conn.getresponse()
        assert response.status == 200
        response.readline()
    return conn


def test_a_busy_and_a_vanished_server_are_told_apart(model: Path, browser: Any) -> None:
    s = start(model, "--ctx", str(LONG + 256), "--queue", "1")
    held = []
    try:
        open_page(browser, s.url)
        by_css(browser, "#new-chat")[0].click()
        set_field(browser, "#set-max_tokens", "3")
        held += [_hold(s, running=True), _hold(s, running=False)]   # one answering, one waiting: the queue is full
        wait_for(lambda: http(s.url, "GET", "/health").json()["queue_depth"] >= 1, message="a full queue")
        send(browser, "Are you busy?")
        busy = wait_for(lambda: texts(browser, "#error")[0], message="the busy message")
        assert "busy" in busy and "queue" in busy, busy
        for conn in held:
            conn.close()
        held.clear()
    finally:
        for conn in held:
            conn.close()
        stop(s)
    send(browser, "Are you there?")
    gone = wait_for(lambda: texts(browser, "#error")[0], message="the unreachable message")
    assert "cannot be reached" in gone, gone
