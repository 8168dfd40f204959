"""The pure core: readings, the decision table, history, confirmation and restart policy.

No I/O and no clock here: every function takes `now` or readings that carry it. The core imports
only `stallwatch.common` and the standard library.
"""
