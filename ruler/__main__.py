"""`python -m ruler_rl`: the `ruler` command line, the same commands and help as the console script."""

from ruler_rl.cli import main

main()
