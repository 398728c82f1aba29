"""Loads prefixdesk_cascade_probe in every Python process of a replica started with ``--cascade-probe``
(this folder comes first on its PYTHONPATH), then the sitecustomize this one shadows, if any."""

import importlib.util
import os
import sys

try:
    from prefixdesk_cascade_probe import install

    install()
except Exception as exc:  # a probe must never stop a replica
    print(f"cascade probe: not loaded ({type(exc).__name__}: {exc})", file=sys.stderr)

_here = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    if _entry and os.path.abspath(_entry) != _here and os.path.isfile(os.path.join(_entry, "sitecustomize.py")):
        _spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", os.path.join(_entry, "sitecustomize.py"))
        try:
            _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
        except Exception:
            pass
        break
