"""Exceptions shared across rlvr_core."""


class ConfigError(ValueError):
    """An impossible or unknown setting; the message names the field and the fix."""


def require(cond: bool, field: str, message: str) -> None:
    """Raise ConfigError(f"{field}: {message}") unless cond holds."""
    if not cond:
        raise ConfigError(f"{field}: {message}")
