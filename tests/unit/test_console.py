"""The console a user watches: a log line written while the progress bar is drawn starts on a line of its own
(issue 66: `loss=0.9769]21:41:17 [rank0] INFO ...` was one line of the demo's log), on a terminal and on the pipe
the deploy tees into its log file."""

from __future__ import annotations

import io
import re

import pytest

from trainers.runtime import logs


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream_type", [io.StringIO, Terminal], ids=["pipe", "terminal"])
def test_a_line_logged_under_the_bar_is_not_glued_onto_it(tmp_path, monkeypatch, stream_type):
    stream = stream_type()
    monkeypatch.setattr(logs.sys, "stderr", stream)
    logger = logs.get_logger(0, tmp_path / "run", name=f"console-test-{stream_type.__name__}")
    bar = logs.tqdm(total=10, file=stream, delay=0, mininterval=0, desc="train")
    try:
        bar.update(3)
        bar.set_postfix(loss=0.9769)
        logger.info("evaluated at step 3")
        logger.info("and a second line")
        bar.update(1)
    finally:
        bar.close()
        logs.close_handlers(logger)
    text = stream.getvalue()
    # a pipe shows what a log file shows: lines split at newlines only (a carriage return starts none there)
    lines = text.split("\n") if stream_type is io.StringIO else re.split(r"[\r\n]", text)
    for message in ("evaluated at step 3", "and a second line"):
        logged = [line for line in lines if message in line]
        assert logged and all(re.fullmatch(rf"\d\d:\d\d:\d\d \[rank0\] INFO {message}", line) for line in logged), (
            text)
    if stream_type is io.StringIO:  # one newline to leave the bar, none between two lines logged in a row
        assert "INFO evaluated at step 3\n" in text and "evaluated at step 3\n\n" not in text
    assert "evaluated at step 3" in (tmp_path / "run" / "training.log").read_text()
