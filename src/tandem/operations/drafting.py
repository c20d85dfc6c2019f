"""``tandem init``: a recipe and a cluster inventory drafted for a model and nodes, planned
before they are written, so that what is written fits.

Steps, in order:

1. The model's facts: its ``config.json`` from ``--config``, a local folder, or the Hugging
   Face cache (``tandem.plan.config``; the weights counted from the architecture when only the
   config is there). A model tandem builds and that is not built yet is refused with the
   command that builds it.
2. The nodes: this machine (``ranks`` local nodes, as ``tandem up`` places a recipe without a
   cluster) or the ``hosts`` over ssh. Reachable ssh nodes are asked for their facts by the
   node agent (``tandem.operations.preflight.probe_all``): the interface that holds each
   node's address becomes its ``control_plane_interface``, the GPUs its ``gpus`` and the
   hardware profile; an unreachable node is named, and its interface left to the user.
3. The parallelism: tensor parallel across every device when the attention heads divide
   evenly (the KV heads are replicated where there are fewer), else pipeline parallel when the
   layers do, else tensor parallel within a node and pipeline across nodes.
4. The plan (``tandem.plan.planner.plan_deployment``) at ``max_model_len`` (the model's own,
   capped at 8,192 tokens on CPUs and 32,768 on GPUs unless given): when it does not fit,
   ``max_model_len`` is lowered to the longest request the pool holds and the utilization to
   what the hardware starts with, and it is planned again; what still does not fit is refused
   with the plan's changes.
5. The two files as YAML, each with a header saying what was planned, refused if either
   exists: ``tandem init`` never replaces a file.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field

from tandem import files, ownership, wire
from tandem.backends.ssh_check import SSHNodeTransport
from tandem.built_models import missing_hint
from tandem.errors import PlanError, SpecError, TandemError
from tandem.operations.preflight import probe_all
from tandem.plan.config import ModelFacts, facts_from_dir, load_model_facts
from tandem.plan.hardware import HardwareProfile, listed_profiles, load_profile
from tandem.plan.memory import model_max_len
from tandem.plan.planner import Plan, plan_deployment
from tandem.spec.cluster import Cluster, LocalIsolation, Node
from tandem.spec.deployment import Deployment, deployment_problems, local_cluster
from tandem.spec.recipe import Recipe

OnEvent = Callable[[str], None]
CPU_KV_CACHE_GIB = 1
"""``VLLM_CPU_KVCACHE_SPACE`` of a CPU recipe: the GiB of KV cache each worker allocates."""
LONGEST = {"cpu": 8192, "cuda": 32768}
"""The longest ``max_model_len`` chosen unless asked: a context that boots in a minute."""
GPU_PROFILES = {"GB10": "gb10", "GB200": "gb200", "B200": "b200", "H200": "h200", "H100": "h100"}
"""A word of ``nvidia-smi``'s GPU name -> the hardware profile (``tandem/hardware/``)."""


class InitRequest(BaseModel):
    """What the user asked ``tandem init`` for (flags or answers)."""

    name: str | None = Field(default=None, description="Deployment name; default: the model's.")
    model: str = Field(description="A Hub repo id (ORG/NAME) or a local snapshot folder.")
    hosts: list[str] = Field(
        default_factory=list, description="ssh hosts, `NAME=HOST` or `HOST`; none: this machine."
    )
    ranks: int = Field(default=2, ge=1, description="Nodes on this machine (no hosts).")
    gpus: int | None = Field(default=None, ge=1, description="GPUs per node; default: found.")
    ssh_user: str | None = None
    hardware: str | None = Field(default=None, description="A hardware profile's name.")
    config_path: Path | None = Field(default=None, description="The model's config.json.")
    max_model_len: int | None = Field(default=None, ge=1)
    port: int = Field(default=8000, ge=1, le=65535, description="The API port.")
    master_port: int = Field(default=29501, ge=1, le=65535, description="The rendezvous port.")
    subnet: str = Field(default="10.77.0.0/24", description="Local nodes' subnet (as root).")
    cpu_count: int = 1
    gpu_count: int = 0


class Draft(BaseModel):
    """What ``tandem init`` writes, and the plan that says it fits."""

    name: str
    recipe: dict[str, Any]
    cluster: dict[str, Any]
    recipe_yaml: str
    cluster_yaml: str
    fits: bool
    kv_pool_tokens: int
    max_model_len: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    hardware: str
    notes: list[str] = Field(default_factory=list)


