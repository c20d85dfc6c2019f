"""The recipe: what to serve and how, independent of where.

A recipe names the model, the engine and its serve options, the environment every rank gets,
the two network planes, ports, shared memory and start-up timeouts. It says nothing about hosts:
those come from the cluster inventory (``tandem.spec.cluster``). Every model forbids unknown keys,
so a typo is an error that names the field instead of a setting silently ignored.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Collection, Sequence
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from tandem import ownership, wire
from tandem.errors import FieldFault
from tandem.redact import REDACTED, Redactor, is_secret, looks_like_secret_value
from tandem.spec.addresses import check_address
from tandem.spec.paths import check_env_folders, check_node_folder


def becomes(*names: str) -> dict[str, Any]:
    """``json_schema_extra`` of a field that becomes a ``vllm serve`` flag or a variable of
    each rank: the names it is written as, for the reference (``tandem.spec.reference``) and
    the JSON Schema an editor reads. ``engine.serve`` fields need none: each is the flag of its
    own name."""
    return {"becomes": list(names)}


Value = TypeVar("Value")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_VALUES: dict[str, Any] = {
    "additionalProperties": {"type": ["string", "number", "boolean"]},
    "propertyNames": {"pattern": f"^{ENV_NAME.pattern}$"},
}
"""The JSON Schema of an ``env`` mapping: names a shell can export (``check_env_names``), and
values where YAML's ``1`` and ``true`` are taken as the text ``"1"`` (``_env_str``), so an
editor must not flag them."""
EnvVars = Annotated[
    dict[str, str],
    BeforeValidator(lambda value: _env_strings(value)),
    AfterValidator(
        lambda env: check_env_folders(refuse_secrets(check_env_names(env)), FOLDER_VARS)
    ),
]
"""An ``env`` of a recipe or a node: every value text, no secret, its folders checked."""


def unless_null(check: Callable[[Value], Value]) -> AfterValidator:
    """``check`` as the validator of an optional field: null is no value to check, it leaves
    the setting to its default (``engine.image``, ``model.cache_root``, ``ssh.docker_gpus``)."""
    return AfterValidator(lambda value: value if value is None else check(value))


HostAddress = Annotated[str, AfterValidator(check_address)]
"""An address that others reach or that a server binds: an IP address or a host name."""
Port = Annotated[int, Field(ge=1, le=65535)]
"""A TCP port that tandem, vLLM or Kubernetes opens."""


class StrictModel(BaseModel):
    """Base of every model read from a user: unknown keys are rejected, and so is a yes/no
    where a number is meant (pydantic would read YAML's ``replicas: true`` as 1)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_yes_no_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _is_number(field.annotation):
            raise FieldFault(
                f"{str(value).lower()} is a yes/no, not a number",
                hint="write the number (e.g. 2), or leave the field out for its default",
            )
        return value


def _is_number(annotation: Any) -> bool:
    """``int``, ``float`` or either or None."""
    kinds = set(get_args(annotation)) - {type(None)} if get_args(annotation) else {annotation}
    return bool(kinds) and kinds <= {int, float}


class ModelSource(StrictModel):
    """``model:`` — which weights to serve and where they are cached."""

    model_config = ConfigDict(str_min_length=1)  # each becomes a word of a command

    repo_id: str = Field(
        json_schema_extra=becomes("vllm serve REPO_ID"),
        description="Hugging Face repo id, e.g. `deepseek-ai/DeepSeek-V4-Flash`. Also the name "
        "under which the weights sit in the cache (`hub/models--ORG--NAME/`).",
    )
    revision: str = Field(
        examples=["7a6d2b3c9f1e4a5b8c0d1e2f3a4b5c6d7e8f9a0b"],
        json_schema_extra=becomes("--revision"),
        default="main",
        description="Branch, tag or 40-hex commit of the repo. Pin a commit so that every node "
        "serves the same snapshot. Default `main`.",
    )
    served_name: str | None = Field(
        json_schema_extra=becomes("--served-model-name"),
        default=None,
        description="Name clients use in requests (`--served-model-name`). Default: the repo id.",
    )
    path: str | None = Field(
        examples=["/models/qwen3-8b"],
        json_schema_extra=becomes("vllm serve PATH"),
        default=None,
        description="Serve this local directory instead of the repo id (an absolute snapshot "
        "path as it is seen by the rank, e.g. inside the container). Default: serve by repo "
        "id, which vLLM resolves to the cached snapshot when offline.",
    )
    cache_root: Annotated[str | None, unless_null(check_node_folder)] = Field(
        json_schema_extra=becomes(wire.HF_HOME),
        default=None,
        description="The host's Hugging Face home (HF_HOME), holding `hub/`: an absolute path "
        "or `~/...`, without `:` (docker mounts it). Default: the standard "
        "`~/.cache/huggingface` of the user running the rank.",
    )
    offline: bool = Field(
        json_schema_extra=becomes(wire.HF_HUB_OFFLINE),
        default=True,
        description="Serve from the local cache only (HF_HUB_OFFLINE=1), so no rank can start "
        "a download mid-deployment. Default true.",
    )

    @field_validator("repo_id")
    @classmethod
    def _repo_id_shape(cls, value: str) -> str:
        """The Hub's rule (``huggingface_hub``'s ``validate_repo_id``): ORG/NAME, each part of
        letters, digits, ``-``, ``_`` and ``.``, starting and ending with a letter or digit, at
        most 96 characters, no ``--`` or ``..``. The id becomes a cache folder on every node
        (``models--ORG--NAME``) and a path in the rsync file list of a pull."""
        part = r"[A-Za-z0-9](?:[\w.\-]{0,94}[A-Za-z0-9])?"
        if not re.fullmatch(f"{part}/{part}", value) or "--" in value or ".." in value:
            raise FieldFault(
                f"{value!r} is not a Hugging Face repo id ORG/NAME",
                hint="write it as ORG/NAME, e.g. deepseek-ai/DeepSeek-V4-Flash: letters, "
                "digits, '-', '_' and '.', each part starting and ending with a letter or "
                "digit, no '--' or '..'",
            )
        return value

    @field_validator("revision")
    @classmethod
    def _git_ref(cls, value: str) -> str:
        """A branch, tag or commit as git allows it (``git check-ref-format``): the revision
        names a folder of the cache (``snapshots/``, ``refs/``) on every node and a path in
        the rsync file list, so ``..``, a leading ``/`` or ``-`` (an option to rsync) and
        control characters are refused."""
        parts = value.split("/")
        if (
            value.startswith(("-", "/"))
            or value.endswith(("/", ".", ".lock"))
            or ".." in value
            or "@{" in value
            or re.search(r"[\s~^:?*\[\\\x00-\x1f\x7f]", value)
            or any(not p or p.startswith(".") for p in parts)
        ):
            raise FieldFault(
                f"{value!r} is not a revision",
                hint="write a branch, a tag or a 40-hex commit (no '..', spaces, '~^:?*[\\', "
                "no leading '-' or '/')",
            )
        return value

    @field_validator("path")
    @classmethod
    def _absolute_path(cls, value: str | None) -> str | None:
        # vLLM takes a path it cannot find for a repo id, and expands no ~
        if value is not None and not value.startswith("/"):
            raise FieldFault(
                f"'{value}' is not an absolute path; vLLM would look for a repo of that name",
                hint="write the snapshot's absolute path as the rank sees it, or leave path out "
                "to serve by repo id",
            )
        return value

    @property
    def name_for_clients(self) -> str:
        """The model name clients send: the served name, or the repo id."""
        return self.served_name or self.repo_id


class ExecutorBackend(StrEnum):
    """How vLLM spreads one engine over several nodes.

    - ``mp``: vLLM's own multiprocessing executor with ``--nnodes``/``--node-rank``; no Ray.
    - ``ray``: a Ray cluster; needs at least as many GPUs per node as the local world size.
    """

    MP = "mp"
    RAY = "ray"


SPECULATIVE_KEYS = frozenset(
    [
        "enforce_eager",
        "num_speculative_tokens",
        "model",
        "method",
        "draft_tensor_parallel_size",
        "tensor_parallel_size",
        "quantization",
        "moe_backend",
        "attention_backend",
        "kv_cache_dtype",
        "max_model_len",
        "revision",
        "code_revision",
        "index_share_for_mtp_iteration",
        "disable_padded_drafter_batch",
        "disable_eagle_block_drop",
        "use_local_argmax_reduction",
        "use_heterogeneous_vocab",
        "prompt_lookup_max",
        "prompt_lookup_min",
        "parallel_drafting",
        "num_speculative_tokens_per_batch_size",
        "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor",
        "suffix_decoding_min_token_prob",
        "draft_load_config",
        "rejection_sample_method",
        "synthetic_acceptance_rates",
        "synthetic_acceptance_length",
        "enable_adaptive_verification",
        "draft_sample_method",
        "dspark_draft_topk",
    ]
)
"""Keys of vLLM's ``SpeculativeConfig`` (``vllm/config/speculative.py``, vLLM 0.32)."""
_SPECULATIVE_COUNTS = (
    "num_speculative_tokens",
    "draft_tensor_parallel_size",
    "max_model_len",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "dspark_draft_topk",
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
)
_SPECULATIVE_FLAGS = (
    "enforce_eager",
    "disable_padded_drafter_batch",
    "parallel_drafting",
    "use_local_argmax_reduction",
    "enable_adaptive_verification",
)


def check_speculative_config(value: dict[str, Any]) -> dict[str, Any]:
    """Refuse a ``--speculative-config`` vLLM would refuse at start-up, every fault at once."""
    faults = []
    unknown = sorted(str(k) for k in value if k not in SPECULATIVE_KEYS)
    if unknown:
        faults.append(
            f"unknown key(s) {', '.join(unknown)} (vLLM's SpeculativeConfig has "
            "method, num_speculative_tokens, model, draft_tensor_parallel_size, ...)"
        )
    method = value.get("method")
    if method is None:
        faults.append(
            "needs a 'method' key, e.g. {method: deepseek_mtp, num_speculative_tokens: 2}"
        )
    elif not isinstance(method, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", method):
        faults.append(
            f"method {method!r} is not a method name such as deepseek_mtp, mtp, "
            "eagle3, ngram, dspark"
        )
    for key in _SPECULATIVE_COUNTS:
        if key in value and (
            isinstance(value[key], bool) or not isinstance(value[key], int) or value[key] < 1
        ):
            faults.append(f"{key} must be a whole number of at least 1, not {value[key]!r}")
    for key in _SPECULATIVE_FLAGS:
        if key in value and not isinstance(value[key], bool):
            faults.append(f"{key} must be true or false, not {value[key]!r}")
    for key in ("model", "revision", "quantization", "kv_cache_dtype"):
        if key in value and (not isinstance(value[key], str) or not value[key]):
            faults.append(f"{key} must be a non-empty text, not {value[key]!r}")
    low, high = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
    if isinstance(low, int) and isinstance(high, int) and low > high:
        faults.append(f"prompt_lookup_min {low} is above prompt_lookup_max {high}")
    if faults:
        raise FieldFault(
            "; ".join(faults),
            hint="write it as vLLM's --speculative-config "
            "takes it, e.g. {method: deepseek_mtp, num_speculative_tokens: 2}",
        )
    return value


class ServeOptions(StrictModel):
    """``engine.serve:`` — typed `vllm serve` options, each rendered to its flag.

    A field left at ``null`` is not passed, so vLLM's own default applies. Anything without a
    field here goes into ``engine.extra_args``. Each field is the flag of its own name
    (``max_model_len`` -> ``--max-model-len``, ``argv``); the fields stand in the order the
    seed's command line writes their flags.
    """

    model_config = ConfigDict(str_min_length=1)  # `--kv-cache-dtype ''` is no setting

    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        description="`--tensor-parallel-size`: "
        "GPUs that split every layer. TP x PP = nodes x GPUs per node.",
    )
    pipeline_parallel_size: int = Field(
        default=1, ge=1, description="`--pipeline-parallel-size`: stages of consecutive layers."
    )
    kv_cache_dtype: str | None = Field(
        default=None,
        description="`--kv-cache-dtype`, e.g. `auto`, `fp8`, `fp8_ds_mla`, `nvfp4_ds_mla`.",
    )
    block_size: int | None = Field(
        default=None, ge=1, description="`--block-size`: tokens per KV cache block."
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="`--max-model-len`: longest prompt + output in tokens."
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, description="`--max-num-seqs`: sequences scheduled at once."
    )
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, description="`--max-num-batched-tokens`: tokens per scheduler step."
    )
    max_cudagraph_capture_size: int | None = Field(
        default=None,
        ge=1,
        description="`--max-cudagraph-capture-size`: largest batch captured as a CUDA graph.",
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="`--gpu-memory-utilization`: share of device memory vLLM may use, 0 < x <= 1.",
    )
    moe_backend: str | None = Field(
        default=None, description="`--moe-backend`, e.g. `flashinfer_b12x`."
    )
    tokenizer_mode: str | None = Field(
        default=None, description="`--tokenizer-mode`, e.g. `deepseek_v4`."
    )
    load_format: str | None = Field(
        default=None, description="`--load-format`, e.g. `safetensors`."
    )
    generation_config: str | None = Field(
        default=None,
        description="`--generation-config`, e.g. `vllm` to ignore the model's sampling defaults.",
    )

    speculative_config: Annotated[dict[str, Any] | None, unless_null(check_speculative_config)] = (
        Field(
            default=None,
            description="`--speculative-config` as a mapping, rendered as compact JSON, e.g. "
            "{method: deepseek_mtp, num_speculative_tokens: 2}.",
        )
    )
    enable_prefix_caching: bool | None = Field(
        default=None,
        description="`--enable-prefix-caching` (true) or `--no-enable-prefix-caching` (false).",
    )
    async_scheduling: bool | None = Field(
        default=None, description="`--async-scheduling` (true) or `--no-async-scheduling` (false)."
    )
    enable_chunked_prefill: bool | None = Field(
        default=None,
        description="`--enable-chunked-prefill` (true) or `--no-enable-chunked-prefill`.",
    )
    enable_flashinfer_autotune: bool | None = Field(
        default=None, description="`--enable-flashinfer-autotune`."
    )
    reasoning_parser: str | None = Field(
        default=None,
        description="`--reasoning-parser`, e.g. `deepseek_v4`: splits reasoning from the answer.",
    )
    tool_call_parser: str | None = Field(default=None, description="`--tool-call-parser`.")
    enable_auto_tool_choice: bool = Field(default=False, description="`--enable-auto-tool-choice`.")
    enable_expert_parallel: bool = Field(
        default=False,
        description="`--enable-expert-parallel`: "
        "shard MoE experts instead of splitting each expert.",
    )
    enforce_eager: bool = Field(
        default=False,
        description="`--enforce-eager`: no graph capture or "
        "torch.compile; slower decode, faster start.",
    )
    trust_remote_code: bool = Field(
        examples=[True], default=False, description="`--trust-remote-code`."
    )

    def argv(self, *, only: Collection[str] = (), skip: Collection[str] = ()) -> list[str]:
        """The set fields as ``vllm serve`` flags, in field order (``only``/``skip``: field
        names): a value as ``--flag VALUE``, a mapping as compact JSON, a plain boolean as the
        bare flag when true, a three-way one as ``--flag`` or ``--no-flag``."""
        args: list[str] = []
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if (only and name not in only) or name in skip or value is None:
                continue
            flag = serve_flag(name)
            if isinstance(value, bool):
                if value:
                    args.append(flag)
                elif info.annotation is not bool:  # bool | None: false is said, null is not
                    args.append("--no-" + flag.removeprefix("--"))
            elif isinstance(value, dict):
                args += [flag, json.dumps(value, separators=(",", ":"))]
            else:
                args += [flag, str(value)]
        return args


