"""Design-space search: `npusim explore SPACE.yaml [--out DIR] [--ray [ADDRESS]]` hands over to
this script; it can also be run directly: `.venv/bin/python tools/npusim_explore.py SPACE.yaml
--npusim build/npusim`. Space file schema and outputs: docs/sweep.md, "Design-space search".
The code is in tools/sweep/ (explore.py, space.py).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sweep.explore import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
