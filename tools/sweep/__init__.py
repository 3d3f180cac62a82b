"""Architecture exploration for npusim: sweep chip config keys over workloads (docs/sweep.md).

Modules: grid (the grid file and its points), area (the area proxy and its coefficients),
runner (one point as one npusim / models.run process, stored per point), report (sweep.csv,
plots, Pareto front), cli (the command line of tools/npusim_sweep.py and `npusim sweep`).
"""
