"""The console a user watches: a log line written while the progress bar is drawn starts on a line of its own
(issue 66: `loss=0.9769]21:41:17 [rank0] INFO ...` was one line of the demo's log)."""

from __future__ import annotations

import io
import re

from trainers.runtime import logs


def test_a_line_logged_under_the_bar_is_not_glued_onto_it(tmp_path, monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(logs.sys, "stderr", stream)
    logger = logs.get_logger(0, tmp_path / "run", name="console-test")
    bar = logs.tqdm(total=10, file=stream, delay=0, mininterval=0, desc="train")
    try:
        bar.update(3)
        bar.set_postfix(loss=0.9769)
        logger.info("evaluated at step 3")
        bar.update(1)
    finally:
        bar.close()
        logs.close_handlers(logger)
    lines = re.split(r"[\r\n]", stream.getvalue())
    logged = [line for line in lines if "evaluated at step 3" in line]
    assert logged and all(re.match(r"\d\d:\d\d:\d\d \[rank0\] INFO evaluated at step 3$", line) for line in logged), (
        stream.getvalue())
    assert "evaluated at step 3" in (tmp_path / "run" / "training.log").read_text()
