"""CLI subcommands, one module each (see procap.commands.cli)."""
