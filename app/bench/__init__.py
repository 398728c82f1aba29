"""Benchmarks of prefix reuse through this app's serving paths (``python -m app.bench``).

``run_ab`` is the one piece meant for use inside the app: a short live A/B on a running engine.
"""

from app.bench.ab import ABResult, ArmResult, run_ab

__all__ = ["ABResult", "ArmResult", "run_ab"]
