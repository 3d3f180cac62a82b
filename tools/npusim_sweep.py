"""Architecture exploration: `npusim sweep GRID.yaml [--out DIR] [--jobs N] [--resume/--no-resume]
[--dry-run]` hands over to this script (with the Python it runs the report plots with); it can
also be run directly: `.venv/bin/python tools/npusim_sweep.py GRID.yaml --npusim build/npusim`.
Grid file schema, outputs and the area proxy: docs/sweep.md. The code is in tools/sweep/.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sweep.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
