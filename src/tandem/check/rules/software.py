"""Rules on what runs: the probe itself, versions that must match across nodes, the image,
the model snapshot, and environment variables known to break NCCL or vLLM."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from tandem import hf_cache
from tandem.built_models import build_command, is_built, missing_hint
from tandem.check.findings import Finding, Severity
from tandem.check.known_env import EMPTY_NCCL_VARIABLE, known_bad
from tandem.check.rules.context import CheckContext, fact, few, listing, rdma_devices_of
from tandem.spec.cluster import Transport
from tandem.spec.deployment import Deployment


class ProbeFailedRule:
    """A node that could not be probed: unreachable, no python3, or the probe crashed."""

    name = "probe-failed"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node in ctx.nodes:
            facts = ctx.facts.get(node.name) or {"probe_error": "no facts"}
            if "probe_error" in facts:
                yield Finding(
                    rule=self.name,
                    severity=Severity.ERROR,
                    node=node.name,
                    message="the node could not be probed",
                    evidence=facts["probe_error"],
                    fix="make the node reachable with python3 >= 3.8 on it, then rerun",
                )


class VersionSkewRule:
    """Kernel, DGX OS, driver, CUDA, NIC firmware, vLLM and image digest must match on all nodes."""

    name = "version-skew"
    fixes: ClassVar[dict[str, str]] = {
        "kernel": "install the same kernel on every node (`apt install linux-image-VERSION`, "
        "reboot) — NCCL and the GPU driver are built per kernel",
        "DGX OS": "bring every node to the same DGX OS release (`sudo apt update && sudo apt "
        "full-upgrade`, then reboot)",
        "NVIDIA driver": "install the same driver on every node; mixed drivers break NCCL",
        "CUDA": "install the same CUDA on every node (it comes with the driver on DGX OS)",
        "NIC firmware": "flash the same ConnectX firmware on every node (`mlxfwmanager --online "
        "-u` or the DGX OS firmware update), then reboot",
        "vLLM": "install the same vLLM on every node",
        "image digest": "pull the same image digest on every node, ideally pinned as "
        "`engine.image: REPO@sha256:...`",
    }

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if len(ctx.nodes) < 2:
            return
        image = ctx.deployment.recipe.engine.image
        readings: dict[str, dict[str, Any]] = {name: {} for name in self.fixes}
        for node, facts in ctx.probed():
            readings["kernel"][node.name] = fact(facts, "system", "kernel")
            readings["DGX OS"][node.name] = fact(
                facts, "system", "dgx_release", "DGX_SWBUILD_VERSION"
            )
            readings["NVIDIA driver"][node.name] = fact(facts, "gpu", "driver_version")
            readings["CUDA"][node.name] = fact(facts, "gpu", "cuda_version")
            devices = rdma_devices_of(facts)
            wanted = ctx.hcas(node) if ctx.uses_ib else list(devices)
            firmware = sorted(
                {devices[h]["fw_ver"] for h in wanted if h in devices and devices[h].get("fw_ver")}
            )
            readings["NIC firmware"][node.name] = "/".join(firmware) or None
            if not image:
                readings["vLLM"][node.name] = fact(facts, "software", "vllm_version")
            else:
                digests = sorted(
                    {i["digest"] for i in image_matches(facts, image) if i.get("digest")}
                )
                readings["image digest"][node.name] = ",".join(digests) or None
        for what, values in readings.items():
            known = {n: v for n, v in values.items() if v is not None}
            if len(set(known.values())) > 1:
                yield Finding(
                    rule=self.name,
                    severity=Severity.ERROR,
                    node=None,
                    message=f"{what} differs between nodes",
                    evidence=listing(known),
                    fix=self.fixes[what],
                )


def image_matches(facts: dict[str, Any], image: str) -> list[dict[str, Any]]:
    """Images on a node that are ``image`` (``repo:tag``, or ``repo@sha256:...`` by digest)."""
    images = fact(facts, "images", "images") or []
    if "@" in image:
        repo, digest = image.split("@", 1)
        return [
            i for i in images if i.get("digest") == digest and i["ref"].rsplit(":", 1)[0] == repo
        ]
    ref = image if ":" in image.rsplit("/", 1)[-1] else image + ":latest"
    return [
        i for i in images if i.get("ref") in (ref, "docker.io/" + ref, "docker.io/library/" + ref)
    ]


class VllmVersionRule:
    """The recipe's ``engine.vllm_version`` is what each node runs (bare-host runtimes)."""

    name = "vllm-version"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        engine = ctx.deployment.recipe.engine
        if not engine.vllm_version or engine.image:
            return
        for node, facts in ctx.probed():
            found = fact(facts, "software", "vllm_version")
            if (found or "").split("+", 1)[0] != engine.vllm_version.split("+", 1)[0]:
                yield Finding(
                    rule=self.name,
                    severity=Severity.ERROR,
                    node=node.name,
                    message=f"vLLM {found}; the recipe needs {engine.vllm_version}"
                    if found
                    else f"vLLM is not installed; the recipe needs {engine.vllm_version}",
                    evidence=f"python {fact(facts, 'software', 'executable') or '?'}: packages "
                    f"{fact(facts, 'software', 'packages') or {}}",
                    fix=f"pip install vllm=={engine.vllm_version} on {node.name}",
                )


