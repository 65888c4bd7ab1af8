"""One module per `stepscope` subcommand; each defines `command: click.Command` (~30 lines: options ->
one library call -> one renderer). `stepscope.cli.COMMANDS` lists them."""
