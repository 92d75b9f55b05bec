"""Generate docs/cli.md, the CLI reference, from the click commands themselves (never hand-kept).

    python -m optcli.docgen > docs/cli.md

A test compares docs/cli.md with this output, so a changed flag or help text shows up as a stale
document until it is regenerated.
"""

from __future__ import annotations

import click

WIDTH = 100


def _help(command: click.Command, name: str, parent: click.Context | None = None) -> str:
    settings = {**command.context_settings, "terminal_width": WIDTH, "max_content_width": WIDTH}
    return command.get_help(click.Context(command, info_name=name, parent=parent, **settings))


def cli_markdown() -> str:
    from optcli.cli import opt_command, optcli_group

    parts = ["# CLI reference", "",
             "Generated from the click commands by `python -m optcli.docgen > docs/cli.md`; a test keeps it",
             "current. Every command prints the same text with `--help`.", "",
             "Exit codes of every command: 0 success, 2 a user error (one line: what, where, what to do), 3 a",
             "check failed (`opt --verify`, `optcli bench --max_diff`), 130 interrupted (Ctrl-C: within a second,",
             "on the host or while waiting for an OpenCL device; nothing half-written), 1 an internal error.", ""]
    parts += ["## `opt`", "", "The optimizer, with Paddle Lite's flags (also `optcli opt`).", "", "```text",
              _help(opt_command, "opt"), "```", ""]
    settings = {**optcli_group.context_settings, "terminal_width": WIDTH, "max_content_width": WIDTH}
    group_ctx = click.Context(optcli_group, info_name="optcli", **settings)
    parts += ["## `optcli`", "", "```text", _help(optcli_group, "optcli"), "```", ""]
    for name in optcli_group.list_commands(group_ctx):
        if name == "opt":
            continue
        command = optcli_group.get_command(group_ctx, name)
        parts += [f"### `optcli {name}`", "", "```text", _help(command, name, group_ctx), "```", ""]
    return "\n".join(parts)


if __name__ == "__main__":
    print(cli_markdown(), end="")
