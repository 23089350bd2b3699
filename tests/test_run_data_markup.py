"""Run data (a target's name, a verify problem, a warning) is printed as written: rich never reads it as markup,
so a name like 'ckpt[/oops]' neither crashes a command (MarkupError, exit 3) nor hides or links text."""

from __future__ import annotations

import io

from test_adversarial import cli, config_file, scripted, write_items

from diagsafe_local.commands.common import warn
from diagsafe_local.core.console import Console

NAME = "ckpt[/oops][black on black]hidden[/]"


def test_a_target_name_with_rich_markup_does_not_crash_run_report_or_merge(tmp_path, monkeypatch):
    scripted(monkeypatch)
    items = write_items(tmp_path / "items.jsonl", 4)
    config = config_file(tmp_path, items, target={"model": "t", "name": NAME})
    ran = cli("run", config)
    assert ran.exit_code == 0 and NAME in ran.output, ran.output
    reported = cli("report", tmp_path / "run")
    assert reported.exit_code == 0 and NAME in reported.output, reported.output
    assert cli("run", config, "--shard", "0/2").exit_code == 0
    shard = tmp_path / "run" / "shards" / "shard-0000-of-0002"
    merged = cli("merge", shard, "--out", tmp_path / "merged")  # half the items: the summary warns why
    assert merged.exit_code == 0 and NAME in merged.output and "does not verify" in merged.output, merged.output


def test_a_warning_quoting_markup_is_printed_as_written(capsys):
    line = "answer [link=file:///etc/passwd]click[/link] and [black on black]secret[/] [/oops]"
    warn([line])
    assert line in capsys.readouterr().err


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_show_a_stage_and_note_with_markup_as_written():
    stream = Terminal()
    console = Console(stream)
    console.progress(f"{NAME}: answering", 1, 2, note="[/x] note")
    console.close()
    assert f"{NAME}: answering" in stream.getvalue() and "[/x] note" in stream.getvalue()
