"""What tandem may delete, overwrite and kill: the one gate every destructive step goes through.

tandem owns three kinds of thing, and touches nothing else (``docs/ownership.md`` says why):

- **a deployment's folders**, named by a deployment name that passes ``NAME_RULE`` (the
  recipe's own rule, so a name can never be ``..``, absolute or empty), below a root tandem
  chose: the state root, the cache root, an ssh node's ``remote_dir``. ``inside`` resolves a
  path (symlinks too) and refuses one that is not strictly below its root; ``remove_tree`` and
  ``remove_file`` call it first, so no caller can forget it.
- **output folders and files it was told to create**: a folder tandem creates carries the mark
  ``OUTPUT_MARK``, which names the run it holds (the command and the options that identify the
  run, ``RunMark``); tandem writes into a new or empty folder, or one whose mark is the same
  run's (``claim_output``: continued with ``--resume``), and never replaces a file it was not
  told to replace (``output_folder``, ``output_file``; ``force`` is the user's explicit word).
- **processes of its own launches**: those carrying the launch id of the deployment's state, on
  the boot that launched them (``tandem.backends.processes``), never a pid alone.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ValidationError

from tandem import files
from tandem.errors import NotOwned, Problem, SpecError
from tandem.redact import Redactor
from tandem.screen import shown

NAME_RULE = re.compile(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?")
"""A deployment name: a DNS label of at most 40 characters. It names folders, processes and
Kubernetes objects, so it can hold no ``/``, no ``.`` and nothing a shell or a label refuses."""
NAME_HINT = (
    "lower case letters, digits and dashes, at most 40 characters, starting and ending alphanumeric"
)
OUTPUT_MARK = ".tandem-output"
"""The file that marks a folder as one tandem created for its output: a ``RunMark`` (an empty
file, written before marks named their run, marks a folder of some earlier tandem run)."""


def name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a deployment name, or None when it is one."""
    if NAME_RULE.fullmatch(name):
        return None
    return f"'{shown(name, 60)}' is not a deployment name: it must be {NAME_HINT}"


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

    For output that is no run of its own (an upgrade's gate folders); a command's run claims
    its folder with ``claim_output``, which also refuses another run's folder. A folder may be
    written into when tandem creates it now, when it is empty, or when it holds the mark of an
    earlier tandem run; with ``force``, whatever it holds.

    Raises:
        SpecError: it is a file, a parent is a file, it cannot be created, or it holds files
            tandem did not write.
    """
    _check_place(path, option)
    if path.is_dir() and not force and not (path / OUTPUT_MARK).exists():
        _refuse_foreign(path, _entries(path), option)
    return _make(path, None, option)


class RunMark(BaseModel):
    """What ``OUTPUT_MARK`` says: the command whose run the folder holds, and the options that
    identify that run (a bench run's workload and endpoint, a smoke run's server and model)."""

    schema_version: int = 1
    command: str
    run: dict[str, Any]


@dataclass(frozen=True)
class RunKind:
    """A command that writes a run into an ``--out`` folder.

    ``resume_flag``: the flag that continues an earlier run of the same options (None: the
    command continues it by itself, as ``watch run`` does, or writes it again, as ``render``).
    ``is_own``: whether a folder without a run mark holds this command's files (a folder
    written before marks named their run, accepted on ``--resume``).
    """

    command: str
    noun: str
    resume_flag: str | None = "--resume"
    is_own: Callable[[Path], bool] = lambda folder: False


@dataclass(frozen=True)
class Claim:
    """A folder a run may write into, checked and not yet created (``make`` creates it).

    ``continues``: it holds an earlier run of the same command and options, which the run
    continues (``--resume``), or writes again.
    """

    path: Path
    mark: RunMark
    continues: bool
    option: str = "--out"

    def make(self) -> Path:
        """Create the folder (and its parents) and write its mark; returns the path.

        Raises:
            SpecError: it cannot be created.
        """
        return _make(self.path, self.mark, self.option)


def claim_output(
    path: Path,
    kind: RunKind,
    run: dict[str, Any],
    *,
    resume: bool = False,
    force: bool = False,
    option: str = "--out",
    flag_of: Callable[[str], str] = lambda name: name,
) -> Claim:
    """``path`` as the folder of one run of ``kind`` identified by ``run`` (its options), checked
    before anything is created or sent.

    Accepted: a new folder; an empty one (or one holding only a mark); one whose mark names
    the same command and options, with ``resume`` (or for a kind without a resume flag); with
    ``resume``, one an earlier tandem wrote without a mark whose files are ``kind``'s own; with
    ``force``, anything. ``flag_of`` names an option in a message (``concurrency`` ->
    ``--concurrency``).

    Raises:
        SpecError: it is a file or under one; it holds another command's run, a run of other
            options, the same run without ``resume``, or files tandem did not write. The
            message names the folder, what it holds and the fix.
    """
    _check_place(path, option)
    mark = RunMark(command=kind.command, run=_as_written(run))
    found = _entries(path) if path.is_dir() else []
    if not found or force:
        return Claim(path, mark, continues=bool(found) and resume, option=option)
    earlier = _read_mark(path)
    if earlier is None or not earlier.command:
        if not kind.is_own(path):
            if earlier is None:
                _refuse_foreign(path, found, option)
            raise SpecError(
                f"{path} holds the files of another tandem run ({_listed(found)})",
                field=option,
                hint=f"name a new folder for {option}, or pass --force to write into this one",
            )
    elif earlier.command != kind.command:
        raise SpecError(
            f"{path} holds a run of `tandem {earlier.command}` ({_brief(earlier.run)}); "
            f"{kind.noun} goes into a folder of its own",
            field=option,
            hint=f"name a new folder for {option}, or pass --force to write into this one",
        )
    elif earlier.run != mark.run:
        _refuse_other_options(path, kind, earlier.run, mark.run, option, flag_of)
    if kind.resume_flag and not resume:
        said = (
            _brief(earlier.run)
            if earlier is not None and earlier.command
            else "written by an earlier tandem, which recorded no options"
        )
        raise SpecError(
            f"{path} holds an earlier run of `tandem {kind.command}` ({said})",
            field=option,
            hint=f"pass {kind.resume_flag} to continue it, or name a new folder for {option}",
        )
    return Claim(path, mark, continues=True, option=option)


def _refuse_other_options(
    path: Path,
    kind: RunKind,
    theirs: dict[str, Any],
    ours: dict[str, Any],
    option: str,
    flag_of: Callable[[str], str],
) -> None:
    changed = sorted(name for name in set(theirs) | set(ours) if theirs.get(name) != ours.get(name))
    again = (
        f"repeat the first command's options with {kind.resume_flag} to continue it, "
        if kind.resume_flag
        else ""
    )
    raise SpecError(
        f"{path} holds a run of `tandem {kind.command}` with other options",
        field=option,
        problems=[
            Problem(
                flag_of(name),
                f"the run there has {_value(theirs.get(name))}, this one {_value(ours.get(name))}",
            )
            for name in changed
        ],
        hint=again + f"name a new folder for {option}, or pass --force to write into this one",
    )


def _check_place(path: Path, option: str) -> None:
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


def _entries(path: Path) -> list[str]:
    """What ``path`` holds besides its mark, by name."""
    return sorted(p.name for p in path.iterdir() if p.name != OUTPUT_MARK)


def _refuse_foreign(path: Path, found: list[str], option: str) -> None:
    if found:
        raise SpecError(
            f"{path} holds files tandem did not write ({_listed(found)})",
            field=option,
            hint=f"name a new folder for {option} (tandem creates it), or pass --force to "
            "write into this one",
        )


def _listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _read_mark(path: Path) -> RunMark | None:
    """The folder's mark; one without a command when it names no run (an earlier tandem's
    empty mark, or one that cannot be read); None when there is none."""
    mark = path / OUTPUT_MARK
    if not mark.is_file():
        return None
    try:
        return RunMark.model_validate_json(mark.read_bytes())
    except (OSError, ValidationError):
        return RunMark(command="", run={})


def _as_written(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` as its mark holds it: plain JSON, redacted as every file is, so a run compares
    equal to the mark it wrote."""
    written = Redactor.for_caller().data(json.loads(json.dumps(run, default=str)), names=False)
    return written if isinstance(written, dict) else {}


def _value(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else f"{text[:57]}... ({len(text)} characters)"


def _brief(run: dict[str, Any]) -> str:
    shown = [f"{k} {_value(v)}" for k, v in run.items() if v not in (None, [], {}, "")][:3]
    return ", ".join(shown) or "no options recorded"


def _make(path: Path, mark: RunMark | None, option: str) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
        if mark is None:
            (path / OUTPUT_MARK).touch()
        else:
            files.write_json(path / OUTPUT_MARK, mark)
    except OSError as exc:
        raise SpecError(
            f"cannot create {path}: {exc.strerror or exc}",
            field=option,
            hint="name a folder whose parents are folders you can write",
        ) from exc
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
