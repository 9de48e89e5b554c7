"""The `laneway` command: `main.py` builds the parser from one module per
subcommand, each with `subparser_init(subparsers)` and `cmd(args)`."""
