"""The version of tandem that runs, as benchmark results and support bundles record it.

Read from the installed distribution's metadata, so the one version number lives in
``pyproject.toml``. The distribution is ``tandem-vllm`` (PyPI's ``tandem`` is another,
unrelated project); the import name and the command stay ``tandem``.
"""

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "tandem-vllm"
"""The name ``pip install`` takes."""

try:
    TANDEM_VERSION = version(DISTRIBUTION)
except PackageNotFoundError:  # a source tree on sys.path, not installed
    TANDEM_VERSION = "unknown"
