"""CLI subcommands, one module each (see procap.cli)."""
