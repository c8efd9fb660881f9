"""`bmoe-edge chat`: a conversation in the terminal. Readline history, slash commands, Ctrl-C stops the
answer (not the program), Ctrl-D leaves."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bmoe_edge.engine import chat
from bmoe_edge.errors import BmoeError

HELP = """commands:
  /reset        start a new conversation (the system prompt stays)
  /save FILE    save the conversation (FILE: the context, FILE.json: the messages)
  /load FILE    resume a saved conversation
  /stats        the last answer's tokens, speed and streaming telemetry
  /help         this text
  /quit         leave (or Ctrl-D)"""


def history_file() -> Path:
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "bmoe-edge" / "chat-history"


def _readline() -> Callable[[], None]:
    """Line editing and a history kept across runs, where the platform has readline."""
    try:
        import readline
    except ImportError:
        return lambda: None
    path = history_file()
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    readline.set_history_length(1000)

    def save() -> None:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # what was typed is private: the file is the user's alone, before a line is written to it
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
            os.chmod(path, 0o600)
            readline.write_history_file(path)
        except OSError:
            pass
    return save


# C0 controls but tab and newline, DEL, and C1 controls (ESC, CSI, OSC, ... start terminal sequences)
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Model text made safe for a terminal: a control character (the start of an escape sequence that
    could retitle the window, move the cursor, rewrite the screen) is shown as its code, not obeyed."""
    return _CONTROLS.sub(lambda m: f"^{chr(ord(m[0]) + 64)}" if ord(m[0]) < 32 else f"<{ord(m[0]):02x}>", text)


def stats(reply: chat.Reply) -> str:
    m = reply.metrics
    if not m:
        return "no answer yet"
    decode = m[1:]
    ms = sum(x.wall_ms for x in decode)
    lookups, hits = sum(x.cache_lookups for x in m), sum(x.cache_hits for x in m)
    mib = sum(x.bytes_read for x in decode) / 2**20 / max(1, len(decode))
    lines = [
        f"prompt {reply.prompt_tokens} tokens ({reply.reused_tokens} reused from the context, "
        f"{reply.prompt_tokens - reply.reused_tokens} decoded in {m[0].wall_ms:.0f} ms)",
        f"answer {reply.completion_tokens} tokens, {1000 * len(decode) / ms if ms else 0:.2f} tok/s, "
        f"finish: {reply.finish_reason or 'stopped'}",
        f"experts: cache hits {100 * hits / lookups if lookups else 0:.1f}%, {mib:.1f} MiB read/token, "
        f"stall {sum(x.stall_ms for x in decode) / max(1, len(decode)):.1f} ms/token, "
        f"RSS {m[-1].rss_bytes / 2**20:.0f} MiB",
    ]
    return "\n".join(lines)


def _command(session: chat.Session, line: str, say: Callable[[str], None]) -> bool:
    """Run a slash command; False to leave."""
    try:
        words = shlex.split(line)
    except ValueError as exc:   # an unclosed quote: say so, keep the conversation
        say(f"error: {exc} (quote a FILE with spaces, e.g. /save 'my conv')")
        return True
    if not words:
        say(HELP)
        return True
    name, args = words[0], words[1:]
    if name in ("/quit", "/exit"):
        return False
    if name == "/reset":
        session.reset()
        say("(new conversation)")
    elif name in ("/save", "/load") and len(args) == 1:
        if name == "/save":
            written = session.save(args[0])
            say(f"(saved to {', '.join(map(str, written))})")
        else:
            session.load(args[0])
            say(f"(loaded {len(session.messages)} messages, {len(session.engine.context_tokens)} tokens of context)")
    elif name == "/stats":
        say(stats(session.last))
    else:
        say(HELP)
    return True


def _answer(session: chat.Session, text: str, out=sys.stdout) -> None:
    dim = out.isatty()
    in_reasoning = False
    answer = session.send(text)
    try:
        for delta in answer:
            if delta.reasoning:
                if not in_reasoning:
                    out.write("\x1b[2m" if dim else "[thinking] ")
                    in_reasoning = True
                out.write(printable(delta.reasoning))
            if delta.content:
                if in_reasoning:
                    out.write("\x1b[0m\n" if dim else "\n[answer] ")
                    in_reasoning = False
                out.write(printable(delta.content))
            out.flush()
    except KeyboardInterrupt:
        answer.close()  # now, so what arrived joins the conversation before the next message
        out.write(" [stopped]")
    finally:
        if in_reasoning and dim:
            out.write("\x1b[0m")
        out.write("\n")
        out.flush()


@contextlib.contextmanager
def _warming(engine: Any) -> Iterator[None]:
    """While the user types: the engine faults in the memory its expert cache may fill, a step at a time (as
    `serve` does between requests), so the next answer's prompt does not wait for the kernel to zero it. The
    next call waits for at most the step under way. A failure only stops the warming. `engine`: the session's
    `session.Engine` (its `warm_cache_memory` is not part of what a conversation needs of an engine)."""
    stop = threading.Event()

    def warm() -> None:
        with contextlib.suppress(BmoeError):
            while not stop.is_set() and engine.warm_cache_memory():
                pass

    thread = threading.Thread(target=warm, name="bmoe-warm", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def run(session: chat.Session, *, say: Callable[[str], None] = print) -> None:
    save_history = _readline()
    if session.template.note:
        say(f"note: {session.template.note}")
    say("chat: type a message; /help for commands, Ctrl-C stops an answer, Ctrl-D leaves")
    try:
        while True:
            try:
                with _warming(session.engine):
                    line = input("> ").strip()
            except KeyboardInterrupt:
                say("")
                continue
            except EOFError:
                say("")
                return
            if not line:
                continue
            try:
                if line.startswith("/"):
                    if not _command(session, line, say):
                        return
                else:
                    _answer(session, line)
            except BmoeError as exc:
                say(f"error: {printable(str(exc))}")
    finally:
        save_history()
