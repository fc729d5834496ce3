"""Trace replay: the real placement and burst planners in virtual time on simulated spokes.

`gpufed replay` (cli.py) loads a job trace (traces.py) and a fleet (fleet.py), runs it through
the simulator (simulator.py) with gpufed's `plan()` or a baseline (baselines.py), optionally
bursting to simulated cloud instances (cloud.py), and writes metrics (metrics.py, report.py)
and plots (plots.py). docs/replay.md describes the command and the definitions.
"""
