"""Benchmark suite of `handles` (issue 7). Run `python bench/run.py --help`."""