# Flags that the rank plan owns: a recipe that passes them through extra_args would fight it.
RESERVED_FLAGS = (
    wire.NNODES_FLAG,
    wire.NODE_RANK_FLAG,
    wire.MASTER_ADDR_FLAG,
    wire.MASTER_PORT_FLAG,
    wire.HEADLESS_FLAG,
    "--distributed-executor-backend",
    "--served-model-name",
    "--host",
    "--port",
)


def _typed_flags() -> dict[str, str]:
    """`vllm serve` flag -> the recipe field that sets it: every ``engine.serve`` field is the
    flag of its own name (``tensor_parallel_size`` -> ``--tensor-parallel-size``), booleans also
    as ``--no-...``; plus vLLM's short aliases and the model's own flags."""
    table = {}
    for name, info in ServeOptions.model_fields.items():
        flag = serve_flag(name)
        table[flag] = f"engine.serve.{name}"
        if info.annotation in (bool, bool | None):
            table["--no-" + flag.removeprefix("--")] = f"engine.serve.{name}"
    table |= {
        "-tp": "engine.serve.tensor_parallel_size",
        "-pp": "engine.serve.pipeline_parallel_size",
        "--model": "model.repo_id",
        "--revision": "model.revision",
        "--api-key": "VLLM_API_KEY in the environment of `tandem up`",
        "--hf-token": "HF_TOKEN in the environment of `tandem up`",
    }
    return table