class ImagePresentRule:
    """The recipe's image is on every node before launch (no slow or failing pull mid-start)."""

    name = "image-missing"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        image = ctx.deployment.recipe.engine.image
        if not image or ctx.deployment.cluster.transport is Transport.LOCAL:
            return
        for node, facts in ctx.probed():
            if not image_matches(facts, image):
                tools = fact(facts, "images", "tools") or []
                yield Finding(
                    rule=self.name,
                    severity=Severity.ERROR,
                    node=node.name,
                    message=f"image {image} is not on the node",
                    evidence=f"image stores read: {', '.join(tools) or 'none (no docker, no ctr)'}",
                    fix=f"pull it on {node.name} first: `docker pull {image}` or, for "
                    f"Kubernetes, `sudo ctr -n k8s.io images pull {image}`",
                )


def fetch_command(deployment: Deployment) -> str:
    """How the model gets into a node's cache: the ``tandem model`` command for a model tandem
    builds (no hub has it; on remote nodes, built once and copied by ``tandem model pull``),
    else the Hub's download into the recipe's cache root."""
    model = deployment.recipe.model
    home = model.cache_root or hf_cache.DEFAULT_HOME
    built = build_command(model.repo_id)
    if built is None and is_built(model.repo_id):
        return str(missing_hint(model.repo_id))
    if built is not None:
        if deployment.cluster.transport is Transport.LOCAL:
            return f"`HF_HOME={home} {built}` (tandem makes this model; no hub has it)"
        recipe = deployment.recipe_file or deployment.name
        if recipe.startswith("built-in recipe "):
            recipe = deployment.recipe.name
        cluster = f" --cluster {deployment.cluster_file}" if deployment.cluster_file else ""
        return (
            f"`HF_HOME={home} {built}` on one node (tandem makes this model; no hub has it), "
            f"then `tandem model pull {recipe}{cluster}` copies it to the others"
        )
    return f"`HF_HOME={home} hf download {model.repo_id} --revision {model.revision}`"


