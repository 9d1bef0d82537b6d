"""Configuration: the schema and the layered loader."""

from .load import ENV_KEYS, VAR_KEYS, ResolvedConfig, load_config
from .schema import Config

__all__ = ["ENV_KEYS", "VAR_KEYS", "Config", "ResolvedConfig", "load_config"]
