"""What a folder on a node may be, when a recipe or an inventory names one.

A cache root (``model.cache_root``, ``HF_HOME``) and ``ssh.remote_dir`` reach three programs:
vLLM as a variable on the venv and local runtimes, docker as the source of ``--volume SRC:DST``
on the docker runtime, and a node's shell. One rule holds for all of them, so that a recipe
means the same on every runtime:

- the path is absolute, or ``~/...`` in the home of the user who runs the rank (the shell form
  of a command writes it ``"$HOME"/...``, ``tandem.render.shellwords``); a relative path would
  mean the rank's working folder under vLLM and the name of a volume under docker;
- it holds no ``:``, which docker's ``--volume`` takes for the end of the source (``/data:ro``
  would mount ``/data`` read-only, ``/a:b`` fails), and no line break or NUL.
"""

from __future__ import annotations

from tandem.errors import FieldFault


def is_node_path(path: str) -> bool:
    """True for a path the node can resolve: absolute, or in the node user's home (``~/``)."""
    return path == "~" or path.startswith(("/", "~/"))


def check_node_folder(value: str) -> str:
    """``value`` when it is a folder every runtime reads the same (see the module's rule).

    Raises:
        FieldFault: it is relative, or holds ``:`` or a control character; the hint says how.
    """
    faults = []
    if not is_node_path(value):
        faults.append(
            f"'{value}' is relative: vLLM would resolve it in the rank's working folder and "
            "docker would take it for the name of a volume"
        )
    if ":" in value:
        faults.append(
            f"'{value}' holds ':', which docker's --volume SRC:DST takes for the end of the path"
        )
    if any(ord(c) < 32 for c in value):
        faults.append(f"{value!r} holds a control character")
    if faults:
        raise FieldFault(
            "; ".join(faults),
            hint="write an absolute path on the node (e.g. /data/hf), or ~/... for the home of "
            "the user who runs the rank, without ':'",
        )
    return value


def check_env_folders(env: dict[str, str], names: tuple[str, ...]) -> dict[str, str]:
    """``env`` when each of ``names`` it sets is a folder by ``check_node_folder``'s rule."""
    for name in names:
        if name in env:
            try:
                check_node_folder(env[name])
            except FieldFault as exc:
                raise FieldFault(f"{name}: {exc}", hint=exc.hint) from None
    return env
