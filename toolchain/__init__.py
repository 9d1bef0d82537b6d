"""coli-build: the build-orchestration task graph for the coli engine and its GPU backends.

The public surface; everything else is private to its module.
"""

from .abi import Abi, load_abi, render_abi
from .config import Config, ResolvedConfig, load_config
from .errors import BuildError, ColiError, ConfigError, ToolchainError, ValidateError, VerifyError
from .plan import BackendSpec, Plan, make_plan

__version__ = "0.1.0"

__all__ = [
    "Abi",
    "BackendSpec",
    "BuildError",
    "ColiError",
    "Config",
    "ConfigError",
    "Plan",
    "ResolvedConfig",
    "ToolchainError",
    "ValidateError",
    "VerifyError",
    "load_abi",
    "load_config",
    "make_plan",
    "render_abi",
]