def draft(request: InitRequest, *, on_event: OnEvent = lambda text: None) -> Draft:
    """A recipe and a cluster for ``request`` that the planner says fit (module docstring).

    Raises:
        SpecError: a name, host or model that cannot be used; PlanError: the model is not
            found, cannot be split over the nodes, or does not fit at any setting tried.
    """
    facts, model = model_facts(request)
    name = ownership.check_name(request.name or default_name(request.model), field="NAME")
    cluster, facts_by_node, notes = nodes_of(request, name, on_event)
    hardware = _hardware(request, cluster, facts_by_node)
    gpus = request.gpus or max(cluster.nodes[0].gpus, 1)
    tp, pp = parallelism(facts.config, nodes=len(cluster.nodes), gpus=gpus)
    if request.hosts:
        cluster = cluster.model_copy(
            update={"nodes": [n.model_copy(update={"gpus": gpus}) for n in cluster.nodes]}
        )
    longest = model_max_len(facts.config) or LONGEST[hardware.device]
    recipe = _recipe(
        name,
        model,
        facts,
        hardware,
        tp=tp,
        pp=pp,
        max_model_len=request.max_model_len or min(longest, LONGEST[hardware.device]),
        ports={"api": request.port, "master": request.master_port},
    )
    recipe, plan = fitted(recipe, cluster, facts, hardware)
    notes += [f"planned: {note}" for note in plan.notes[:1]]
    recipe_data = recipe.model_dump(mode="json", exclude_defaults=True)
    dumped = cluster.model_dump(mode="json", exclude_defaults=True)
    # the transport's default is ssh: say it, second as in the shipped inventories
    cluster_data = {"name": dumped.pop("name"), "transport": cluster.transport.value, **dumped}
    header = _header(plan, hardware)
    return Draft(
        name=name,
        recipe=recipe_data,
        cluster=cluster_data,
        recipe_yaml=header + _yaml(recipe_data),
        cluster_yaml=_cluster_header(name, request) + _yaml(cluster_data),
        fits=plan.fits,
        kv_pool_tokens=plan.kv_pool_tokens,
        max_model_len=plan.settings.max_model_len,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        hardware=hardware.name,
        notes=notes,
    )


