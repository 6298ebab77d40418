"""ProCap: change captioning by imagining the change procedure (ICLR 2026), fast."""

from procap._version import __version__
from procap.core.config import PRESETS, ProCapConfig, get_preset

__all__ = ["PRESETS", "ProCapConfig", "__version__", "get_preset"]
