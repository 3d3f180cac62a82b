"""`npusim validate`: published measurements of Ascend silicon reproduced on the chip presets.

cases.py reads and checks the case file (validation/cases.yaml), runner.py runs one case through
the CLI (`npusim op`) or the model runner (`python -m models.run`), table.py turns simulated and
published figures into errors, the table and the mean absolute errors (docs/validation.md).
"""
