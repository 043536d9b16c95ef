"""The run's console: plain lines when piped, one live bar (rich) on a terminal, nothing with --quiet."""

from __future__ import annotations

import io
import re

from nodus.trainer.progress import Console

LINE = "step {done}/10  reward 0.{done}00  zero-variance groups 0.25  1.5 s/step  ETA {eta}s"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def plain_text(ansi: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", ansi)


def test_piped_output_is_one_plain_line_per_step_and_message() -> None:
    stream = io.StringIO()  # not a terminal
    console = Console(stream=stream)
    assert not console.live
    console.say("baseline evaluation on 8 held-out tasks (greedy)")
    for done in (1, 2):
        console.step(done, 10, LINE.format(done=done, eta=15 - done))
    console.close()
    assert stream.getvalue().splitlines() == [
        "baseline evaluation on 8 held-out tasks (greedy)",
        LINE.format(done=1, eta=14),
        LINE.format(done=2, eta=13),
    ]


def test_terminal_gets_a_live_bar_with_messages_above_it() -> None:
    stream = Terminal()
    console = Console(stream=stream)
    assert console.live, "a terminal is detected without being told"
    console.say("starting run")
    for done in (1, 2, 3):
        console.step(done, 10, LINE.format(done=done, eta=15 - done))
        if done == 2:
            console.say("saved checkpoint-2")
    console.close()
    console.say("final evaluation on 8 held-out tasks")  # plain again after the bar
    raw = stream.getvalue()
    assert "\x1b[" in raw, "the bar is drawn with terminal control codes"
    text = plain_text(raw)
    assert "3/10" in text and "reward 0.300" in text and "ETA 12s" in text
    assert "step 3/10" not in text, "the bar shows the step count itself, not the plain line's copy"
    assert "━" in text  # rich's bar
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    assert lines[0] == "starting run"
    assert "saved checkpoint-2" in lines and lines[-1] == "final evaluation on 8 held-out tasks"
    last_frame = text.split("\r")[-1]  # each redraw starts with a carriage return
    assert "3/10" in last_frame and "ETA 12s" in last_frame, "the bar's last state stays on screen"
    assert last_frame.index("ETA 12s") < last_frame.index("final evaluation"), "later messages come below it"


def test_the_sft_warm_up_gets_its_own_bar_before_grpo() -> None:
    stream = Terminal()
    console = Console(stream=stream)
    console.step(2, 4, "SFT step 2/4  loss 1.234  3.0 s/step  ETA 6s")
    console.close()
    console.step(1, 10, LINE.format(done=1, eta=14))
    console.close()
    frames = [frame for frame in plain_text(stream.getvalue()).split("\r") if frame.strip()]
    warmup = [frame for frame in frames if "2/4" in frame]
    assert warmup and "SFT warm-up" in warmup[-1] and "loss 1.234" in warmup[-1]
    assert "SFT step" not in stream.getvalue()
    assert frames[-1].lstrip().startswith("training") and "1/10" in frames[-1]


def test_quiet_prints_nothing_even_on_a_terminal() -> None:
    stream = Terminal()
    console = Console(quiet=True, stream=stream)
    console.say("hello")
    console.step(1, 10, LINE.format(done=1, eta=14))
    console.close()
    assert stream.getvalue() == ""
