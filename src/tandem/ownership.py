"""What tandem may delete, overwrite and kill: the one gate every destructive step goes through.

tandem owns three kinds of thing, and touches nothing else (``docs/ownership.md`` says why):

- **a deployment's folders**, named by a deployment name that passes ``NAME_RULE`` (the
  recipe's own rule, so a name can never be ``..``, absolute or empty), below a root tandem
  chose: the state root, the cache root, an ssh node's ``remote_dir``. ``inside`` resolves a
  path (symlinks too) and refuses one that is not strictly below its root; ``remove_tree`` and
  ``remove_file`` call it first, so no caller can forget it.
- **output folders and files it was told to create**: a folder tandem creates carries the mark
  ``OUTPUT_MARK``; tandem writes into a new or empty folder or a marked one, and never replaces
  a file it was not told to replace (``output_folder``, ``output_file``; ``force`` is the user's
  explicit word).
- **processes of its own launches**: those carrying the launch id of the deployment's state, on
  the boot that launched them (``tandem.backends.processes``), never a pid alone.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path, PurePosixPath

from tandem.errors import NotOwned, SpecError

NAME_RULE = re.compile(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?")
"""A deployment name: a DNS label of at most 40 characters. It names folders, processes and
Kubernetes objects, so it can hold no ``/``, no ``.`` and nothing a shell or a label refuses."""
NAME_HINT = (
    "lower case letters, digits and dashes, at most 40 characters, starting and ending alphanumeric"
)
OUTPUT_MARK = ".tandem-output"
"""The file that marks a folder as one tandem created for its output."""


def name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a deployment name, or None when it is one."""
    if NAME_RULE.fullmatch(name):
        return None
    return f"'{name}' is not a deployment name: it must be {NAME_HINT}"


def check_name(name: str, *, field: str = "name") -> str:
    """``name`` when it is a deployment name.

    Raises:
        SpecError: it is not (``..``, an absolute path, upper case, too long...).
    """
    problem = name_problem(name)
    if problem:
        raise SpecError(
            problem, field=field, hint="name the deployment as `tandem status` lists it"
        )
    return name


def inside(path: Path, root: Path) -> Path:
    """``path`` with its folder resolved, when it lies strictly below ``root`` (resolved too).

    The last part is not followed: a link is itself what lies there (``remove_tree`` refuses
    one, ``remove_file`` removes the link, never its target).

    Raises:
        NotOwned: it is ``root`` itself or lies outside it (``..``, a linked folder, absolute).
    """
    base = root.resolve()
    resolved = path.parent.resolve() / path.name if path.name not in ("", ".", "..") else None
    if resolved is None or base not in resolved.parents:
        raise NotOwned(
            f"refusing to touch {path}: it is not inside {base}, which tandem owns",
            hint="this is a bug or a hand-made link; nothing was changed",
        )
    return resolved


def inside_remote(path: PurePosixPath, root: PurePosixPath) -> PurePosixPath:
    """The remote counterpart of ``inside`` for a path on another host: no ``..`` part, and
    strictly below ``root`` by its parts (the host resolves links; ``rm -rf`` does not follow
    them).

    Raises:
        NotOwned: it is not.
    """
    if ".." in path.parts or root not in path.parents:
        raise NotOwned(
            f"refusing to touch {path}: it is not inside {root}, which tandem owns",
            hint="this is a bug; nothing was changed",
        )
    return path


def remove_tree(path: Path, *, root: Path) -> bool:
    """Remove the folder ``path`` below ``root``; True when there was something to remove.

    Raises:
        NotOwned: ``path`` is not below ``root``.
        OSError: a file could not be removed.
    """
    target = inside(path, root)
    if target.is_symlink():
        raise NotOwned(
            f"refusing to remove {path}: it is a link (to {target.readlink()}), and tandem "
            "removes no folder it did not make",
            hint="remove the link by hand if you made it; nothing was changed",
        )
    if not target.exists():
        return False
    shutil.rmtree(target)
    return True


def remove_file(path: Path, *, root: Path) -> bool:
    """Remove the file ``path`` below ``root``; True when it existed."""
    target = inside(path, root)
    if not (target.exists() or target.is_symlink()):
        return False
    target.unlink()
    return True


def output_folder(path: Path, *, force: bool = False, option: str = "--out") -> Path:
    """``path`` as a folder tandem may write its output into, created (with the mark) if new.

    A folder may be written into when tandem creates it now, when it is empty, or when it holds
    the mark of an earlier tandem run (a resumed run, a report written again); with ``force``,
    whatever it holds.

    Raises:
        SpecError: it is a file, a parent is a file, it cannot be created, or it holds files
            tandem did not write.
    """
    check_output_folder(path, force=force, option=option)
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / OUTPUT_MARK).touch()
    except OSError as exc:
        raise SpecError(
            f"cannot create {path}: {exc.strerror or exc}",
            field=option,
            hint="name a folder whose parents are folders you can write",
        ) from exc
    return path


def check_output_folder(path: Path, *, force: bool = False, option: str = "--out") -> Path:
    """``output_folder``'s refusals without creating anything: for a command that checks its
    other input first and creates the folder when it writes its first result.

    Raises:
        SpecError: as ``output_folder``, except for a folder that cannot be created.
    """
    blocker = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocker is not None and blocker != path and not blocker.is_dir():
        raise SpecError(
            f"cannot create {path}: {blocker} is a file",
            field=option,
            hint="name a folder whose parents are folders you can write",
        )
    if path.exists() and not path.is_dir():
        raise SpecError(
            f"{path} is a file, not a folder", field=option, hint="name a folder that is new"
        )
    if path.is_dir() and not force and not (path / OUTPUT_MARK).exists():
        found = sorted(p.name for p in path.iterdir())
        if found:
            shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
            raise SpecError(
                f"{path} holds files tandem did not write ({shown})",
                field=option,
                hint=f"name a new folder for {option} (tandem creates it), or pass --force to "
                "write into this one",
            )
    return path


def output_file(
    path: Path, *, force: bool = False, option: str = "--out", force_flag: str | None = "--force"
) -> Path:
    """``path`` as a new file tandem may write, its folder created.

    ``force_flag`` is the option that would allow replacing it, if the command has one.

    Raises:
        SpecError: it exists (without ``force``), is a folder, or its folder cannot be made.
    """
    if path.is_dir():
        raise SpecError(f"{path} is a folder", field=option, hint="name a file that is new")
    if path.exists() and not force:
        raise SpecError(
            f"{path} exists, and tandem replaces no file it did not create",
            field=option,
            hint="name a new file"
            + (f", or pass {force_flag} to replace it" if force_flag else ""),
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(
            f"cannot create the folder of {path}: {exc.strerror or exc}",
            field=option,
            hint="name a file in a folder you can write",
        ) from exc
    return path
