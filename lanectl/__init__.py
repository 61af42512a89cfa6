"""lanectl: run GPU LLM serving lanes safely.

The package is the API; the CLI (`lanectl.cli.app`) only parses arguments, calls one domain
function and renders its result.
"""

__version__ = "0.1.0"