def serve_flag(field: str) -> str:
    """The ``vllm serve`` flag of an ``engine.serve`` field: its name, dashed."""
    return "--" + field.replace("_", "-")


def flag_name(arg: str) -> str:
    """The flag of an argv item as vLLM's parser reads it: ``--max_model_len=5`` ->
    ``--max-model-len``."""
    name = arg.split("=", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


_IMAGE_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?"
)
_IMAGE_PATH = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_IMAGE_TAG = re.compile(r"\w[\w.-]{0,127}")
_DIGEST_HEX = {"sha256": 64, "sha512": 128}


def check_image(image: str) -> str:
    """``image`` when docker and Kubernetes read it as an image reference,
    ``[HOST[:PORT]/]PATH[:TAG][@sha256:HEX]`` as distribution's grammar has it; else FieldFault.

    A digest must be whole (64 hex digits for sha256): docker refuses a short one only on the
    nodes, after the preflight passed.
    """
    faults = []
    name, at, digest = image.partition("@")
    if at:
        algorithm, _, hex_digits = digest.partition(":")
        length = _DIGEST_HEX.get(algorithm)
        if length is None or not re.fullmatch(f"[0-9a-f]{{{length}}}", hex_digits):
            faults.append(
                f"digest '{digest}' must be sha256: and 64 lower-case hex digits "
                f"(it has {len(hex_digits)} after '{algorithm}:')"
            )
    slash, colon = name.rfind("/"), name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
        if not _IMAGE_TAG.fullmatch(tag):
            faults.append(f"tag '{tag}' is not a tag (letters, digits, '_', '.', '-')")
    parts = name.split("/")
    host = parts[0]
    if len(parts) > 1 and (
        any(c in host for c in ".:") or host == "localhost" or host.lower() != host
    ):
        if not _IMAGE_HOST.fullmatch(host):
            faults.append(f"registry '{host}' is not a host name with an optional port")
        parts = parts[1:]
    bad = [p for p in parts if not _IMAGE_PATH.fullmatch(p)]
    if bad:
        faults.append(
            f"'{'/'.join(parts)}' is not a repository: lower-case letters and digits, "
            "separated by '.', '_', '__', '-' or '/'"
        )
    if faults:
        raise FieldFault(
            f"'{image}' is not an image reference: " + "; ".join(faults),
            hint="write REPO[:TAG] or REPO@sha256:<64 hex digits> as `docker images --digests` "
            "shows it, e.g. vllm/vllm-openai:v0.32.0",
        )
    return image


