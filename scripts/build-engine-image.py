"""Build the root filesystem of a vLLM-CPU engine image from this machine's engine venv, once.

A test-bed concession (README, "On SSH hosts"): no image registry can be reached from the test
machines, so the docker runtime's tests cannot pull a vLLM image. This builds the smallest
honest stand-in instead, a tarball for ``docker import``, holding exactly:

- the base Python the venv was made from (``sys.base_prefix``, without its test suite, its
  own site-packages, IDLE and Tk);
- the venv's ``bin/python*``, ``pyvenv.cfg`` and the files of the engine's dependency closure:
  ``vllm-cpu`` and every distribution its requirements name, transitively, as recorded in each
  one's ``RECORD`` (not tandem, not its dev or Kubernetes tools), plus the ``vllm`` metadata
  alias ``scripts/install-vllm-cpu.sh`` writes; without Triton (1 GB, a third of the image,
  moved by every ``tandem sync`` in the tests): it has no CPU backend, so vLLM-CPU turns it off
  at start (``vllm/triton_utils/importing.py``: "Triton is installed, but doesn't include CPU
  backend. Disabling Triton.") and serves the same without it;
- the C++ compiler: vLLM-CPU compiles kernels with torch Inductor at the first request, even
  with ``enforce_eager`` (``InvalidCxxCompiler: No working C++ compiler found`` without it),
  as vLLM's own CPU image installs g++: this machine's ``g++`` package and its installed
  dependency closure (``dpkg -L``, without documentation);
- every system library those binaries load (``ldd`` of each ELF file), the loader, its cache,
  ``/bin/sh``, ``lscpu`` (vLLM's CPU platform asks it for the topology), ``openssl`` (Inductor
  hashes its precompiled header with ``openssl sha512``), and an
  ``/etc/passwd`` with root (torch asks for the user name) and a ``/tmp``.

Paths stay where they are on this machine, so the venv's scripts find their interpreter. Nothing
is kept on disk: the tarball goes to stdout, straight into ``docker import -`` (a kept 3.7 GB
tarball beside the daemon's unpacked copy and the second host's load once filled CI's disk).
The image's name carries a key of the venv's path, the Python version and the closure's
distributions and versions, so a daemon that holds an image of that name is not fed again.

    .venv/bin/python scripts/build-engine-image.py name   JSON: {"name", "changes", "bytes"}
    .venv/bin/python scripts/build-engine-image.py tar    the root filesystem, a tar on stdout

``changes`` are the ``docker import --change`` lines (PATH, LANG); ``bytes``, the files' size
(what a daemon's disk holds once the image is in, and again while it goes in).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT_DIST = "vllm-cpu"
UNUSED_ON_CPU = frozenset({"triton"})
"""Distributions of the closure that vLLM-CPU never loads (module docstring)."""
BASE_SKIP = ("test", "site-packages", "idlelib", "tkinter", "turtledemo", "lib2to3/tests")
EXTRA_PROGRAMS = ("/bin/sh", "/usr/bin/lscpu", "/usr/bin/openssl")
COMPILER_PACKAGE = "g++"
CHANGES = [f"ENV PATH={sys.prefix}/bin:/usr/local/bin:/usr/bin:/bin", "ENV LANG=C.UTF-8"]
"""The ``docker import --change`` lines: the venv's ``bin`` first on PATH, a UTF-8 locale."""
DOC_FOLDERS = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/locale/")


def _package(name: str) -> str | None:
    """The ``Depends`` and ``Pre-Depends`` of an installed Debian package, None if absent."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}|${Depends},${Pre-Depends}", name],
        capture_output=True,
        text=True,
    )
    status, _, depends = out.stdout.partition("|")
    return depends if out.returncode == 0 and "installed" in status.split() else None


def package_files(root: str) -> set[Path]:
    """The files of an installed package and of every installed package it depends on."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        depends = None if name in seen else _package(name)
        if depends is None:
            continue
        seen.add(name)
        for clause in filter(None, (c.strip() for c in depends.split(","))):
            for choice in clause.split("|"):  # the first alternative that is installed
                candidate = re.split(r"[ (:]", choice.strip())[0]
                if _package(candidate) is not None:
                    todo.append(candidate)
                    break
    listed = subprocess.run(["dpkg", "-L", *sorted(seen)], capture_output=True, text=True)
    return {
        Path(line)
        for line in listed.stdout.splitlines()
        if line.startswith("/")
        and not line.startswith(DOC_FOLDERS)
        and (Path(line).is_symlink() or Path(line).is_file())
    }


def closure(root: str) -> dict[str, Distribution]:
    """Every installed distribution ``root`` needs, with the extras its requirements ask for
    (``fastapi[standard]`` brings ``uvicorn[standard]``, which brings ``uvloop``)."""
    found: dict[str, Distribution] = {}
    extras: dict[str, set[str]] = {}
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while todo:
        raw, wanted = todo.pop()
        name = canonicalize_name(raw)
        if name in UNUSED_ON_CPU or (name in found and wanted <= extras[name]):
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:  # removed on purpose (torchvision...; install-vllm-cpu.sh)
            continue
        found[name] = dist
        extras.setdefault(name, set()).update(wanted)
        for line in dist.requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in ("", *extras[name])):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return found