class ModelSnapshotRule:
    """The snapshot is present, complete, in the HF cache layout, and the same on every node."""

    name = "model-snapshot"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        model = ctx.deployment.recipe.model
        download = fetch_command(ctx.deployment)
        present: dict[str, dict[str, Any]] = {}
        for node, facts in ctx.probed():
            snap = facts.get("model")
            if not snap:
                continue
            where = snap.get("snapshot_dir") or snap.get("repo_dir") or snap.get("path")
            if snap.get("layout") == "plain-directory" and not model.path:
                yield Finding(
                    rule="model-not-cache-layout",
                    severity=Severity.ERROR,
                    node=node.name,
                    message="the weights are a plain directory, not the Hugging Face cache layout",
                    evidence=f"{snap.get('plain_dir') or snap.get('repo_dir')} has no "
                    "snapshots/<commit>/ with refs/; an offline vLLM serving by repo id "
                    "will not find it",
                    fix=f"put it into the cache with {download}, or serve the directory by "
                    "setting model.path",
                )
                continue
            if not snap.get("exists"):
                severity = Severity.ERROR if model.offline else Severity.WARNING
                yield Finding(
                    rule="model-snapshot-missing",
                    severity=severity,
                    node=node.name,
                    message=f"no snapshot of {model.repo_id}@{model.revision}",
                    evidence=f"{where}: refs/{model.revision} -> {snap.get('commit') or 'absent'}; "
                    f"snapshots present: {snap.get('snapshots') or 'none'}",
                    fix=f"on {node.name}: {download} (the same path on every node)"
                    + ("" if model.offline else "; otherwise every rank downloads at start"),
                )
                continue
            broken = snap.get("broken_links") or []
            shards = snap.get("missing_shards") or []
            partial = snap.get("incomplete_blobs") or []
            if broken or shards or partial:
                parts = []
                if shards:
                    parts.append(f"shards named by the index but absent: {', '.join(shards)}")
                if broken:
                    parts.append(f"links to missing blobs: {', '.join(broken)}")
                if partial:
                    parts.append(f"unfinished downloads in blobs/: {', '.join(partial)}")
                yield Finding(
                    rule="model-snapshot-incomplete",
                    severity=Severity.ERROR,
                    node=node.name,
                    message=f"the snapshot at {where} is incomplete",
                    evidence="; ".join(parts),
                    fix=f"finish the download on {node.name}: {download}",
                )
                continue
            faults = list(self._against_ids(ctx, node.name, snap, where))
            if faults:
                yield from faults
                continue
            present[node.name] = snap
        yield from self._compare(present)

    def _against_ids(
        self, ctx: CheckContext, node: str, snap: dict[str, Any], where: str
    ) -> Iterable[Finding]:
        """Files whose content is not what their id says, and, when a pull recorded the
        commit's manifest, files missing or other than the Hub's."""
        pull = f"`tandem model pull {ctx.deployment.recipe.name}` (it copies only what differs)"
        corrupt = snap.get("corrupt") or []
        if corrupt:
            yield Finding(
                rule="model-snapshot-corrupt",
                severity=Severity.ERROR,
                node=node,
                message=f"{len(corrupt)} file(s) of the snapshot at {where} are not what their "
                "id says (truncated, or bytes changed after the download)",
                evidence=few(
                    [
                        f"{c['name']}: {c['size']:,} bytes hash to {c['found'][:12]}..., "
                        f"its blob id is {c['blob'][:12]}..."
                        for c in corrupt
                    ],
                    sep="; ",
                ),
                fix=f"on {node}: delete those blobs (blobs/<id> under the repo folder) and "
                f"download them again, or {pull}",
            )
        manifest = ctx.manifest
        if manifest is None:
            return
        if snap.get("commit") != manifest.commit:
            yield Finding(
                rule="model-snapshot-differs",
                severity=Severity.ERROR,
                node=node,
                message=f"the node serves commit {snap.get('commit')}, the pull took "
                f"{manifest.commit} for {manifest.repo_id}@{manifest.revision}",
                evidence=f"{where}; snapshots present: {snap.get('snapshots') or 'none'}",
                fix=f"pin model.revision: {manifest.commit} in the recipe, or {pull}",
            )
            return
        held = {f["name"]: f for f in snap.get("files") or []}
        missing = sorted(set(manifest.files) - set(held))
        other = sorted(
            name
            for name, want in manifest.files.items()
            if name in held
            and (held[name]["size"], held[name].get("blob")) != (want.size, want.blob)
        )
        if missing or other:
            parts = []
            if missing:
                parts.append(f"missing: {few(missing)}")
            for name in other[:5]:
                want, got = manifest.files[name], held[name]
                parts.append(
                    f"{name}: {got['size']:,} bytes, blob {str(got.get('blob'))[:12]}... where the "
                    f"Hub's is {want.size:,} bytes, {want.blob[:12]}..."
                )
            yield Finding(
                rule="model-snapshot-incomplete",
                severity=Severity.ERROR,
                node=node,
                message=f"the snapshot at {where} is not the one pulled "
                f"({len(missing)} file(s) missing, {len(other)} other)",
                evidence="; ".join(parts),
                fix=f"{pull}",
            )

    def _compare(self, present: dict[str, dict[str, Any]]) -> Iterable[Finding]:
        if len(present) < 2:
            return
        commits = {n: s.get("commit") for n, s in present.items()}
        if len(set(commits.values())) > 1:
            yield Finding(
                rule="model-snapshot-differs",
                severity=Severity.ERROR,
                node=None,
                message="the nodes hold different snapshots (commits)",
                evidence=listing(commits),
                fix="pin model.revision to one 40-hex commit and download it on every node",
            )
            return
        views = {
            n: {f["name"]: (f["size"], f.get("blob"), f.get("sha256")) for f in s["files"]}
            for n, s in present.items()
        }
        first_node, first = next(iter(views.items()))
        for other_node, other in views.items():
            differing = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
            if differing:
                yield Finding(
                    rule="model-snapshot-differs",
                    severity=Severity.ERROR,
                    node=other_node,
                    message=f"files differ from {first_node}'s snapshot",
                    evidence=f"{len(differing)} file(s) differ in presence, size or blob hash: "
                    f"{few(differing)}",
                    fix=f"copy the snapshot from {first_node} (`rsync -a --checksum`) or "
                    "re-download it",
                )


class KnownBadEnvRule:
    """Environment variables from ``known_env.KNOWN_BAD_ENV`` in any rank's environment."""

    name = "known-bad-env"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        recipe_env = ctx.deployment.recipe.env
        vllm = ctx.deployment.recipe.engine.vllm_version
        seen: set[tuple[str | None, str]] = set()
        for node in ctx.nodes:
            env = ctx.rank_env.get(node.name) or {**recipe_env, **node.env}
            for name, value in sorted(env.items()):
                row = known_bad(name, value, uses_ib=ctx.uses_ib)
                if row is None and name.startswith("NCCL_") and value == "":
                    row = EMPTY_NCCL_VARIABLE
                if row is None:
                    continue
                where = (
                    None if recipe_env.get(name) == value and name not in node.env else node.name
                )
                if (where, name) in seen:
                    continue
                seen.add((where, name))
                origin = "recipe env" if where is None else f"node {node.name}'s environment"
                yield Finding(
                    rule=self.name,
                    severity=row.severity_for(vllm),
                    node=where,
                    message=f"{name}={value!r} {row.effect}",
                    evidence=f"set in the {origin}; known from {row.source}",
                    fix=row.fix,
                )