Command = TypeVar("Command", str, list[str])
"""A field that becomes a command line: one text (``ssh.vllm_command``) or argv items."""


def refuse_inline_secrets(command: Command) -> Command:
    """Refuse a field that becomes a command line (``ssh.vllm_command``, ``kubernetes.kubectl``,
    ``engine.extra_args``...) when it holds a credential inline: a secret flag's value
    (``--token=X``, ``--client-secret X``), a secret variable set in it (``env HF_TOKEN=X
    vllm``), a URL with a password, a token's shape. Like ``env``, the file is printed,
    rendered and stored as plain text; the message shows the command with the secret hidden."""
    if isinstance(command, str):
        try:
            words = shlex.split(command)
        except ValueError:  # unbalanced quotes: judge the words as they are
            words = command.split()
    else:
        words = command
    safe = Redactor().argv(words)  # a flag's value by its name, every other word by its shape
    if safe == words:
        return command
    raise FieldFault(
        f"'{shlex.join(safe)}' holds a secret inline (shown as {REDACTED}), and this file is "
        "printed, rendered and stored as plain text",
        hint="remove it from the file, and export it in the environment of `tandem up` "
        "instead (HF_TOKEN and VLLM_API_KEY reach the ranks), or let the program read it "
        "from a file (kubectl: a kubeconfig, named by `kubernetes.kubeconfig`)",
    )


