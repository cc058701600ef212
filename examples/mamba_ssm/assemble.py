"""Assemble the Triton SSD path of mamba-ssm into an importable folder, without its CUDA extensions.

mamba-ssm's ``mamba_ssm/__init__.py`` imports the selective-scan CUDA extension (and the
modules built on it), so ``import mamba_ssm`` fails without a build. The Triton SSD scan,
``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined``, needs only the files in
:data:`FILES` (its other imports, causal_conv1d and ``selective_scan``, are in try/except or
inside functions it does not call from the scan), plus einops and packaging. This script
copies those files, unchanged, into ``TARGET/mamba_ssm/...`` with empty ``__init__.py``
files for the packages (:data:`PACKAGES`), so that::

    PYTHONPATH=TARGET python -c "from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined"

works. Sources (the mamba code is read from them, never stored in this repository)::

    python examples/mamba_ssm/assemble.py SRC TARGET           # a git checkout or an unpacked sdist
    python examples/mamba_ssm/assemble.py mamba_ssm-X.tar.gz TARGET   # an sdist (pip download --no-binary)
    python examples/mamba_ssm/assemble.py --git-dir DIR --rev HEAD TARGET   # a bare repository (git show)

It prints the version (the ``__version__`` line of ``mamba_ssm/__init__.py``, read as text:
that file is not copied) and the commit when the source is a git repository, and writes
them to ``TARGET/ASSEMBLED_FROM.txt`` for ``run.sh`` to print. An existing
``TARGET/mamba_ssm`` is replaced.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

FILES = tuple(f"mamba_ssm/ops/triton/{name}.py" for name in (
    "ssd_combined", "ssd_bmm", "ssd_chunk_scan", "ssd_chunk_state", "ssd_state_passing",
    "layernorm_gated", "k_activations", "softplus",
)) + ("mamba_ssm/utils/torch.py", "mamba_ssm/utils/determinism.py")
PACKAGES = ("mamba_ssm", "mamba_ssm/ops", "mamba_ssm/ops/triton", "mamba_ssm/utils")
VERSION_FILE = "mamba_ssm/__init__.py"
_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)


class Source:
    """Reads files of a mamba-ssm source by their path in the repository (``mamba_ssm/...``)."""

    description = ""
    commit: str | None = None

    def read(self, path: str) -> bytes | None:  # None: no such file
        raise NotImplementedError


class DirectorySource(Source):
    """A git checkout or an unpacked sdist: ``ROOT/mamba_ssm/...``, or a folder holding one such root."""

    def __init__(self, path: Path):
        root = path
        if not (root / VERSION_FILE).is_file():
            inner = [p for p in path.iterdir() if p.is_dir() and (p / VERSION_FILE).is_file()]
            if len(inner) != 1:
                raise SystemExit(f"{path}: no {VERSION_FILE} in it or in exactly one folder under it")
            root = inner[0]
        self.root = root
        self.description = str(root)
        self.commit = _git_commit(["git", "-C", str(root)], "HEAD") if (root / ".git").exists() else None

    def read(self, path):
        f = self.root / path
        return f.read_bytes() if f.is_file() else None


class TarballSource(Source):
    """An sdist ``.tar.gz`` (or a ``git archive``): its members ``TOP/mamba_ssm/...``."""

    def __init__(self, path: Path):
        self.tar = tarfile.open(path, "r:*")
        tops = {m.name.split("/", 1)[0] for m in self.tar.getmembers() if m.name.endswith("/" + VERSION_FILE)
                and m.name.count("/") == VERSION_FILE.count("/") + 1}
        if len(tops) != 1:
            raise SystemExit(f"{path}: expected one TOP/{VERSION_FILE} member, found {sorted(tops) or 'none'}")
        self.top = tops.pop()
        self.description = f"{path} ({self.top}/)"
        comment = self.tar.pax_headers.get("comment", "")  # git archive records its commit there
        self.commit = comment if re.fullmatch(r"[0-9a-f]{40}", comment) else None

    def read(self, path):
        try:
            member = self.tar.getmember(f"{self.top}/{path}")
        except KeyError:
            return None
        f = self.tar.extractfile(member)
        return f.read() if f is not None else None


class GitSource(Source):
    """A repository read with ``git show REV:PATH`` (a bare mirror needs no work tree)."""

    def __init__(self, git_dir: Path, rev: str):
        self.git = ["git", "--git-dir", str(git_dir)]
        self.commit = _git_commit(self.git, rev)
        if self.commit is None:
            raise SystemExit(f"{git_dir}: cannot resolve {rev!r} (is it a git directory?)")
        self.description = f"{git_dir} at {rev}"

    def read(self, path):
        done = subprocess.run(self.git + ["show", f"{self.commit}:{path}"], capture_output=True)
        return done.stdout if done.returncode == 0 else None


def _git_commit(git: list[str], rev: str) -> str | None:
    done = subprocess.run(git + ["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], capture_output=True,
                          text=True)
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def version_of(source: Source) -> str:
    text = source.read(VERSION_FILE)
    if text is None:
        raise SystemExit(f"{source.description}: no {VERSION_FILE}")
    found = _VERSION.search(text.decode("utf-8", "replace"))
    return found.group(1) if found else "unknown"


def assemble(source: Source, target: Path) -> tuple[str, str | None]:
    """Copy :data:`FILES` from ``source`` into ``target/mamba_ssm``; (version, commit)."""
    contents = {}
    for path in FILES:
        data = source.read(path)
        if data is None:
            raise SystemExit(f"{source.description}: {path} is missing (not a mamba-ssm with the Triton SSD path?)")
        contents[path] = data
    version = version_of(source)
    shutil.rmtree(target / "mamba_ssm", ignore_errors=True)
    for package in PACKAGES:
        (target / package).mkdir(parents=True, exist_ok=True)
        (target / package / "__init__.py").write_bytes(b"")
    for path, data in contents.items():
        (target / path).write_bytes(data)
    (target / "ASSEMBLED_FROM.txt").write_text(
        f"mamba_ssm {version} commit {source.commit or 'unknown'} from {source.description}\n"
        f"files: {' '.join(FILES)}\n")
    return version, source.commit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="?", type=Path,
                        help="a mamba-ssm git checkout, unpacked sdist, or sdist .tar.gz (not with --git-dir)")
    parser.add_argument("target", type=Path, help="the folder to put on PYTHONPATH")
    parser.add_argument("--git-dir", type=Path, help="a (bare) git repository of mamba-ssm, read with git show")
    parser.add_argument("--rev", default="HEAD", help="the revision of --git-dir (default HEAD)")
    args = parser.parse_args(argv)
    if (args.git_dir is None) == (args.source is None):
        parser.error("give either SOURCE or --git-dir DIR, not both")
    if args.git_dir is not None:
        source: Source = GitSource(args.git_dir, args.rev)
    elif args.source.is_dir():
        source = DirectorySource(args.source)
    elif args.source.is_file() and tarfile.is_tarfile(args.source):
        source = TarballSource(args.source)
    else:
        parser.error(f"{args.source}: neither a folder nor a tar archive")
    version, commit = assemble(source, args.target)
    print(f"mamba_ssm {version} commit {commit or 'unknown'} from {source.description}: "
          f"{len(FILES)} files into {args.target / 'mamba_ssm'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
