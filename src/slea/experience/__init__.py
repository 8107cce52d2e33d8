"""SLEA-RL's experience subsystem: observation clusters, the library, extraction, per-step retrieval.

``ExperienceManager`` (manager.py) is the entry point for the collector and trainer; ``inspect`` serves the CLI.
"""

from slea.experience.clustering import ObservationIndex
from slea.experience.library import ExperienceLibrary
from slea.experience.manager import ExperienceManager, RetrievalResult

__all__ = ["ExperienceLibrary", "ExperienceManager", "ObservationIndex", "RetrievalResult"]