def check_extra_args(value: list[str]) -> list[str]:
    """Refuse a flag tandem renders itself: it would be passed twice, and vLLM takes the last
    one while tandem plans with the first; the message names the field to use instead."""
    faults = []
    for item in value:
        flag = flag_name(item)
        arg = flag if is_secret(flag) else item  # never echo a key given as --api-key=KEY
        if flag in RESERVED_FLAGS:
            faults.append(
                f"{arg} is set by tandem from the cluster and ports; remove it from extra_args"
            )
        elif flag in TYPED_FLAGS:
            faults.append(f"{arg} repeats a typed setting; set {TYPED_FLAGS[flag]} instead")
    if faults:
        raise FieldFault(
            "; ".join(faults),
            hint="remove these flags (and their values) "
            "from extra_args; vLLM would take the last of two, tandem plans "
            "with the typed field",
        )
    return value


class Engine(StrictModel):
    """``engine:`` — the vLLM that serves, and how it is asked to."""

    vllm_version: str | None = Field(
        default=None,
        description="The vLLM version every node must "
        "run, e.g. `0.32.0`. Checked on the nodes by `tandem check`.",
    )
    image: Annotated[str | None, unless_null(check_image)] = Field(
        json_schema_extra=becomes("docker run IMAGE", "image: (k8s)"),
        default=None,
        description="Container image for the docker and k8s "
        "runtimes, ideally pinned by digest (`repo@sha256:...`).",
    )
    executor: ExecutorBackend = Field(
        examples=["ray"],
        json_schema_extra=becomes("--distributed-executor-backend"),
        default=ExecutorBackend.MP,
        description="`mp` (default, no Ray) or `ray`.",
    )
    serve: ServeOptions = Field(default_factory=ServeOptions)
    extra_args: Annotated[
        list[str], AfterValidator(check_extra_args), AfterValidator(refuse_inline_secrets)
    ] = Field(
        json_schema_extra=becomes("vllm serve ARGS"),
        default_factory=list,
        description="Further `vllm serve` flags, "
        "passed verbatim after the typed ones, e.g. [--seed, '0'].",
    )


TYPED_FLAGS = _typed_flags()
"""The one table of `vllm serve` flags that a typed recipe field (or tandem itself) sets."""


class DataPlaneTransport(StrEnum):
    """What carries the tensor-parallel all-reduces.

    - ``ib``: NCCL over InfiniBand or RoCE (``NCCL_NET=IB``), e.g. ConnectX-7 on DGX Spark.
    - ``socket``: NCCL or Gloo over TCP; the only choice on CPU and on plain Ethernet.
    """

    IB = "ib"
    SOCKET = "socket"


