"""``tandem model pull``: the recipe's model downloaded once, copied node to node over the fast
link, and verified on every node.

Users download a 150-170 GB snapshot on each node ("both nodes downloaded the same model"), or
copy it by hand and find a short shard at load time. The pull, for an ssh cluster:

1. **probe** every node's snapshot in parallel (the preflight's probe, model section only,
   each file checked against the id the Hub gave it; what was verified before and is unchanged
   is not read again, ``tandem.backends.snapshots``);
2. **source**: a node that already holds the whole commit (the leader first); only when none
   does, ``huggingface_hub.snapshot_download`` on one node (``--on``, default the leader), with
   its own resume, then verified there. The commit the revision resolved to is recorded with
   every file's id and size (``hf_cache.SnapshotManifest``): every later check judges each node
   against it;
3. **fan out** from the source to every node that lacks files: an ``rsync`` daemon on the
   source, bound to its ``data_address`` (the ConnectX-7 link, not the management port), read
   only, with a one-time password that never appears on a command line; each target pulls
   exactly the commit's files (blobs, snapshot links, the ref) with ``--partial-dir`` so an
   interrupted pull resumes where it stopped and never leaves a short file under a blob's name;
   existing files are never replaced (a blob whose content is not its id is named, and left to
   the user);
4. **verify** every node again, in parallel, against the manifest.

The daemon lives only while the copy does: its shell waits on stdin, which this process holds;
when the pull ends, or dies, the pipe closes and the daemon is stopped and its folder removed.
"""

from __future__ import annotations

import re
import secrets
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from tandem import agent, hf_cache
from tandem.backends import snapshots
from tandem.backends.openssh import OpenSSH, SSHTarget, engine_python
from tandem.backends.snapshots import hf_home_of, model_folder
from tandem.built_models import missing_hint
from tandem.check.node_transport import (
    Verification,
    finished_probe,
    probe_args,
)
from tandem.errors import BackendError
from tandem.render import shellwords
from tandem.spec.cluster import Node
from tandem.spec.deployment import Deployment

OnEvent = Callable[[str], None]
RSYNC_USER = "tandem"
PROGRESS_EVERY_S = 2.0
DOWNLOAD_TIMEOUT_S = 7 * 24 * 3600.0
_PROGRESS = re.compile(r"^\s*([\d,]+)\s+\d+%")


@dataclass
class NodeSnapshot:
    """One node's copy of the commit, as its probe found it."""

    node: str
    facts: dict[str, Any]

    @property
    def commit(self) -> str | None:
        return self.facts.get("commit")

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        return {f["name"]: f for f in self.facts.get("files") or []}

    @property
    def corrupt(self) -> list[dict[str, Any]]:
        return list(self.facts.get("corrupt") or [])

    @property
    def free_bytes(self) -> int | None:
        """Room left on the filesystem of the node's cache (None where it could not be read)."""
        free = self.facts.get("free_bytes")
        return int(free) if free is not None else None

    @property
    def sound(self) -> bool:
        """A snapshot whose every file has its id and nothing is known to be missing."""
        f = self.facts
        return bool(
            f.get("exists")
            and f.get("files")
            and not (
                f.get("corrupt")
                or f.get("broken_links")
                or f.get("missing_shards")
                or f.get("incomplete_blobs")
            )
        )

    def lacks(self, manifest: hf_cache.SnapshotManifest) -> list[str]:
        """The manifest's files this node does not hold as published (absent, or another blob
        or size)."""
        held = self.files if self.commit == manifest.commit else {}
        return sorted(
            name
            for name, want in manifest.files.items()
            if name not in held
            or (held[name]["size"], held[name].get("blob")) != (want.size, want.blob)
        )

    def manifest(self, repo_id: str, revision: str) -> hf_cache.SnapshotManifest:
        return hf_cache.SnapshotManifest(
            repo_id=repo_id,
            revision=revision,
            commit=self.commit or "",
            files={
                name: hf_cache.ManifestFile(blob=f["blob"], size=f["size"])
                for name, f in self.files.items()
            },
        )


