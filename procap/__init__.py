"""ProCap: change captioning by imagining the change procedure (ICLR 2026), fast."""

from procap.config import PRESETS, ProCapConfig, get_preset

__version__ = "0.1.0"
__all__ = ["PRESETS", "ProCapConfig", "__version__", "get_preset"]
