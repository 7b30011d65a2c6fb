"""The figures and tables of scripts/make_figures.py, one module per family:

  configs   runs grouped into configurations, the reference configuration, per-configuration and
            paired-by-seed statistics (no plotting; scripts/lep_study.py uses it too)
  output    files written only when their bytes change, tables as Markdown and LaTeX, the style
  quality   Table 2's table, Fig. 9's curves, the compressors' Pareto plot
  memory    Fig. 12: tensor memory by component
  timing    Fig. 10: the time breakdown of the timeline steps
  lep       Fig. 11: the LEP error against the activation change
  bench     Fig. 14: compressor throughput against rank, from Google Benchmark JSON

The modules import scripts/optcc_results.py, so scripts/ must be on sys.path (this package puts it there).
"""
import os
import sys

_SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _SCRIPTS not in sys.path:
    sys.path.insert(0, _SCRIPTS)
