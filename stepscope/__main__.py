"""`python -m stepscope …` is the `stepscope` command."""

from stepscope.cli import main

main()