def venv_files(dists: dict[str, Distribution]) -> set[Path]:
    """The closure's recorded files, the vllm metadata alias, and the venv's interpreter."""
    files: set[Path] = set()
    for dist in dists.values():
        files.update(Path(str(dist.locate_file(f))).resolve() for f in dist.files or [])
    purelib = Path(sysconfig.get_paths()["purelib"])
    files.update(purelib.glob("vllm-*.dist-info/*"))  # the alias: its dist has no RECORD
    prefix = Path(sys.prefix)
    files.update(prefix.glob("bin/python*"))
    files.add(prefix / "pyvenv.cfg")
    return {f for f in files if f.exists() or f.is_symlink()}


def base_files() -> set[Path]:
    """The base interpreter's tree, without what serving never imports."""
    base = Path(sys.base_prefix)
    stdlib = base / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    skip = [stdlib / s for s in BASE_SKIP]
    out: set[Path] = set()
    for folder, dirs, names in os.walk(base):
        here = Path(folder)
        dirs[:] = [d for d in dirs if here / d not in skip]
        out.update(here / n for n in names)
        out.update(here / d for d in dirs if (here / d).is_symlink())
    return out


def is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(4) == b"\x7fELF"
    except OSError:
        return False


def system_libraries(files: set[Path]) -> set[Path]:
    """Every library outside ``files`` that an ELF file among them (or a program) loads."""
    libraries: set[Path] = set()
    elves = [f for f in files if f.is_file() and not f.is_symlink() and is_elf(f)]
    elves += [Path(p) for p in EXTRA_PROGRAMS]
    for start in range(0, len(elves), 200):
        out = subprocess.run(
            ["ldd", *map(str, elves[start : start + 200])], capture_output=True, text=True
        ).stdout
        for line in out.splitlines():  # "libz.so.1 => /lib/.../libz.so.1 (0x...)" or "/lib64/ld..."
            words = line.split()
            found = (
                words[words.index("=>") + 1] if "=>" in words[:-1] else words[0] if words else ""
            )
            if found.startswith("/"):
                libraries.add(Path(os.path.normpath(found)))
    return {p for p in libraries if p.exists() and p not in files}


def with_link_targets(paths: set[Path]) -> set[Path]:
    """Each path written through real folders only, plus the links on its way.

    A tar entry below a symlinked folder (``/bin/sh`` with ``/bin -> usr/bin``) cannot be
    unpacked, so every entry is named by its folder's real path, and the folder links
    (``/bin``, ``/lib64``) and file links (``sh -> dash``) come along as their own entries.
    """

    def canonical(path: Path) -> Path:
        return Path(os.path.realpath(path.parent)) / path.name

    out: set[Path] = set()
    for path in paths:
        current = canonical(path)
        for _ in range(20):
            out.add(current)
            if not current.is_symlink():
                break
            current = canonical(current.parent / os.readlink(current))
        out.update(parent for parent in path.parents if parent.is_symlink())
    return out


def cache_key(dists: dict[str, Distribution]) -> str:
    """The files' paths stay as they are here, and the image's PATH names the venv's ``bin``:
    a venv elsewhere (a second clone) makes another image."""
    lines = [
        sys.prefix,
        sys.version,
        COMPILER_PACKAGE,
        *EXTRA_PROGRAMS,
        *sorted(f"{n}=={d.version}" for n, d in dists.items()),
    ]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def image_name(dists: dict[str, Distribution]) -> str:
    return f"vllm-cpu-{dists[ROOT_DIST].version}-{cache_key(dists)}"


def image_files(dists: dict[str, Distribution]) -> set[Path]:
    """Every path the root filesystem holds from this machine (the module's docstring)."""
    files = venv_files(dists) | base_files()
    files |= {Path(p) for p in EXTRA_PROGRAMS} | {Path("/etc/ld.so.cache")}
    files |= package_files(COMPILER_PACKAGE)
    files |= system_libraries(files)
    return with_link_targets(files)


def size_of(files: set[Path]) -> int:
    """Bytes of the regular files among ``files``: what the image's one layer holds."""
    return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())


def write_tar(files: set[Path]) -> None:
    """The root filesystem as one tar stream on stdout: the listed files from ``/``, then the
    made-up ``etc`` and ``tmp``."""
    with tempfile.TemporaryDirectory() as scratch:
        etc = Path(scratch) / "etc"
        etc.mkdir()
        (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (etc / "group").write_text("root:x:0:\n")
        (Path(scratch) / "tmp").mkdir(mode=0o1777)
        (Path(scratch) / "tmp").chmod(0o1777)
        listing = Path(scratch) / "files"
        listing.write_bytes(b"\0".join(str(f).lstrip("/").encode() for f in sorted(files)))
        subprocess.run(
            # --no-recursion is positional: the listed files alone, then etc and tmp whole
            ["tar", "-cf", "-", "-C", "/", "--null", "--no-recursion", "-T", str(listing)]
            + ["-C", scratch, "--recursion", "etc", "tmp"],
            check=True,
        )


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what not in ("name", "tar"):
        raise SystemExit(f"usage: {Path(sys.argv[0]).name} name|tar")
    dists = closure(ROOT_DIST)
    if not dists:
        raise SystemExit(f"{ROOT_DIST} is not installed in {sys.prefix}")
    files = image_files(dists)
    if what == "name":
        print(json.dumps({"name": image_name(dists), "changes": CHANGES, "bytes": size_of(files)}))
    else:
        write_tar(files)


if __name__ == "__main__":
    main()