class DataPlane(StrictModel):
    """``network.data_plane:`` — the fabric for the collectives, rendered to NCCL variables."""

    transport: DataPlaneTransport = Field(
        json_schema_extra=becomes(wire.NCCL_NET, wire.NCCL_IB_DISABLE),
        default=DataPlaneTransport.SOCKET,
        description="`ib` (NCCL over IB/RoCE) or `socket`.",
    )
    hcas: list[str] = Field(
        json_schema_extra=becomes(wire.NCCL_IB_HCA),
        default_factory=list,
        description="RDMA devices for NCCL_IB_HCA, e.g. "
        "both GB10 twins [rocep1s0f1, roceP2p1s0f1]. A node may override.",
    )
    merge_nics: bool | None = Field(
        json_schema_extra=becomes(wire.NCCL_IB_MERGE_NICS),
        default=None,
        description="NCCL_IB_MERGE_NICS: present the listed HCAs as one logical NIC.",
    )
    gid_index: int | Literal["auto"] = Field(
        json_schema_extra=becomes(wire.NCCL_IB_GID_INDEX),
        default="auto",
        description="NCCL_IB_GID_INDEX, or "
        "`auto` to leave it unset and let `tandem check` "
        "resolve the RoCE v2 GID per HCA.",
    )
    roce_version: Literal[1, 2] | None = Field(
        json_schema_extra=becomes(wire.NCCL_IB_ROCE_VERSION_NUM),
        default=None,
        description="NCCL_IB_ROCE_VERSION_NUM.",
    )
    addr_family: Literal["AF_INET", "AF_INET6"] | None = Field(
        json_schema_extra=becomes(wire.NCCL_IB_ADDR_FAMILY),
        default=None,
        description="NCCL_IB_ADDR_FAMILY.",
    )
    cross_nic: bool | None = Field(
        json_schema_extra=becomes(wire.NCCL_CROSS_NIC), default=None, description="NCCL_CROSS_NIC."
    )

    @field_validator("gid_index", mode="before")
    @classmethod
    def _gid_shape(cls, value: Any) -> Any:
        if value == "auto" or (
            isinstance(value, int) and not isinstance(value, bool) and value >= 0
        ):
            return value
        raise ValueError(f"'{value}' is neither a GID index (a whole number such as 3) nor auto")

    @model_validator(mode="after")
    def _ib_needs_hcas(self) -> DataPlane:
        if self.transport is DataPlaneTransport.SOCKET and self.hcas:
            raise ValueError(
                "hcas are only used with transport: ib; set transport: ib or drop hcas"
            )
        return self


class ControlPlane(StrictModel):
    """``network.control_plane:`` — the interface for rendezvous, Gloo and NCCL/TP sockets."""

    interface: str | None = Field(
        json_schema_extra=becomes(*wire.CONTROL_PLANE_VARS),
        default=None,
        description="Interface pinned as "
        "NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME and TP_SOCKET_IFNAME, "
        "e.g. `enP7s7`. A node's `control_plane_interface` overrides.",
    )


class Network(StrictModel):
    """``network:`` — the two planes. Pin both, or the job wires up on the wrong NIC and hangs."""

    data_plane: DataPlane = Field(default_factory=DataPlane)
    control_plane: ControlPlane = Field(default_factory=ControlPlane)


class Ports(StrictModel):
    """``ports:`` — where the leader serves and where the ranks meet."""

    api: Port = Field(
        json_schema_extra=becomes("--port"),
        default=8000,
        description="OpenAI API port on the leader.",
    )
    master: Port = Field(
        json_schema_extra=becomes(wire.MASTER_PORT_FLAG),
        default=29501,
        description="Rendezvous port (`--master-port`) on the leader.",
    )

    @model_validator(mode="after")
    def _distinct(self) -> Ports:
        if self.api == self.master:
            raise ValueError(
                f"api and master are both {self.api}; give the rendezvous its own port"
            )
        return self


class Timeouts(StrictModel):
    """``timeouts:`` — how long start-up may take before tandem gives up and says why."""

    startup_s: float = Field(
        default=900,
        gt=0,
        description="From the first rank's launch to a "
        "real completion, in seconds. Seed 000's cold start is 6-7 min.",
    )
    request_s: float = Field(
        examples=[300], default=120, gt=0, description="For the readiness completion, s."
    )


class Watch(StrictModel):
    """``watch:`` — what ``tandem watch report`` calls a good soak, and where watch exports.

    Each ``max_*`` is the largest value that still passes (``null``: shown, not checked). The
    defaults are seed 000's soak: no thermal throttling, no OOM, no restart, no downtime.
    """

    interval_s: float = Field(
        examples=[10],
        default=5.0,
        gt=0,
        description="Seconds between two samples of "
        "`tandem watch`. A vLLM /metrics scrape stalls its API server "
        "~35 ms, so keep it at seconds. Default 5.",
    )
    max_temperature_c: float | None = Field(
        examples=[80],
        default=85.0,
        gt=0,
        description="Peak GPU temperature, degrees Celsius. Seed 000 never exceeded 65.",
    )
    max_throttle_events: int | None = Field(
        examples=[2],
        default=0,
        ge=0,
        description="Times a GPU entered thermal or hardware slowdown. Default 0.",
    )
    max_memory_used_gib: float | None = Field(
        examples=[120],
        default=None,
        ge=0,
        description="Highest host "
        "memory in use (MemTotal - MemAvailable) on any "
        "node, GiB; the unified memory of a GB10.",
    )
    max_memory_drift_gib: float | None = Field(
        examples=[2],
        default=None,
        ge=0,
        description="Largest change "
        "of a node's memory in use from the first to the "
        "last sample, GiB (a leak shows as drift).",
    )
    max_oom_events: int | None = Field(
        examples=[None],
        default=0,
        ge=0,
        description="Processes the kernel's OOM killer killed on any node (/proc/vmstat oom_kill).",
    )
    max_restarts: int | None = Field(
        examples=[1],
        default=0,
        ge=0,
        description="Group restarts by `tandem supervise` (events.log) during the watch.",
    )
    max_down_samples: int | None = Field(
        examples=[3],
        default=0,
        ge=0,
        description="Samples whose health verdict was `down` (no rank serving, or the "
        "leader's API gone). Default 0: a soak with downtime fails.",
    )
    max_error_rate: float | None = Field(
        examples=[0.001],
        default=0.01,
        ge=0,
        le=1,
        description="Requests that "
        "finished with an error or abort, as a share of all "
        "finished ones (vLLM's finished_reason).",
    )
    metrics_port: Port = Field(
        examples=[9479],
        default=9478,
        description="Port of `tandem watch --serve-metrics` in the rendered Prometheus config.",
    )


