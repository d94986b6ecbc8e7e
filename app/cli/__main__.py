"""`python -m app.cli`: the same as the `batchplan` script."""

from app.cli import main

main()
