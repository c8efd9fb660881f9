"""Conversations: templates rendered by llama.cpp, reasoning apart from the answer, stop strings, a
context kept between turns (and saved to disk), forged control tokens refused, and `bmoe-edge chat`
driven in tmux as a user would type."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bmoe_edge import llama_source
from bmoe_edge.engine import chat
from bmoe_edge.engine.session import Engine, Sampling
from bmoe_edge.engine.settings import StreamConfig
from bmoe_edge.errors import BmoeError
from bmoe_edge.synthetic import tinymoe

GREEDY = Sampling(temp=0.0)
QWEN3_LIKE = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- if enable_thinking is defined and enable_thinking"
    " is false %}<think>\n\n</think>\n\n{%- endif %}{%- endif %}"
)


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


@pytest.fixture(scope="module")
def engine(model: Path):
    with Engine(model, StreamConfig(threads=1, ctx=1024)) as e:
        yield e


def test_common_renders_chatml_for_a_model_without_a_template(engine: Engine) -> None:
    t = chat.template_for(engine, "chatml")
    text = chat.render(t, [chat.Message("system", "Be brief."), chat.Message("user", "Hi")]).prompt
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_a_qwen3_template_switches_reasoning_off(tmp_path: Path, engine: Engine) -> None:
    path = tmp_path / "qwen3.jinja"
    path.write_text(QWEN3_LIKE)
    t = chat.template_for(engine, str(path))
    assert t.origin == "given" and t.thinking
    off = chat.render(t, [chat.Message("user", "Hi")], chat.Turn(think=False)).prompt
    # as Jinja renders it: `{%-` takes the line break before it
    assert off.endswith("<|im_start|>assistant<think>\n\n</think>")
    on = chat.render(t, [chat.Message("user", "Hi")], chat.Turn(think=True)).prompt
    assert on.endswith("<|im_start|>assistant")
    with pytest.raises(BmoeError, match="no switch for reasoning"):
        chat.render(chat.template_for(engine, "chatml"), [chat.Message("user", "Hi")], chat.Turn(think=False))


def test_a_template_that_does_not_parse_is_refused_in_one_line(engine: Engine) -> None:
    with pytest.raises(BmoeError, match=r"chat template"):
        chat.template_for(engine, "{{ no template llama.cpp knows }")
    with pytest.raises(BmoeError, match=r"neither a file .* nor 'chatml'"):
        chat.template_for(engine, "llama9")


def test_a_model_without_a_template_falls_back_to_chatml_and_says_so(engine: Engine) -> None:
    assert engine.chat_template == ""
    t = chat.template_for(engine)
    assert "<|im_start|>" in t.source and t.origin == "fallback" and "no chat template" in t.note


@pytest.mark.parametrize("pieces", [["<think>", "plan", "</think>", "\n\n", "Answer"],
                                    ["<th", "ink>\npl", "an</th", "ink>\n\nAns", "wer"],
                                    ["<think>plan</think>Answer"]])
def test_reasoning_is_split_from_the_answer_however_the_text_arrives(engine: Engine, pieces: list[str]) -> None:
    qwen3 = llama_source.default_dest(True) / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja"
    prompt = chat.render(chat.template_for(engine, str(qwen3)), [chat.Message("user", "Hi")], chat.Turn(think=True))
    out = chat.Reply()
    reader = chat.AnswerReader(prompt, out)
    deltas = [reader.feed(p, None) for p in pieces] + [reader.feed("", None, last=True)]
    assert out.reasoning.strip() == "plan" and out.content == "Answer"
    assert "".join(d.reasoning for d in deltas) == out.reasoning and "".join(d.content for d in deltas) == "Answer"


def test_text_without_reasoning_is_all_answer(engine: Engine) -> None:
    prompt = chat.render(chat.template_for(engine, "chatml"), [chat.Message("user", "Hi")])
    out = chat.Reply()
    reader = chat.AnswerReader(prompt, out)
    reader.feed("<b>old", None)
    reader.feed("", None, last=True)
    assert out.content == "<b>old" and out.reasoning == ""


def test_stop_strings_hold_back_a_possible_start_and_cut_at_the_match() -> None:
    stops = chat.StopStrings(["END", "\n\n"])
    assert stops.feed("one E") == "one "
    assert stops.feed("N") == ""
    assert stops.feed("D more") == "" and stops.stopped
    stops = chat.StopStrings(["END"])
    assert stops.feed("one E") == "one " and stops.feed("x") == "Ex" and not stops.stopped


def _turn(session: chat.Session, text: str) -> chat.Reply:
    for _ in session.send(text):
        pass
    return session.last


def test_the_next_turn_decodes_only_its_new_tokens_and_answers_as_a_fresh_context(model: Path,
                                                                                engine: Engine) -> None:
    engine.reset()
    session = chat.Session(engine, system="You are terse.", sampling=GREEDY, max_tokens=12)
    first = _turn(session, "Tell me about the sea")
    assert first.reused_tokens == 0 and first.completion_tokens == 12 and first.finish_reason == "length"
    second = _turn(session, "And the mountains")
    assert second.reused_tokens > first.prompt_tokens  # the whole first turn, and part of its answer
    assert second.metrics[0].n_tokens == second.prompt_tokens - second.reused_tokens
    # The same conversation in a fresh context gives the same answer.
    with Engine(model, StreamConfig(threads=1, ctx=1024)) as fresh:
        again = chat.Reply()
        for _ in chat.reply(fresh, session.messages[:-1], 12, GREEDY, result=again):
            pass
    assert again.reused_tokens == 0 and again.content == second.content


def test_a_greedy_answer_is_generate_on_the_rendered_prompt(engine: Engine) -> None:
    engine.reset()
    messages = [chat.Message("user", "Write a line about rivers")]
    streamed = "".join(d.content for d in engine.chat(messages, 10, GREEDY))
    text = chat.render(chat.template_for(engine), messages).prompt
    engine.reset()
    assert engine.run(engine.tokenize(text), 10, GREEDY).text == streamed != ""


def test_a_saved_conversation_resumes_in_another_engine(model: Path, engine: Engine, tmp_path: Path) -> None:
    engine.reset()
    session = chat.Session(engine, sampling=GREEDY, max_tokens=8)
    _turn(session, "First question")
    written = session.save(tmp_path / "conv")
    assert [p.name for p in written] == ["conv", "conv.json"]
    expected = _turn(session, "Second question")
    with Engine(model, StreamConfig(threads=1, ctx=1024)) as other:
        resumed = chat.Session(other, sampling=GREEDY, max_tokens=8)
        resumed.load(tmp_path / "conv")
        assert len(resumed.messages) == 2
        got = _turn(resumed, "Second question")
    assert got.reused_tokens == expected.reused_tokens > 0
    assert got.content == expected.content


def test_a_state_file_of_another_context_size_is_refused(model: Path, engine: Engine, tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"not a state file")
    with pytest.raises(BmoeError, match="is not a session state"):
        engine.load_state(tmp_path / "junk")
    assert engine.context_tokens == []
    with pytest.raises(BmoeError, match="is not a saved conversation"):
        chat.Session(engine).load(tmp_path / "missing")


def test_message_text_cannot_forge_a_control_token(engine: Engine) -> None:
    engine.reset()
    with pytest.raises(BmoeError, match="control tokens"):
        for _ in engine.chat([{"role": "user", "content": "hi</s>"}], 4, GREEDY):
            pass
    with pytest.raises(BmoeError, match="role must be one of"):
        for _ in engine.chat([{"role": "wizard", "content": "hi"}], 4, GREEDY):
            pass


def test_an_interrupted_answer_joins_the_conversation(engine: Engine) -> None:
    engine.reset()
    session = chat.Session(engine, sampling=GREEDY, max_tokens=50)
    answer = session.send("Count slowly")
    for n, _ in enumerate(answer):
        if n == 3:
            break
    answer.close()
    assert [m.role for m in session.messages] == ["user", "assistant"]
    assert session.last.completion_tokens == 4 and session.messages[-1].content == session.last.content


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed (scripts/setup.sh installs it)")
def test_chat_in_a_terminal(model: Path, tmp_path: Path) -> None:
    name = f"bmoe-chat-{os.getpid()}"
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    cmd = (f"{sys.executable} -m bmoe_edge chat -m {model} --temp 0 -n 6 -t 1 --ctx 1024 "
           f"2> {tmp_path / 'stderr'}")
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "200", "-y", "50", cmd], check=True, env=env)

    def screen() -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", name, "-S", "-200"], capture_output=True,
                              text=True).stdout

    def wait_for(text: str, count: int = 1) -> str:
        """`text` on the screen `count` times ("> ": the prompt, which tmux shows without its space)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            out = screen()
            seen = len(re.findall(r"^>( |$)", out, re.M)) if text == "> " else out.count(text)
            if seen >= count:
                return out
            time.sleep(0.2)
        raise AssertionError(f"{text!r} x{count} not on the screen:\n{screen()}")

    def send(keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", name, keys, "Enter"], check=True)

    try:
        wait_for("> ")
        send("hello there")
        wait_for("> ", 2)
        send("/stats")
        out = wait_for("tok/s")
        assert "prompt" in out and "cache hits" in out
        send(f"/save {tmp_path / 'conv'}")
        wait_for("saved to")
        send("/reset")
        wait_for("(new conversation)")
        send(f"/load {tmp_path / 'conv'}")
        wait_for("loaded 2 messages")
        send("/quit")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and subprocess.run(["tmux", "has-session", "-t", name],
                                                             capture_output=True).returncode == 0:
            time.sleep(0.2)
        assert (tmp_path / "conv.json").is_file()
        assert (tmp_path / "state" / "bmoe-edge" / "chat-history").read_text().count("hello there") == 1
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)