VLLM_ROUTER_VERSION = "0.1.17"
"""The ``vllm-router`` (PyPI) that tandem drives: its flags and admin API as read from it."""


class RouterPolicy(StrEnum):
    """How vLLM's router picks a group for a request (``vllm-router --policy``).

    ``kv_aware`` is left out: it needs every group's KV events over ZeroMQ
    (``--kv-event-source``), which tandem does not wire.
    """

    CACHE_AWARE = "cache_aware"
    ROUND_ROBIN = "round_robin"
    POWER_OF_TWO = "power_of_two"
    CONSISTENT_HASH = "consistent_hash"
    RANDOM = "random"
    STICKY_LEAST_LOADED = "sticky_least_loaded"


class Router(StrictModel):
    """``router:`` — the front door of a recipe with ``replicas`` > 1: vLLM's own router
    (PyPI ``vllm-router``) in front of every group's leader; tandem's health verdict, not the
    router's ``/health`` poll, decides which groups are its members."""

    version: str = Field(
        examples=["0.1.17"],
        default=VLLM_ROUTER_VERSION,
        description="The vllm-router release the deployment needs; `up` refuses another one.",
    )
    policy: RouterPolicy = Field(
        examples=["round_robin"],
        default=RouterPolicy.CACHE_AWARE,
        description="`cache_aware` (default: requests sharing a prefix go to the group that "
        "holds it), `round_robin`, `power_of_two`, `consistent_hash`, `random`, "
        "`sticky_least_loaded`.",
    )
    port: Port = Field(
        examples=[9100],
        default=8100,
        description="Where the router serves the OpenAI API.",
    )
    metrics_port: Port = Field(
        examples=[9190],
        default=8190,
        description="The router's own Prometheus `/metrics`.",
    )
    image: Annotated[str | None, unless_null(check_image)] = Field(
        examples=["registry.example.com/vllm-router:0.1.17"],
        default=None,
        description="Kubernetes only: the image of the router's Deployment, holding "
        "`vllm-router` of `version` (none is published).",
    )

    def argv(
        self, *, host: str, program: Sequence[str] = ("vllm-router",), discovery: Sequence[str] = ()
    ) -> list[str]:
        """The router's command line, the one spelling of its flags: serving the API on
        ``host:port``, its own metrics on ``metrics_port``. Started empty, tandem adds the groups
        that answered (``tandem.backends.router``); on Kubernetes ``discovery`` holds the flags
        of its own service discovery instead (``tandem.render.kubernetes``)."""
        return [
            *program,
            "--host",
            host,
            "--port",
            str(self.port),
            "--policy",
            self.policy.value,
            *discovery,
            "--prometheus-host",
            host,
            "--prometheus-port",
            str(self.metrics_port),
        ]


_SHM = re.compile(r"^(\d+)([kmgKMG])?[iI]?[bB]?$")


