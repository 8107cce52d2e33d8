"""Offline alignment (tlm-DRE's pipeline): expert data (``data``), preference pairs
against the policy's own failures (``pairs``), the torch objectives and their registry (``objectives``), the
adequacy histogram and pivot (``pivot``) and the resumable stages of ``slea align`` (``pipeline``). The equations
themselves are pure functions in :mod:`slea.algorithms.alignment`.

Submodules are imported explicitly (``from slea.alignment.objectives import alignment_step``), so importing
this package costs nothing.
"""
