"""What a run directory, a command line or a log holds reaches the terminal with its control
characters made visible, never acting on it (issue 21, item 4): the function itself, and the CLI
commands that show runs and processes, on real files and processes."""

from __future__ import annotations

from pathlib import Path

from engine.core.common.run_files import PRIVATE_FILE_MODE
from engine.core.common.statuses import RunStatus
from engine.core.common.visible_text import visible
from engine.core.runs.rundir import RunDir
from engine.core.runs.settle import bare_summary
from tests.fixtures.live_runs import ddptui
from tests.fixtures.made_runs import ProcessPen, make_run, marker_env, rank_events, ref_of

# Sets the terminal's title, clears the screen, turns the text red; then a bell, a carriage
# return that would overwrite the line, a C1 CSI and a right-to-left override.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\rback\x9b1m\u202etxt"
ESCAPED = "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mred\\x0dback\\x9b1m\\u202etxt"


def test_visible_writes_out_every_control_character_and_keeps_layout() -> None:
    assert visible(HOSTILE) == ESCAPED
    assert visible("line one\n\tline two") == "line one\n\tline two"
    assert visible("a\nb\tc", one_line=True) == "a\\x0ab\\x09c"
    assert visible(visible(HOSTILE)) == visible(HOSTILE)
    plain = "rank 0 ✓ 数据 café"
    assert visible(plain) is plain


def hostile_run(runs_dir: Path) -> RunDir:
    """A run whose id, summary and rank log carry escape sequences, as its owner can write."""
    run_dir = make_run(runs_dir, f"20260101-000000-made-{HOSTILE}",
                       state=RunStatus.FAILED, events={"rank-0": rank_events(0, 2)})  # fmt: skip
    summary = bare_summary(run_dir, RunStatus.FAILED, f"the reason {HOSTILE}")
    run_dir.write_summary(summary)
    log = run_dir.rank_log_path(0)
    log.write_text(f"a log line {HOSTILE}\n")
    log.chmod(PRIVATE_FILE_MODE)
    return run_dir


def assert_shown_not_acted(text: str) -> None:
    for char in ("\x1b", "\x07", "\r", "\x9b", "\u202e"):
        assert char not in text, repr(char)
    assert "\\x1b[2J\\x1b[31mred" in text


def test_runs_and_show_make_a_hostile_runs_words_visible(runs_dir: Path) -> None:
    run_dir = hostile_run(runs_dir)
    listed = ddptui("runs", "--runs-dir", str(runs_dir))
    assert listed.returncode == 0, listed.stderr
    assert_shown_not_acted(listed.stdout)
    shown = ddptui("show", "20260101-000000-made-", "--runs-dir", str(runs_dir))
    assert shown.returncode == 0, shown.stderr
    assert_shown_not_acted(shown.stdout)
    assert f"the reason {ESCAPED}" in shown.stdout
    assert run_dir.run_id.endswith(HOSTILE)  # the files are the owner's, left as they are


def test_ps_makes_a_hostile_command_line_visible(runs_dir: Path, pen: ProcessPen) -> None:
    run_id = "20260101-000000-made-argv"
    # in a comment of its `python -c` code (a carriage return would end the comment)
    rank = pen.python(env=marker_env(runs_dir, run_id), argv0_note=HOSTILE.replace("\r", ""))
    make_run(runs_dir, run_id, launcher=ref_of(rank), ranks=[ref_of(rank)])
    assert pen.wait_until(lambda: "made-argv" in ddptui("ps").stdout)
    listed = ddptui("ps")
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.lstrip().startswith(str(rank.pid)))
    assert_shown_not_acted(line)


def test_what_the_ui_is_handed_is_visible_in_dict_keys_and_removal_reports_too() -> None:
    from ddptui.messages import RunsRemoved, shown

    node = "n2\x1b]0;pwned\x07"
    gpus = {node: ("gpu 0",), "n1": ("gpu 1",)}
    made = shown(gpus)
    assert list(made) == ["n2\\x1b]0;pwned\\x07", "n1"] and made["n1"] is gpus["n1"]
    plain = {"n1": ("gpu 1",)}
    assert shown(plain) is plain  # nothing to change: the very object
    removed = RunsRemoved(True, f"removed 20260101-000000-{node}")
    assert removed.report == "removed 20260101-000000-n2\\x1b]0;pwned\\x07"
