"""``python -m app.engine.models.plugin_dist DIR``: make vLLM find our model plugins without an install.

vLLM finds plugins through entry points, which Python reads from the metadata of installed
distributions: a ``NAME.dist-info`` folder with an ``entry_points.txt``, on ``sys.path``. An install
(``make install``) writes one from pyproject.toml. A machine that runs the code from PYTHONPATH
instead (the GPU device: ``PYTHONPATH=/tmp/stage/site:$PWD``) gets the same entry points from a
folder this writes, put on that PYTHONPATH too:

    python -m app.engine.models.plugin_dist /tmp/pd-plugins
    export PYTHONPATH=/tmp/pd-plugins:$PYTHONPATH   # every vLLM process started from here sees the plugin

The distribution has its own name (``DIST_NAME``), so it never shadows an installed prefixdesk.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from app.engine.models import ENTRY_POINT_GROUP, ENTRY_POINTS

DIST_NAME = "prefixdesk_model_plugins"
DIST_VERSION = "1.0"


def write_plugin_dist(folder: Path) -> Path:
    """Write ``folder/<DIST_NAME>-<DIST_VERSION>.dist-info`` (METADATA + entry_points.txt); returns it."""
    dist = Path(folder) / f"{DIST_NAME}-{DIST_VERSION}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: {DIST_VERSION}\n",
                                   encoding="utf-8")
    lines = [f"[{ENTRY_POINT_GROUP}]"] + [f"{name} = {target}" for name, target in ENTRY_POINTS.items()]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dist


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.engine.models.plugin_dist",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a folder to put on PYTHONPATH")
    dist = write_plugin_dist(parser.parse_args(argv).folder)
    print(f"wrote {dist}; put {dist.parent} on PYTHONPATH")
    return 0


if __name__ == "__main__":
    sys.exit(main())
