"""`python -m ruler`: the `ruler` command line, the same commands and help as the console script."""

from ruler.cli import main

main()
