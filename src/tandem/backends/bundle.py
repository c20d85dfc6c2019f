"""``tandem logs --bundle``: one archive with everything a bug report about a deployment needs.

Contents of ``NAME-bundle-TIMESTAMP.tar.gz``::

    README.txt          what is inside, and when and where it was made
    recipe.yaml         the resolved recipe, as launched (image pinned)
    cluster.yaml        the resolved cluster inventory
    state.json          tandem's state: ranks, phases, boot figures
    versions.txt        tandem, Python and this machine; kernel, Python, vLLM or docker per node
    events.log          the supervisor's events, if one ran
    ranks/rankN.log     the last lines of every rank's log
    ranks/rankN.env     every rank's environment and command

Secret values (``HF_TOKEN``, API keys...) are replaced by ``REDACTED`` everywhere
(``tandem.redact``), also inside the copied logs.
"""

from __future__ import annotations

import io
import json
import platform
import re
import shlex
import sys
import tarfile
import time
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from tandem.backends.base import backend_for
from tandem.backends.state import EVENTS_FILE, load_state
from tandem.errors import TandemError
from tandem.rankplan import plan_ranks
from tandem.redact import REDACTED, is_secret, redact_argv, redact_env

LOG_LINES = 2000


def _redact_mapping(data: object) -> object:
    """Redact secret keys at any depth of a JSON-like structure."""
    if isinstance(data, dict):
        return {k: (REDACTED if isinstance(k, str) and is_secret(k) and isinstance(v, str)
                    else _redact_mapping(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [_redact_mapping(v) for v in data]
    return data


def _redact_text(text: str, secrets: list[str]) -> str:
    for secret in sorted({s for s in secrets if len(s) >= 6}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return re.sub(r"(--api-key[= ])\S+", rf"\1{REDACTED}", text)


def _tandem_version() -> str:
    try:
        return version("tandem")
    except PackageNotFoundError:
        return "unknown"


def write_bundle(name: str | None = None, out: Path | None = None) -> Path:
    """Write the support archive of a deployment; returns its path.

    Args:
        out: a file path, or a folder to put ``NAME-bundle-TIMESTAMP.tar.gz`` in. Default: the
            current folder.
    """
    state = load_state(name)
    backend = backend_for(state.backend)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = out or Path.cwd()
    path = out / f"{state.name}-bundle-{stamp}.tar.gz" if out.is_dir() else out
    deployment = state.deployment()
    plan = plan_ranks(deployment)
    secrets = [v for r in plan.ranks for k, v in r.env.items() if is_secret(k)]

    files: dict[str, str] = {}
    files["recipe.yaml"] = yaml.safe_dump(_redact_mapping(state.recipe), sort_keys=False)
    files["cluster.yaml"] = yaml.safe_dump(_redact_mapping(state.cluster), sort_keys=False)
    files["state.json"] = json.dumps(_redact_mapping(state.model_dump(mode="json")), indent=2)
    versions = [f"tandem {_tandem_version()}", f"python {sys.version.split()[0]}",
                f"control machine {platform.platform()}"]
    node_versions = getattr(backend, "node_versions", None)
    if node_versions is not None:
        try:
            for node, text in node_versions(state).items():
                versions.append(f"\n[node {node}]\n{text}")
        except TandemError as exc:
            versions.append(f"\nnode versions unavailable: {exc.message}")
    files["versions.txt"] = "\n".join(versions) + "\n"
    events = state.directory / EVENTS_FILE
    if events.is_file():
        files["events.log"] = events.read_text()
    for rank in plan.ranks:
        env = redact_env(rank.env)
        files[f"ranks/rank{rank.rank}.env"] = (
            "\n".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            + f"\n\n# command\n{shlex.join(redact_argv(rank.argv))}\n")
    for record in state.ranks:
        try:
            lines = backend.log_reader(state, record).new_lines()
            text = "\n".join(lines[-LOG_LINES:]) + "\n"
        except TandemError as exc:
            text = f"(log unavailable: {exc.message})\n"
        files[f"ranks/rank{record.rank}.log"] = _redact_text(text, secrets)
    files["README.txt"] = (f"tandem support bundle of deployment '{state.name}' "
                           f"({state.backend}), made {stamp}\n\n" + __doc__.split("::", 1)[1])
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        for member, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{state.name}-bundle/{member}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
            archive.addfile(info, io.BytesIO(data))
    return path
