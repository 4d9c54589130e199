"""The CLI's subcommands, one module each."""
