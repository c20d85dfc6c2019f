"""The version of tandem that runs, as benchmark results and support bundles record it.

Read from the installed distribution's metadata, so the one version number lives in
``pyproject.toml``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    TANDEM_VERSION = version("tandem")
except PackageNotFoundError:  # a source tree on sys.path, not installed
    TANDEM_VERSION = "unknown"
