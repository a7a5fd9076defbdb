"""Long work shows progress: a batch that restores or rescales state says so before and after (issue 25)."""

from __future__ import annotations

import logging

from spate import LocalRunner, Processor, ValueStateDescriptor


class Count(Processor):
    def open(self, ctx):
        self.count = ctx.state(ValueStateDescriptor("count", default=0))

    def process(self, key, rows, ctx):
        self.count.update(self.count.value() + len(rows))
        yield {"key": key, "count": self.count.value()}


ROWS = [{"k": k} for k in "abcdefgh"]


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("spate: ")]


def test_restart_and_rescale_say_what_they_recover(tmp_path, capsys):
    root = str(tmp_path / "c")
    with LocalRunner(Count, key="k", checkpoint_root=root, progress=True) as runner:
        runner.run([ROWS, ROWS])
    assert lines(capsys.readouterr().err) == []  # a new query recovers nothing
    with LocalRunner(Count, key="k", checkpoint_root=root, progress=True) as runner:
        runner.run_batch(2, ROWS)
        first = lines(capsys.readouterr().err)
        runner.run_batch(3, ROWS)
        assert lines(capsys.readouterr().err) == []  # live state: nothing to say
        runner.rescale(4)
        runner.run_batch(4, ROWS)
        rescaled = lines(capsys.readouterr().err)
    assert first[0] == ("spate: batch 2: recovering the state of checkpoint 1 on 1 subtasks, from local copies "
                        "where they are intact, else checkpoint storage ...")
    assert first[1].startswith("spate: batch 2: state recovered (1 restored): ") and " B read " in first[1]
    assert len(first) == 2
    assert rescaled[0].startswith("spate: batch 4: rescaling 1 → 4 subtasks from checkpoint 3")
    assert rescaled[1].startswith("spate: batch 4: state recovered (4 restored): ")
    assert len(rescaled) == 2


def test_quiet_when_piped_unless_asked_and_always_logged(tmp_path, capsys, caplog):
    root = str(tmp_path / "c")
    with LocalRunner(Count, key="k", checkpoint_root=root) as runner:
        runner.run([ROWS])
    with caplog.at_level(logging.INFO, logger="spate.runtime.recovery_progress"), \
         LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2) as runner:
        runner.run_batch(1, ROWS)
    assert capsys.readouterr().err == ""  # standard error is not a terminal here
    logged = [r.getMessage() for r in caplog.records if r.name == "spate.runtime.recovery_progress"]
    assert logged[0].startswith("batch 1: rescaling 1 → 2 subtasks from checkpoint 0")
    assert logged[1].startswith("batch 1: state recovered (2 restored)")
