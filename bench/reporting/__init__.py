"""The sections of BENCHMARKS.md, a module each (or each family of benchmarks): a section
is a function of its results file (bench/results/<name>.json) returning the section's
lines; :mod:`bench.report` puts them together into the page. Shared: :mod:`.common` (the
results files, how a figure is written).
"""
