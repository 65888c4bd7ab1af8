"""`python -m stepscope …` is the `stepscope` command (and `torchrun … -m stepscope capture …` works)."""

from stepscope.cli import main

if __name__ == "__main__":
    main()
