"""Other libraries' private APIs that the step path's speed relies on, one module per library.

Each module names the version it was checked against and says what no longer matches (`shape_changes`), and
tests/test_internals.py fails on it; each keeps a fallback through the library's public API, so a change costs
speed, never a result.
"""
