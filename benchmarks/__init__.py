"""stallwatch's benchmarks: `python -m benchmarks` (full) or `python -m benchmarks --quick`.

Each benchmark measures stallwatch next to its peer in the same run and returns a `Section`
(a markdown table with the method); `__main__` prints them all, as they appear in BENCHMARKS.md.
"""
