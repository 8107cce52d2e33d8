"""Offline alignment (tlm-DRE pipeline, reference/papers.md §3): preference pairs (``pairs``), the torch
objectives and their registry (``objectives``), the adequacy histogram and pivot (``pivot``). The equations
themselves are pure functions in :mod:`slea.algorithms.alignment`.

Submodules are imported explicitly (``from slea.alignment.objectives import alignment_step``), so importing
this package costs nothing.
"""
