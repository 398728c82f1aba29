"""Benchmarks of prefix reuse through this app's serving paths (``python -m bench``).

A tool beside the product, not part of it: it imports anything of the app, and nothing in ``app/``
imports it. It is not installed with the package; run it from the repository root.
"""