def model_facts(request: InitRequest) -> tuple[ModelFacts, dict[str, Any]]:
    """The model's facts and the recipe's ``model:`` for it.

    Raises:
        PlanError: nothing found, with the command or flag that fixes it.
    """
    folder = Path(request.model).expanduser()
    if folder.is_dir():
        repo_id = "local/" + re.sub(r"[^\w.\-]", "-", folder.resolve().name)
        facts = facts_from_dir(folder, repo_id, "model folder")
        return facts, {"repo_id": repo_id, "path": str(folder.resolve())}
    if not re.fullmatch(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+", request.model):
        raise SpecError(
            f"'{request.model}' is neither a Hub repo id (ORG/NAME) nor a folder here",
            field="--model",
            hint="pass e.g. Qwen/Qwen3-8B, or the path of a snapshot folder",
        )
    try:
        facts = load_model_facts(request.model, config_path=request.config_path)
    except PlanError as exc:
        raise PlanError(
            exc.message,
            field="--model",
            hint=missing_hint(request.model)
            or "pass --config with its config.json (the Hub page's Files: config.json): "
            "init plans from it alone, before anything is downloaded",
        ) from exc
    served = request.model.rsplit("/", 1)[-1].lower()
    return facts, {"repo_id": request.model, "served_name": served}


def default_name(model: str) -> str:
    """A deployment name from a repo id or folder: ``Qwen/Qwen3-8B`` -> ``qwen3-8b``."""
    base = Path(model.rstrip("/")).name.lower()
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", base)).strip("-")[:40] or "model"


def nodes_of(
    request: InitRequest, name: str, on_event: OnEvent
) -> tuple[Cluster, dict[str, dict[str, Any]], list[str]]:
    """The cluster, each reachable node's facts (ssh) and what could not be found."""
    if not request.hosts:
        try:
            cluster = local_cluster(
                request.ranks,
                isolation=LocalIsolation.AUTO,
                cpu_count=request.cpu_count,
                gpu_count=request.gpu_count,
                subnet=request.subnet,
            )
        except SpecError as exc:  # more ranks than this machine has nodes
            raise SpecError(
                exc.message,
                field="--ranks",
                hint="name the nodes with --hosts, lower --ranks, or give a larger --subnet",
            ) from None
        return cluster.model_copy(update={"name": f"{name}-local"}), {}, []
    nodes = []
    for host in request.hosts:
        node_name, _, address = host.rpartition("=")
        node_name = node_name or re.sub(r"[^A-Za-z0-9.\-]", "-", address)
        entry: dict[str, Any] = {"name": node_name, "address": address}
        if request.ssh_user:
            entry["ssh_user"] = request.ssh_user
        nodes.append(entry)
    cluster = Cluster.model_validate({"name": name, "transport": "ssh", "nodes": nodes})
    on_event(f"asking {len(nodes)} node(s) for their facts over ssh")
    probe = Deployment(recipe=_probe_recipe(name), cluster=cluster)
    try:
        facts = probe_all(probe, SSHNodeTransport(probe))
    except TandemError as exc:  # one node's ssh fails the probe of all: none was asked
        facts = {n.name: {"probe_error": exc.message} for n in cluster.nodes}
    notes: list[str] = []
    updated: list[Node] = []
    for node in cluster.nodes:
        found = facts.get(node.name, {})
        if "probe_error" in found:
            notes.append(
                f"{node.name}: not reachable ({found['probe_error']}); set its "
                "control_plane_interface in the cluster file"
            )
            updated.append(node)
            continue
        interface = interface_of(found, node.address)
        gpus = len((found.get("gpu") or {}).get("gpus") or [])
        updated.append(
            node.model_copy(update={"control_plane_interface": interface, "gpus": max(gpus, 1)})
        )
        if interface is None:
            notes.append(f"{node.name}: no interface holds {node.address}; set it by hand")
    return cluster.model_copy(update={"nodes": updated}), facts, notes


def _probe_recipe(name: str) -> Recipe:
    return Recipe.model_validate({"name": name, "model": {"repo_id": "tandem-init/probe"}})


def interface_of(facts: dict[str, Any], address: str) -> str | None:
    """The interface that holds ``address`` in a node's facts, or None."""
    for interface in facts.get("interfaces") or []:
        held = [a.split("/")[0] for a in interface.get("addresses") or []]
        if address in held:
            return interface.get("name")
    return None


def _hardware(
    request: InitRequest, cluster: Cluster, facts: dict[str, dict[str, Any]]
) -> HardwareProfile:
    if request.hardware:
        return load_profile(request.hardware)
    names = [
        g.get("name", "")
        for found in facts.values()
        for g in (found.get("gpu") or {}).get("gpus") or []
    ]
    for word, profile in GPU_PROFILES.items():
        if any(word in n.upper().split() or word in n.upper() for n in names):
            return load_profile(profile)
    if names or (not request.hosts and request.gpu_count):
        raise PlanError(
            f"no hardware profile for the GPUs found ({', '.join(sorted(set(names))) or 'local'})",
            field="--hardware",
            hint=f"pass --hardware {'|'.join(listed_profiles(cpu=False))}",
        )
    if request.hosts and not facts:
        raise PlanError(
            "the nodes could not be asked which hardware they have",
            field="--hardware",
            hint=f"pass --hardware {'|'.join(listed_profiles())}",
        )
    return load_profile("cpu")


def parallelism(config: dict[str, Any], *, nodes: int, gpus: int) -> tuple[int, int]:
    """(TP, PP) over ``nodes`` x ``gpus`` devices: the module docstring's step 3.

    Raises:
        PlanError: neither the heads nor the layers split over the devices.
    """
    devices = nodes * gpus
    heads = int(config.get("num_attention_heads") or 1)
    layers = int(config.get("num_hidden_layers") or 1)
    if heads % devices == 0:
        return devices, 1
    if layers % devices == 0 and layers >= devices:
        return 1, devices
    if heads % gpus == 0 and layers % nodes == 0:
        return gpus, nodes
    raise PlanError(
        f"{heads} attention heads and {layers} layers cannot be split over {devices} device(s)",
        field="--hosts",
        hint="use a number of nodes that divides the heads or the layers",
    )


def _recipe(
    name: str,
    model: dict[str, Any],
    facts: ModelFacts,
    hardware: HardwareProfile,
    *,
    tp: int,
    pp: int,
    max_model_len: int,
    ports: dict[str, int],
) -> Recipe:
    serve: dict[str, Any] = {
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "max_model_len": max_model_len,
    }
    data: dict[str, Any] = {
        "name": name,
        "description": f"{facts.repo_id}, TP={tp} PP={pp} (written by tandem init)",
        "model": {**model, "offline": True},
        "engine": {"serve": serve},
        "ports": ports,
    }
    if hardware.device == "cpu":
        data["env"] = {wire.VLLM_CPU_KVCACHE_SPACE: str(CPU_KV_CACHE_GIB)}
        serve["max_num_seqs"] = 8
        if pp > 1:  # vLLM-CPU 0.32: a later stage's buffer needs one traced warm-up
            data["engine"]["extra_args"] = ["--compilation-config", PP_ON_CPU]
        else:
            serve["enforce_eager"] = True  # no torch.compile: a start of seconds, not minutes
    return Recipe.model_validate(data)


PP_ON_CPU = json.dumps({"mode": 2, "backend": "eager"}, separators=(",", ":"))
"""``--compilation-config`` of a pipeline on vLLM-CPU 0.32 (the built-in smollm2-local says
why: with enforce_eager a later stage never allocates its input buffer)."""


def fitted(
    recipe: Recipe, cluster: Cluster, facts: ModelFacts, hardware: HardwareProfile
) -> tuple[Recipe, Plan]:
    """The recipe, its settings lowered until the plan fits, and that plan.

    Raises:
        SpecError: the recipe and cluster cannot work together; PlanError: it does not fit.
    """
    for _ in range(3):
        deployment = Deployment(recipe=recipe, cluster=cluster)
        problems = deployment_problems(deployment)
        if problems:
            raise SpecError(
                f"{len(problems)} problem(s) in the draft", problems=problems, field="--hosts"
            )
        plan = plan_deployment(deployment, facts, hardware)
        if plan.fits:
            return recipe, plan
        serve = recipe.engine.serve
        update: dict[str, Any] = {}
        largest = plan.fit.largest_max_model_len_tokens
        if 0 < largest < plan.settings.max_model_len:
            update["max_model_len"] = largest
        top = plan.fit.max_gpu_memory_utilization
        if top is not None and plan.settings.gpu_memory_utilization > top:
            update["gpu_memory_utilization"] = top
        if not update:
            break
        engine = recipe.engine.model_copy(update={"serve": serve.model_copy(update=update)})
        recipe = recipe.model_copy(update={"engine": engine})
    raise PlanError(
        f"{facts.repo_id} does not fit on {len(cluster.nodes)} node(s) of {hardware.name}: "
        + "; ".join(plan.fit.reasons),
        field="--hosts",
        hint="; ".join(plan.fit.changes) or "add nodes",
    )


def _yaml(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=100)


def _header(plan: Plan, hardware: HardwareProfile) -> str:
    s = plan.settings
    return (
        f"# Written by `tandem init` for {plan.model} ({plan.model_source.split(':')[0]}).\n"
        f"# Planned on {hardware.name}, {plan.nodes} node(s), TP={s.tensor_parallel_size} "
        f"PP={s.pipeline_parallel_size}, max_model_len {s.max_model_len:,}: "
        f"{'FITS' if plan.fits else 'DOES NOT FIT'}, KV pool {plan.kv_pool_tokens:,} tokens.\n"
        "# Every field, its default and what it becomes: docs/recipes.md.\n"
    )


def _cluster_header(name: str, request: InitRequest) -> str:
    where = (
        f"{len(request.hosts)} ssh host(s)."
        if request.hosts
        else f"this machine, {request.ranks} node(s):\n# as root each a network namespace on "
        f"{ipaddress.ip_network(request.subnet)}, else all on loopback."
    )
    return (
        f"# Written by `tandem init` for {name}: {where}\n"
        "# Nodes in rank order: the first leads. Every field: docs/recipes.md.\n"
    )


def write(found: Draft, folder: Path) -> tuple[Path, Path]:
    """Write the recipe and the cluster into ``folder``; a file already there is refused.

    Raises:
        SpecError: either file exists.
    """
    recipe, cluster = folder / f"{found.name}.yaml", folder / f"{found.name}-cluster.yaml"
    taken = [str(p) for p in (recipe, cluster) if p.exists()]
    if taken:
        raise SpecError(
            f"{', '.join(taken)} already exist(s); tandem init replaces no file",
            field="--out",
            hint="pass another --out folder or NAME, or move the file away",
        )
    folder.mkdir(parents=True, exist_ok=True)
    files.write_text(recipe, found.recipe_yaml)
    files.write_text(cluster, found.cluster_yaml)
    return recipe, cluster