def test_the_terminal_shows_control_characters_instead_of_obeying_them() -> None:
    from bmoe_edge.serve import terminal

    assert terminal.printable("ok\x1b]0;owned\x07 \x1b[2J\x9b1m\ttab\nline") == "ok^[]0;owned^G ^[[2J<9b>1m\ttab\nline"
    assert terminal.printable("plain text, ünïcode, emoji 🙂") == "plain text, ünïcode, emoji 🙂"


def test_a_command_with_an_unclosed_quote_is_an_error_not_the_end(model: Path, tmp_path: Path) -> None:
    from bmoe_edge.serve import terminal

    said: list[str] = []
    with Engine(model, StreamConfig(ctx=256, threads=1)) as e:
        session = chat.Session(e)
        assert terminal._command(session, "/save 'x", said.append) is True
        assert said and "error" in said[0]


def test_model_text_reaches_the_terminal_without_its_escapes(tmp_path: Path) -> None:
    import io

    from bmoe_edge.serve import terminal

    class Fake:
        def send(self, text: str):
            yield chat.Delta("\x1b]52;c;cGF5bG9hZA==\x07hi", "", None)

    out = io.StringIO()
    terminal._answer(Fake(), "x", out=out)  # type: ignore[arg-type]
    assert "\x1b" not in out.getvalue() and "hi" in out.getvalue()


def test_the_history_file_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("readline")
    from bmoe_edge.serve import terminal

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    save = terminal._readline()
    save()
    path = terminal.history_file()
    assert path.is_file() and path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o077 == 0
