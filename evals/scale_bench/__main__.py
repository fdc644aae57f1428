"""`python -m evals.scale_bench PART ...`: the benchmark's command line (`evals.scale_bench.cli`)."""

from evals.scale_bench.cli import main

main()
