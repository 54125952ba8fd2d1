"""Inference engines behind one interface (see ``base.py``), listed in ``registry.py``."""

from autodeploy.adapters.base import Artifact, Availability, Engine, EngineSpace, Runner, TrialConfig

__all__ = ["Artifact", "Availability", "Engine", "EngineSpace", "Runner", "TrialConfig"]
