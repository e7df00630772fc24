"""Help that lists commands whole: grouped in titled sections, each with its whole first paragraph.

Click lists a group's commands in one section and cuts each description to what fits on the line; ``fleet`` has
too many commands for that to be read. Click has no sections of its own, so :class:`SectionedGroup` keeps them.
"""

from __future__ import annotations

import inspect

import click


def summary(command: click.Command) -> str:
    """The command's short help, else the whole first paragraph of its help, on one line."""
    if command.short_help:
        return command.short_help
    text = inspect.cleandoc(command.help or "").split("\f", 1)[0]
    paragraph = text.strip().split("\n\n", 1)[0]
    return " ".join(line.strip() for line in paragraph.splitlines() if line.strip() != "\b")


class WholeHelpGroup(click.Group):
    """A group whose ``--help`` gives each command's whole description, wrapped rather than cut."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = self._rows(ctx, self.list_commands(ctx))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def _rows(self, ctx: click.Context, names: list[str]) -> list[tuple[str, str]]:
        rows = []
        for name in names:
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, summary(command)))
        return rows


class SectionedGroup(WholeHelpGroup):
    """A :class:`WholeHelpGroup` whose commands are listed in titled sections, in the order they were declared."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]  # click.Group's own arguments, passed through
        self.sections: dict[str, list[str]] = {}

    def add_to_section(self, section: str, command: click.Command, name: str | None = None) -> None:
        """Add ``command`` (as ``name``) and list it under ``section``."""
        name = name or command.name
        assert name is not None
        self.add_command(command, name)
        self.sections.setdefault(section, []).append(name)

    def file_new_commands(self, section: str, before: set[str]) -> None:
        """List under ``section`` the commands added since the group had only ``before``, in name order."""
        self.sections.setdefault(section, []).extend(sorted(set(self.commands) - before))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        filed = {name for names in self.sections.values() for name in names}
        sections = [*self.sections.items(), ("Other", [n for n in self.list_commands(ctx) if n not in filed])]
        listed = [(title, rows) for title, names in sections if (rows := self._rows(ctx, names))]
        width = max((len(name) for _, rows in listed for name, _ in rows), default=0)
        for title, rows in listed:
            # One column for every section's descriptions: the spacing makes up for a section's shorter names.
            spacing = 2 + width - max(len(name) for name, _ in rows)
            with formatter.section(title):
                formatter.write_dl(rows, col_spacing=spacing)


def old_name(command: click.Command, old: str, new: str) -> click.Command:
    """A hidden copy of ``command`` under its old top-level name, kept for one release: using it says the new one.

    Parameters
    ----------
    command:
        The command as it now is, in its group.
    old, new:
        Its old and new spellings, e.g. ``fleet query`` and ``fleet miopen query``: named in the copy's help and
        on stderr when it runs.
    """
    import copy
    import functools

    alias = copy.copy(command)
    alias.hidden = True
    alias.help = f"Old name of `{new}`, kept for one release.\n\n{command.help or ''}"
    alias.short_help = None
    callback = command.callback

    @functools.wraps(callback)  # type: ignore[arg-type]  # a command's callback is set
    def noted(*args: object, **kwargs: object) -> object:
        click.echo(f"fleet: note: `{old}` is now `{new}`; the old name goes in the next release", err=True)
        return callback(*args, **kwargs)  # type: ignore[misc]  # as above

    alias.callback = noted
    return alias