class Recipe(StrictModel):
    """A deployment recipe: everything about what is served, nothing about where."""

    name: str = Field(
        description="Deployment name; names processes, state and k8s objects. "
        "Lower case letters, digits and dashes."
    )
    description: str = Field(default="", description="One line for listings.")
    model: ModelSource
    engine: Engine = Field(default_factory=Engine)
    env: EnvVars = Field(
        json_schema_extra=becomes("each NAME=VALUE") | ENV_VALUES,
        default_factory=dict,
        description="Variables every rank gets, after the network planes' (a node may override).",
    )
    network: Network = Field(default_factory=Network)
    ports: Ports = Field(default_factory=Ports)
    host: HostAddress = Field(
        examples=["127.0.0.1"],
        json_schema_extra=becomes("--host"),
        default="0.0.0.0",
        description="Address the leader's API binds (`--host`).",
    )
    shm_size: str = Field(
        json_schema_extra=becomes("docker --shm-size", "/dev/shm (k8s)"),
        default="16g",
        description="Shared memory for each rank "
        "(docker `--shm-size`, k8s memory emptyDir), e.g. `64g`.",
    )
    timeouts: Timeouts = Field(default_factory=Timeouts)
    watch: Watch = Field(default_factory=Watch)
    replicas: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Independent groups of TP x PP, each on its own nodes of the cluster (group "
        "g on nodes g*k .. g*k+k-1, k = nodes / replicas), behind `router`. Default 1.",
    )
    router: Router = Field(default_factory=Router)

    @field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        problem = ownership.name_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("shm_size")
    @classmethod
    def _shm_shape(cls, value: str) -> str:
        if not _SHM.match(str(value)):
            raise ValueError(f"'{value}' is not a size; write e.g. 64g or 512m")
        return str(value)

    @model_validator(mode="after")
    def _ports_apart(self) -> Recipe:
        """Each port tandem opens beside the engine's has its own number, reported at its field
        (so the loader drops it and checks the rest)."""
        faults = []
        clash = port_clash(self.watch.metrics_port, self.ports)
        if clash:
            faults.append((("watch", "metrics_port"), self.watch.metrics_port, clash, "e.g. 9478"))
        if self.replicas > 1:
            taken = {
                self.ports.api: "the API port (ports.api)",
                self.ports.master: "the rendezvous port (ports.master)",
                self.watch.metrics_port: "tandem's metrics port (watch.metrics_port)",
            }
            for field in ("port", "metrics_port"):
                port = getattr(self.router, field)
                if port in taken:
                    faults.append(
                        (("router", field), port, f"{port} is also {taken[port]}", "e.g. 8100")
                    )
                taken.setdefault(port, f"the router's {field.replace('_', ' ')} (router.{field})")
        if not faults:
            return self
        details = [
            fault_at(loc, value, message, f"give it a port of its own, {example}")
            for loc, value, message, example in faults
        ]
        raise ValidationError.from_exception_data(type(self).__name__, details)

    @property
    def shm_bytes(self) -> int:
        """``shm_size`` in bytes (binary units: 64g = 64 GiB)."""
        number, unit = _SHM.match(self.shm_size).groups()  # type: ignore[union-attr]
        return (
            int(number) * 1024 ** {None: 0, "k": 1, "m": 2, "g": 3}[unit.lower() if unit else None]
        )


def fault_at(loc: tuple[str | int, ...], value: Any, message: str, hint: str) -> InitErrorDetails:
    """A fault across fields (ports that clash, nodes that repeat) at the field it concerns, so
    the loader drops that field; the hint rides in the context, where it reads a FieldFault's."""
    error = PydanticCustomError("value_error", "{message}", {"message": message, "hint": hint})
    return InitErrorDetails(type=error, loc=loc, input=value)


FOLDER_VARS = (wire.HF_HOME,)
"""Variables of an ``env`` that name a folder on the node (docker mounts HF_HOME)."""


def port_clash(port: int, ports: Ports) -> str | None:
    """Why ``port`` cannot serve tandem's metrics beside the deployment's ``ports``, or None.

    The rule of ``watch.metrics_port`` and of ``tandem watch --serve-metrics`` alike.
    """
    for field, what in (("api", "API"), ("master", "rendezvous")):
        if port == getattr(ports, field):
            return f"{port} is also the {what} port (ports.{field})"
    return None


def check_env_names(env: dict[str, str]) -> dict[str, str]:
    """Refuse a name a shell cannot export: a rank gets its env from ``env NAME=value`` (ssh),
    ``docker run --env`` or a pod's env, and a key like ``--foo`` reached ``docker run`` as
    ``--env --foo=bar``."""
    if bad := [repr(k) for k in env if not ENV_NAME.fullmatch(k)]:
        raise FieldFault(
            f"{', '.join(bad)} is not a variable name",
            hint="use letters, digits and _, not starting with a digit (e.g. VLLM_LOGGING_LEVEL)",
        )
    return env


def refuse_secrets(env: dict[str, str]) -> dict[str, str]:
    """Refuse secret-looking variables: a recipe or cluster is plain text that tandem prints,
    renders and stores, so a credential written there would leave the machine in the clear."""
    found = [
        f"{k} ({'its name' if is_secret(k) else 'its value'})"
        for k, v in env.items()
        if is_secret(k) or looks_like_secret_value(v)
    ]
    if found:
        raise FieldFault(
            f"{', '.join(found)} looks like a secret, and this file is printed, rendered and "
            "stored as plain text",
            hint="remove it and export it in the environment of `tandem up` instead (local "
            "ranks inherit it; VLLM_API_KEY reaches the leader, on k8s as a Secret), put "
            "it in a Kubernetes Secret, or point at a file (e.g. HF_TOKEN_PATH)",
        )
    return env


def _env_str(value: Any) -> Any:
    """YAML reads `1` and `true` as numbers and booleans; env values are always text."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return str(value)
    return value


def _env_strings(value: Any) -> Any:
    """An ``env`` mapping with each value as text (``_env_str``); anything else as it is."""
    return {k: _env_str(v) for k, v in value.items()} if isinstance(value, dict) else value
