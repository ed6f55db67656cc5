"""The daemon's one config file: schema (pydantic, the boundary), model (frozen
dataclasses the runtime gets), loader (marked YAML, environment, errors at file:line:col)."""

from trainsentry.config.loader import ENV_OVERRIDES, ConfigError, load_config
from trainsentry.config.model import Config, HttpSettings

__all__ = ["ENV_OVERRIDES", "Config", "ConfigError", "HttpSettings", "load_config"]
