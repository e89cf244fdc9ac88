"""The subcommands of the `vase-triton` command, one module each, and what they share."""
