"""The command line's contract, in process: help everywhere, and the error boundary
(expected errors are one line; a bug says so and shows its traceback with --verbose)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from memtree.cli import app
from memtree.commands.common import CliError, cli_errors, parse_embedder, parse_namespace, parse_pairs, set_verbose
from memtree.embed import HashingEmbedder, LocalEmbedder

COMMANDS = ["add", "query", "show", "stats", "export", "import", "repair", "demo", "bench"]
WITHOUT_DB = ("demo", "bench")  # a sample memory of its own; benchmarks build theirs


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str) -> None:
    done = CliRunner().invoke(app, [command, "--help"])
    assert done.exit_code == 0, done.output
    assert "Usage:" in done.output and command in done.output
    if command not in WITHOUT_DB:
        assert "--db" in done.output and "--namespace" in done.output


def test_top_level_help_lists_every_command() -> None:
    done = CliRunner().invoke(app, ["--help"])
    assert done.exit_code == 0
    assert all(command in done.output for command in COMMANDS)


def boundary_app(error: Exception) -> typer.Typer:
    small = typer.Typer()

    @small.command()
    @cli_errors
    def boom() -> None:
        raise error

    @small.command()
    def other() -> None:  # a second command keeps typer from flattening the app
        pass

    return small


def test_expected_errors_are_one_line_without_traceback() -> None:
    done = CliRunner().invoke(boundary_app(ValueError("line 3: not valid JSON")), ["boom"])
    assert done.exit_code == 1
    assert "memtree: error: line 3: not valid JSON" in done.output and "Traceback" not in done.output


def test_a_closed_standard_output_ends_the_command_quietly_like_a_unix_tool() -> None:
    done = CliRunner().invoke(boundary_app(BrokenPipeError(32, "Broken pipe")), ["boom"])
    assert done.exit_code == 141 and done.output == ""


def test_a_bug_is_reported_as_a_bug_and_verbose_shows_the_traceback() -> None:
    app_with_bug = boundary_app(RuntimeError("invariant broken"))
    done = CliRunner().invoke(app_with_bug, ["boom"])
    assert done.exit_code == 1
    assert "unexpected RuntimeError: invariant broken" in done.output and "--verbose" in done.output
    set_verbose(True)
    try:
        done = CliRunner().invoke(app_with_bug, ["boom"])
    finally:
        set_verbose(False)
    assert done.exit_code == 1 and "Traceback" in done.output and "invariant broken" in done.output


def test_option_parsers() -> None:
    assert parse_namespace("users/alice") == ("users", "alice")
    assert parse_pairs(["speaker=Maya", "session=3", "tags=[1, 2]", "note=a=b"], "--meta") == {
        "speaker": "Maya",
        "session": 3,
        "tags": [1, 2],
        "note": "a=b",
    }
    assert parse_embedder(None) is None
    hashing = parse_embedder("hashing:32")
    assert isinstance(hashing, HashingEmbedder) and hashing.dimension == 32
    local = parse_embedder("local:/models/minilm")
    assert isinstance(local, LocalEmbedder) and local.model_name == "/models/minilm"
    with pytest.raises(CliError, match="unknown --embedder 'word2vec'"):
        parse_embedder("word2vec")