@dataclass
class PullReport:
    """What the pull found, did and verified."""

    manifest: hf_cache.SnapshotManifest | None
    """None only for a dry run that would download first (nothing known of the commit yet)."""
    source: str
    downloaded: bool
    need: dict[str, int] = field(default_factory=dict)
    """target node -> bytes of the commit it lacked."""
    copied: dict[str, int] = field(default_factory=dict)
    """target node -> bytes copied to it."""
    copy_s: float = 0.0
    verified: dict[str, NodeSnapshot] = field(default_factory=dict)
    verify_s: dict[str, float] = field(default_factory=dict)
    """node -> seconds its probe spent reading files (0 where everything was remembered)."""
    verified_bytes: dict[str, int] = field(default_factory=dict)


class Pull:
    """One pull of a deployment's model onto its ssh nodes (see the module's docstring)."""

    def __init__(
        self,
        deployment: Deployment,
        *,
        bwlimit: str | None = None,
        on_event: OnEvent = lambda text: None,
    ) -> None:
        self.deployment = deployment
        self.bwlimit = bwlimit
        self.model = deployment.recipe.model
        self.ssh = OpenSSH.for_cluster(deployment.cluster)
        self.python = engine_python(deployment.cluster.ssh.vllm_command)
        self.nodes = {n.name: n for n in deployment.cluster.nodes}
        self.on_event = on_event

    # --- probing and verifying ------------------------------------------------------------

    def probe(self, names: list[str] | None = None) -> dict[str, NodeSnapshot]:
        """Each node's snapshot, every file checked against its id (unchanged ones remembered)."""
        names = names or list(self.nodes)
        verification = Verification(enabled=True, known=snapshots.known(self.deployment))

        def one(name: str) -> dict[str, Any]:
            node = self.nodes[name]
            started = time.time()
            result = self.ssh.run_python(
                SSHTarget.of(node),
                agent.source(),
                [
                    *probe_args(self.deployment, name, verification),
                    "--only",
                    "model",
                ],
                python=self.python,
                env=self._env(node),
                timeout_s=verification.timeout_s,
            )
            return finished_probe(result.returncode, result.stdout, result.stderr, name, started)

        self.on_event(f"verifying the snapshot on {', '.join(names)}")
        facts: dict[str, dict[str, Any]] = {}
        with ThreadPoolExecutor(max_workers=min(16, len(names))) as pool:
            running = {pool.submit(one, name): name for name in names}
            for done in as_completed(running):  # each node's answer as soon as it has one
                name = running[done]
                facts[name] = done.result()
                self.on_event(_describe(NodeSnapshot(name, facts[name].get("model") or {})))
        snapshots.remember(self.deployment, facts)
        return {name: NodeSnapshot(name, facts[name].get("model") or {}) for name in names}

    def _env(self, node: Node) -> dict[str, str]:
        """The node's variables, with HF_HOME where the recipe or node names one."""
        return {**node.env, "HF_HOME": hf_home_of(node, self.deployment)}

    def _repo_dir(self, node: Node) -> str:
        """The node's repo folder as a shell word (a leading ``~`` left to the node's shell)."""
        return shellwords.quote(model_folder(self.deployment, node))

    # --- the source -----------------------------------------------------------------------

    def source_of(
        self,
        found: dict[str, NodeSnapshot],
        manifest: hf_cache.SnapshotManifest | None,
        prefer: str | None = None,
    ) -> str | None:
        """The node to copy from: one that holds the whole commit, ``prefer`` (``--on``) first,
        then the leader."""
        first = prefer or self.deployment.cluster.leader.name
        order = [first] + [n for n in self.nodes if n != first]
        for name in order:
            held = found[name]
            if not held.sound:
                continue
            if manifest is None and self._pinned_commit() in (None, held.commit):
                return name
            if manifest is not None and not held.lacks(manifest):
                return name
        return None

    def _pinned_commit(self) -> str | None:
        revision = self.model.revision
        return revision if re.fullmatch(r"[0-9a-f]{40}", revision) else None

    def download(self, node: Node) -> None:
        """``snapshot_download`` on the node, into its Hugging Face home (huggingface_hub
        resumes a download that was cut, from its ``.incomplete`` blobs)."""
        script = (
            "import sys\n"
            "from huggingface_hub import snapshot_download\n"
            "print(snapshot_download(repo_id=sys.argv[1], revision=sys.argv[2]))\n"
        )
        self.on_event(
            f"{node.name}: downloading {self.model.repo_id}@{self.model.revision} "
            f"into {hf_home_of(node, self.deployment)} (huggingface_hub)"
        )
        result = self.ssh.run_python(
            SSHTarget.of(node),
            script,
            [self.model.repo_id, self.model.revision],
            python=self.python,
            env=self._env(node),
            timeout_s=DOWNLOAD_TIMEOUT_S,
            check=False,
        )
        if result.returncode:
            raise BackendError(
                f"the download on {node.name} failed: {result.stderr.strip()[-400:]}",
                node=node.name,
                hint="check the node's access to the Hub (HF_TOKEN in the node's env for a "
                "gated model) and run the pull again: it resumes",
            )

    def download_verified(self, holder: Node) -> NodeSnapshot:
        """Download on ``holder`` and read back what it holds.

        Raises:
            BackendError: the download failed, or what it left does not verify.
        """
        self.download(holder)
        held = self.probe([holder.name])[holder.name]
        if not held.sound:
            raise BackendError(
                f"the snapshot downloaded on {holder.name} does not verify: " + _describe(held),
                node=holder.name,
            )
        return held

    # --- the copy -------------------------------------------------------------------------

    def file_list(self, manifest: hf_cache.SnapshotManifest) -> list[str]:
        """The commit's paths relative to the repo folder: blobs, snapshot links, the ref."""
        paths = {f"blobs/{f.blob}" for f in manifest.files.values()}
        paths |= {f"snapshots/{manifest.commit}/{name}" for name in manifest.files}
        if not self._pinned_commit():
            paths.add(f"refs/{self.model.revision}")
        return sorted(paths)

    def daemon_script(self, source: Node, address: str, allowed: list[str]) -> str:
        """The rsync daemon on the source, bound to ``address``: read-only, one module, its
        password read from stdin's first line; stopped, and its folder removed, when it closes."""
        return (
            "set -e\n"
            f"repo=$(cd {self._repo_dir(source)} && pwd)\n"
            'd=$(mktemp -d "${TMPDIR:-/tmp}/tandem-pull.XXXXXX")\n'
            # the daemon forks a process per connection: stop its whole process group
            'trap \'kill -TERM -"$pid" 2>/dev/null || true; rm -rf "$d"\' EXIT\n'
            "umask 077\n"
            f'IFS= read -r secret; printf "{RSYNC_USER}:%s\\n" "$secret" > "$d/secrets"\n'
            "port=$(python3 -c 'import socket,sys; s=socket.socket(); "
            f"s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' {shlex.quote(address)})\n"
            'cat > "$d/rsyncd.conf" <<EOF\n'
            "use chroot = no\n"
            "reverse lookup = no\n"
            "uid = $(id -u)\n"
            "gid = $(id -g)\n"
            "[model]\n"
            "path = $repo\n"
            "read only = yes\n"
            "list = no\n"
            f"auth users = {RSYNC_USER}\n"
            "secrets file = $d/secrets\n"
            f"hosts allow = {' '.join(allowed)}\n"
            "EOF\n"
            'setsid rsync --daemon --no-detach --config="$d/rsyncd.conf" '
            f'--address={shlex.quote(address)} --port="$port" & pid=$!\n'
            'sleep 0.5; kill -0 "$pid"\n'
            'echo "listening $port"\n'
            "cat > /dev/null\n"
        )

    def target_script(self, target: Node, source_address: str, port: int, paths: list[str]) -> str:
        """rsync on a target, pulling the listed files from the source's daemon: the password
        from stdin, files kept whole (``--partial-dir``), none replaced (``--ignore-existing``)."""
        dst = self._repo_dir(target)
        listing = "\n".join(paths)
        return (
            "set -e\n"
            f"mkdir -p {dst}\n"
            'list=$(mktemp "${TMPDIR:-/tmp}/tandem-pull-list.XXXXXX")\n'
            "trap 'rm -f \"$list\"' EXIT\n"
            f"cat > \"$list\" <<'EOF'\n{listing}\nEOF\n"
            "IFS= read -r RSYNC_PASSWORD; export RSYNC_PASSWORD\n"
            'rsync -rlt --partial-dir=.tandem-partial --ignore-existing --files-from="$list" '
            "--info=progress2 --no-inc-recursive --contimeout=20 "
            + (f"--bwlimit={shlex.quote(self.bwlimit)} " if self.bwlimit else "")
            + f"rsync://{RSYNC_USER}@{source_address}:{port}/model/ {dst}/\n"
        )

    def fan_out(
        self, source: Node, targets: dict[str, int], manifest: hf_cache.SnapshotManifest
    ) -> dict[str, int]:
        """Copy the commit from ``source`` to every target (name -> bytes it lacks) at once,
        with progress per node and in total; returns the bytes each target received."""
        address = source.data_address or source.address
        allowed = sorted({self.nodes[t].data_address or self.nodes[t].address for t in targets})
        secret = secrets.token_hex(16)
        runs: dict[str, subprocess.Popen] = {}
        self.ssh.control_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        daemon = self._shell(source, self.daemon_script(source, address, allowed), text=True)
        try:
            assert daemon.stdin and daemon.stdout
            daemon.stdin.write(secret + "\n")
            daemon.stdin.flush()
            line = daemon.stdout.readline().split()
            if line[:1] != ["listening"]:
                daemon.stdin.close()
                raise BackendError(
                    f"the rsync daemon did not start on {source.name}: "
                    f"{(daemon.stderr.read() if daemon.stderr else '').strip()[-300:]}",
                    node=source.name,
                    hint="is rsync installed there, and is data_address one of its addresses?",
                )
            self.on_event(
                f"{source.name}: serving the commit at rsync://{address}:{line[1]} "
                f"to {', '.join(targets)}"
            )
            paths = self.file_list(manifest)
            return self._copy_all(source, address, int(line[1]), targets, paths, secret, runs)
        finally:
            # Stopping the daemon ends every target's rsync with an error, which keeps a cut
            # file in its partial folder; wait for that before leaving.
            if daemon.stdin and not daemon.stdin.closed:
                daemon.stdin.close()
            for process in (daemon, *runs.values()):
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()

    def _copy_all(
        self,
        source: Node,
        address: str,
        port: int,
        targets: dict[str, int],
        paths: list[str],
        secret: str,
        runs: dict[str, subprocess.Popen],
    ) -> dict[str, int]:
        moved = dict.fromkeys(targets, 0)
        readers = []
        for name in targets:
            script = self.target_script(self.nodes[name], address, port, paths)
            run = self._shell(self.nodes[name], script)
            assert run.stdin
            run.stdin.write((secret + "\n").encode())
            run.stdin.close()
            runs[name] = run
            reader = threading.Thread(target=_follow, args=(run.stdout, moved, name), daemon=True)
            reader.start()
            readers.append(reader)
        total = sum(targets.values())
        while any(r.poll() is None for r in runs.values()):
            time.sleep(PROGRESS_EVERY_S)
            self.on_event(
                "copy: "
                + ", ".join(f"{n} {_share(moved[n], targets[n])}" for n in targets)
                + f"; total {_share(sum(moved.values()), total)}"
            )
        for reader in readers:
            reader.join(timeout=5)
        failed = {
            n: (r.stderr.read().decode(errors="replace") if r.stderr else "").strip()[-300:]
            for n, r in runs.items()
            if r.returncode
        }
        if failed:
            raise BackendError(
                "the copy from "
                + source.name
                + " failed on "
                + "; ".join(f"{n}: {why}" for n, why in failed.items()),
                hint="run the pull again: files copied whole are kept, a cut file resumes",
            )
        return moved

    def _shell(self, node: Node, script: str, *, text: bool = False) -> subprocess.Popen:
        """``script`` run by ``sh`` on ``node`` over ssh, its three streams piped."""
        argv = self.ssh.argv(SSHTarget.of(node), ["sh", "-c", script])
        pipe = subprocess.PIPE
        return subprocess.Popen(argv, stdin=pipe, stdout=pipe, stderr=pipe, text=text)

    def _downloader(self, on: str | None) -> Node:
        """The node that downloads when no node holds the commit: ``--on`` or the leader.

        Raises:
            BackendError: the model is one tandem builds (no hub has it).
        """
        built = missing_hint(self.model.repo_id)
        if built:
            raise BackendError(
                f"no node holds {self.model.repo_id}, a model tandem builds: no hub has it to "
                "download",
                field="model.repo_id",
                hint=built + " on one node, then pull again: it copies from there",
            )
        return self.nodes[on or self.deployment.cluster.leader.name]

    # --- the whole pull -------------------------------------------------------------------

    def run(
        self, *, on: str | None = None, download: bool = True, dry_run: bool = False
    ) -> PullReport:
        """Probe, pick or download the source, record the manifest, fan out, verify.

        ``on``: the node that downloads when no node holds the commit, and the source when it
        holds it (before the leader). ``download=False`` (``tandem sync``) refuses when no
        node holds the commit; ``dry_run`` stops after saying what would be copied
        (``PullReport.need``).

        Raises:
            BackendError: no node can be the source and the download failed (or was not
                allowed), a node holds a file whose content is not its id, a copy failed, or
                a node still differs.
        """
        if self.model.path:
            raise BackendError(
                f"model.path serves the directory {self.model.path}: a pull places a Hub "
                "snapshot in each node's Hugging Face cache",
                field="model.path",
                hint="remove model.path to serve model.repo_id from the cache, or copy the "
                "directory to every node yourself",
            )
        if on is not None and on not in self.nodes:
            raise BackendError(
                f"--on {on}: the cluster has no such node",
                hint=f"one of: {', '.join(self.nodes)}",
            )
        found = self.probe()
        manifest = snapshots.load_manifest(self.model.repo_id, self.model.revision)
        source = self.source_of(found, manifest, prefer=on)
        downloaded = False
        if source is None and not download:
            raise BackendError(
                f"no node holds the whole commit of {self.model.repo_id}@{self.model.revision}",
                hint=f"`tandem model pull {self.deployment.recipe.name}` downloads it once and "
                "places it on every node",
            )
        if source is None:
            holder = self._downloader(on)
            if dry_run:  # what the download brings is known only once it is there
                return PullReport(manifest=manifest, source=holder.name, downloaded=False)
            found[holder.name] = self.download_verified(holder)
            source, downloaded = holder.name, True
        else:
            self.on_event(f"{source} holds the whole commit: nothing is downloaded")
        if manifest is None:
            manifest = found[source].manifest(self.model.repo_id, self.model.revision)
            snapshots.save_manifest(manifest)
            if not self._pinned_commit():
                self.on_event(
                    f"revision {self.model.revision} is commit {manifest.commit} on {source}: "
                    f"recorded; pin it in the recipe (model.revision: {manifest.commit})"
                )
        corrupt = {n: h.corrupt for n, h in found.items() if h.corrupt}
        if corrupt:
            raise BackendError(
                "files whose content is not their id: "
                + "; ".join(
                    f"{n}: {', '.join(c['name'] for c in files)}" for n, files in corrupt.items()
                ),
                hint="tandem does not replace files it did not write: delete those blobs "
                "(blobs/<id> under the repo folder) on that node and pull again",
            )
        need = {
            n: sum(manifest.files[f].size for f in held.lacks(manifest))
            for n, held in found.items()
            if n != source and held.lacks(manifest)
        }
        refuse_short_of_room(need, found)
        report = PullReport(manifest=manifest, source=source, downloaded=downloaded, need=need)
        if dry_run:
            return report
        if need:
            started = time.monotonic()
            report.copied = self.fan_out(self.nodes[source], need, manifest)
            report.copy_s = time.monotonic() - started
        else:
            self.on_event("every node holds the commit: nothing to copy")
        after = self.probe()
        report.verified = after
        report.verify_s = {n: float(h.facts.get("verify_s") or 0.0) for n, h in after.items()}
        report.verified_bytes = {
            n: int(h.facts.get("verified_bytes") or 0) for n, h in after.items()
        }
        wrong = {n: h.lacks(manifest) or [c["name"] for c in h.corrupt] for n, h in after.items()}
        wrong = {n: names for n, names in wrong.items() if names}
        if wrong:
            raise BackendError(
                "nodes still differ from the pulled commit: "
                + "; ".join(f"{n}: {', '.join(names[:5])}" for n, names in wrong.items()),
                hint="run the pull again",
            )
        return report


