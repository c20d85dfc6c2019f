"""``tandem logs --bundle``: one archive with everything a bug report about a deployment needs.

Contents of ``NAME-bundle-TIMESTAMP.tar.gz``::

    README.txt          what is inside, and when and where it was made
    recipe.yaml         the resolved recipe, as launched (image pinned)
    cluster.yaml        the resolved cluster inventory
    state.json          tandem's state: ranks, phases, boot figures
    versions.txt        tandem, Python and this machine; kernel, Python, vLLM or docker per node
    events.log          the supervisor's events, if one ran
    ranks/rankN.log     the last lines of every rank's log
    ranks/rankN.env     every rank's environment and command (ranks/UNPLANNED.txt instead
                        when the saved recipe or cluster is too damaged to plan them; with
                        replicas: ranks/gG/ for group G)

Secret values (``HF_TOKEN``, API keys...) are replaced by ``REDACTED`` everywhere, through the
one redaction path (``tandem.redact``): by name, by shape (``hf_...``, ``sk-...``, ``Bearer``
headers, ``--api-key`` items), and the values the caller's own ``VLLM_API_KEY``, ``HF_TOKEN``...
hold, inside the copied logs and ``events.log`` too. The archive is written mode 0600.
"""

from __future__ import annotations

import io
import json
import platform
import shlex
import sys
import tarfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

from tandem import ownership
from tandem.backends.base import backend_for
from tandem.backends.state import GroupState, load_state
from tandem.errors import TandemError
from tandem.files import open_private
from tandem.rankplan import RankPlan, plan_ranks
from tandem.redact import Redactor, is_secret
from tandem.version import TANDEM_VERSION

LOG_LINES = 2000


def write_bundle(name: str | None = None, out: Path | None = None) -> Path:
    """Write the support archive of a deployment; returns its path.

    Args:
        out: a file path, or a folder to put ``NAME-bundle-TIMESTAMP.tar.gz`` in. Default: the
            current folder.
    """
    state = load_state(name)
    backend = backend_for(state.backend)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = out or Path.cwd()
    path = ownership.output_file(
        out / f"{state.name}-bundle-{stamp}.tar.gz" if out.is_dir() else out,
        option="--bundle",
        force_flag=None,
    )
    plans = {g.group: _plan(g) for g in state.groups}  # an old state is bundled too
    ranks = [r for plan, _ in plans.values() if plan is not None for r in plan.ranks]
    redactor = Redactor.for_caller([v for r in ranks for k, v in r.env.items() if is_secret(k)])

    files: dict[str, str] = {}
    files["recipe.yaml"] = yaml.safe_dump(redactor.data(state.recipe), sort_keys=False)
    files["cluster.yaml"] = yaml.safe_dump(redactor.data(state.cluster), sort_keys=False)
    files["state.json"] = json.dumps(redactor.data(state.model_dump(mode="json")), indent=2)
    versions = [
        f"tandem {TANDEM_VERSION}",
        f"python {sys.version.split()[0]}",
        f"control machine {platform.platform()}",
    ]
    try:
        for group in state.groups:
            for node, text in backend.node_versions(group).items():
                versions.append(f"\n[node {node}]\n{text}")
    except TandemError as exc:
        versions.append(f"\nnode versions unavailable: {exc.message}")
    files["versions.txt"] = "\n".join(versions) + "\n"
    events = state.directory.events
    if events.is_file():
        files["events.log"] = events.read_text(errors="replace")
    for group in state.groups:
        folder = "ranks" if len(state.groups) == 1 else f"ranks/g{group.group}"
        plan, unplanned = plans[group.group]
        if unplanned:
            files[f"{folder}/UNPLANNED.txt"] = unplanned
        for rank in plan.ranks if plan is not None else []:
            env = redactor.env(rank.env)
            files[f"{folder}/rank{rank.rank}.env"] = (
                "\n".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
                + f"\n\n# command\n{shlex.join(redactor.argv(rank.argv))}\n"
            )
        for record in group.ranks:
            try:
                lines = backend.log_reader(group, record).new_lines()
                text = "\n".join(lines[-LOG_LINES:]) + "\n"
            except TandemError as exc:
                text = f"(log unavailable: {exc.message})\n"
            files[f"{folder}/rank{record.rank}.log"] = text
    files["README.txt"] = (
        f"tandem support bundle of deployment '{state.name}' "
        f"({state.backend}), made {stamp}\n\n" + __doc__.split("::", 1)[1]
    )
    with (
        open_private(path, "xb") as raw,
        tarfile.open(fileobj=raw, mode="w:gz") as archive,
    ):
        for member, text in files.items():
            data = redactor.text(text).encode()  # every member, whatever its source
            info = tarfile.TarInfo(f"{state.name}-bundle/{member}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
            archive.addfile(info, io.BytesIO(data))
    return path


def _plan(state: GroupState) -> tuple[RankPlan | None, str]:
    """The ranks' plan (their env and command), or None and why: a bundle is made of exactly
    the state that cannot be launched again, so a saved recipe or cluster with parts missing or
    of another type (read as saved, ``GroupState.deployment(lenient=True)``) leaves the
    ranks' files out and says so, and the rest is bundled."""
    try:
        return plan_ranks(state.deployment(lenient=True)), ""
    except TandemError as exc:
        reason = exc.message
    except (AttributeError, TypeError, KeyError, ValueError) as exc:  # a part read as saved
        reason = f"the saved recipe or cluster lacks a part the plan reads ({exc})"
    return None, f"no ranks/rankN.env: {reason}; see recipe.yaml and cluster.yaml\n"
