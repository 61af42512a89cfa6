"""One module per verb: each takes explicit arguments and returns data for the CLI to render."""