def refuse_short_of_room(need: dict[str, int], found: dict[str, NodeSnapshot]) -> None:
    """Refuse, before a byte moves, every node whose cache's filesystem cannot take what it
    lacks: a 150 GB copy that stops at "No space left on device" leaves a partial shard and an
    hour lost.

    Raises:
        BackendError: naming each such node with what it needs and what it has.
    """
    short = {
        node: (size, free)
        for node, size in need.items()
        if (free := found[node].free_bytes) is not None and size > free
    }
    if short:
        raise BackendError(
            "not enough room for the snapshot: "
            + "; ".join(
                f"{node} lacks {gb(size)} of it and has {gb(free)} free under "
                f"{found[node].facts.get('repo_dir') or 'its cache'}"
                for node, (size, free) in short.items()
            ),
            hint="free space there, or give that node a cache on a disk with room (HF_HOME in "
            "its env in the cluster file, or model.cache_root in the recipe); nothing was copied",
        )


def gb(size: int) -> str:
    return f"{size / 1e9:,.2f} GB"


def _follow(stream: Any, moved: dict[str, int], name: str) -> None:
    """Read rsync's ``--info=progress2`` lines (``\\r``-separated) into ``moved[name]``."""
    if stream is None:
        return
    pending = b""
    for chunk in iter(lambda: stream.read1(4096), b""):
        pending += chunk
        *lines, pending = re.split(rb"[\r\n]", pending)
        for line in lines:
            match = _PROGRESS.match(line.decode(errors="replace"))
            if match:
                moved[name] = int(match.group(1).replace(",", ""))


def _share(done: int, total: int) -> str:
    percent = 100.0 * done / total if total else 100.0
    return f"{done / 1e9:.2f}/{total / 1e9:.2f} GB ({percent:.0f}%)"


def _describe(held: NodeSnapshot) -> str:
    if not held.facts.get("exists"):
        return f"{held.node}: no snapshot"
    f = held.facts
    faults = [
        f"{len(f.get('corrupt') or [])} corrupt" if f.get("corrupt") else "",
        f"{len(f.get('missing_shards') or [])} shard(s) missing" if f.get("missing_shards") else "",
        f"{len(f.get('incomplete_blobs') or [])} unfinished" if f.get("incomplete_blobs") else "",
    ]
    read, seconds = f.get("verified_bytes") or 0, f.get("verify_s") or 0.0
    return (
        f"{held.node}: commit {held.commit}, {len(held.files)} file(s), "
        f"{int(f.get('total_bytes') or 0):,} bytes; read {read:,} bytes to verify"
        + (f" in {seconds:.1f} s ({read / seconds / 1e9:.2f} GB/s)" if read and seconds else "")
        + "".join(f"; {x}" for x in faults if x)
    )
