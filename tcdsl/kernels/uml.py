"""Run shell scripts under a real Debian kernel booted as User-Mode Linux (UML).

The host's kernel may lack the qdiscs, classifiers and netfilter modules a generated script
uses (sfq, netem, fw, cake, ...). Debian's ``user-mode-linux`` package ships its full 6.1
kernel as an ordinary program (``linux.uml``) with all of its modules, so a script can be
applied to a real kernel without root, KVM or a VM manager. A boot takes under a second.

The image, built once by :func:`prepare` and cached in :func:`image_dir`::

    linux.uml          the kernel, from Debian's user-mode-linux package
    modules/<release>  its modules, with the modules.dep and modules.alias Debian ships
    initrd.cpio        the guest's root: busybox (static), dash as /bin/sh, the real ip, tc
                       and iptables-legacy (also as ``iptables``) with the libraries they
                       need, the xtables extensions, tc's netem tables, ``/init`` (INIT)
    manifest.json      package versions and the recipe; written last, it marks the image
                       complete

Every guest file comes from a Debian package fetched with ``apt-get download`` (nothing is
installed, nothing is copied from the host), so the guest does not depend on what the host
has installed, only on the Debian release its apt points at.

A run (:func:`run_cases`) writes the cases to ``jobs/<job>/cases/NNNN.sh`` in the image
folder and boots the kernel once, with host file access confined to the image folder
(``hostfs=<image folder>``). The guest's /init mounts ``modules`` read-only on
``/usr/lib/modules`` and the job's folder on ``/job`` (hostfs), makes the kernel load modules
on demand with busybox's modprobe, then runs each case as ``unshare -n sh -c 'ip link set lo
up && exec sh NNNN.sh'`` with its stdout, stderr and exit status going straight to
``jobs/<job>/results/NNNN.out``, ``.err`` and ``.rc``, and powers off. The results are plain
files on the host: no console to parse, any bytes pass, and what finished before a hang or a
crash is still there.

Hosts with AVX-512 (and AMX): UML 6.1 keeps a guest process's vector registers in a
fixed-size buffer, which the host kernel refuses when its XSAVE area is larger, and the first
guest process dies ("userspace - ptrace set fp regs failed, errno = 14"; fixed upstream in
6.13). So the kernel runs under a seccomp filter that makes UML fall back to saving the
512-byte FXSAVE area (:func:`_child_setup`). That area holds x87 and SSE state only; the
rest of the AVX registers is not kept across a guest process's page faults (which reach UML
through a host signal handler), and glibc's AVX string functions then crash or go wrong. So
glibc in the guest is told to keep to SSE (``GLIBC_TUNABLES``, given to every guest process,
the kernel's module loader included).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import json
import os
import platform
import posixpath
import re
import resource
import select
import shutil
import signal
import stat
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "Case",
    "CaseResult",
    "UmlError",
    "UmlUnavailable",
    "available",
    "image_dir",
    "prepare",
    "run_cases",
]

RECIPE = 1
"""Version of the image's recipe (packages, layout, /init): a new one builds a new image."""

UML_PACKAGE = "user-mode-linux"
GUEST_PACKAGES = ("busybox-static", "dash", "iproute2", "iptables", "netbase", "libatm1")
"""Debian packages the guest's files come from, with the libraries they depend on
(``libatm1``: a library only tc's ATM plugin needs; ``netbase``: /etc/protocols, services)."""

MEMORY = "256M"
"""Guest RAM. UML maps it from a sparse file, so what the guest does not touch costs nothing."""

BOOT_TIMEOUT = 60.0
"""Seconds the kernel has to reach the guest's /init (under a second on an idle host), before
and apart from a run's own timeout."""

_BOOT_POLL = 0.05

GLIBC_TUNABLES = (
    "glibc.cpu.hwcaps=-AVX,-AVX2,-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD,-FMA,-FMA4,"
    "-AVX_Fast_Unaligned_Load"
)
"""Keeps glibc in the guest to SSE, whose registers UML saves in full (see the module's doc)."""

KERNEL_ARGS = (
    # The results come back through hostfs: the consoles only carry the kernel's log.
    "con0=null,fd:1",
    "con=null",
    "ssl=null",
    "quiet",
    # Exit instead of restarting the kernel on reboot or panic (panic=-1: at once).
    "noreboot",
    "panic=-1",
    # Benchmarking RAID6 and XOR routines costs 0.85 s per boot, and nothing here uses them;
    # a preset delay-loop value saves 0.1 s of calibration (UML has no device that needs an
    # exact udelay).
    "initcall_blacklist=raid6_select_algo,calibrate_xor_blocks",
    "lpj=10000000",
    "rdinit=/init",
    # Parameters the kernel does not know become /init's environment, so every process's.
    f"GLIBC_TUNABLES={GLIBC_TUNABLES}",
)
"""The kernel's command line, besides ``mem=``, ``initrd=``, ``hostfs=``, ``uml_dir=``,
``umid=`` and the job's folder."""

_ARCH_LIBDIR = "usr/lib/x86_64-linux-gnu"
_LIBRARY_DIRS = (_ARCH_LIBDIR, "usr/lib64", "usr/lib")
"""Where the guest's dynamic loader finds libraries (the guest has a merged /usr)."""

_MERGED = ("bin", "sbin", "lib", "lib64")
"""Top-level folders that are symbolic links into /usr in the guest."""

_XTABLES_NAMES = tuple(
    f"{family}tables{suffix}"
    for family in ("ip", "ip6")
    for suffix in ("", "-save", "-restore", "-legacy", "-legacy-save", "-legacy-restore")
)
"""Commands that run iptables-legacy in the guest (``iptables`` too: there is no nft one)."""

_GUEST_PATHS = (
    "usr/bin/dash",
    "usr/bin/ip",
    "usr/sbin/tc",
    "usr/sbin/xtables-legacy-multi",
    f"{_ARCH_LIBDIR}/xtables",
    f"{_ARCH_LIBDIR}/tc",
    "etc/iproute2",
    "etc/protocols",
    "etc/services",
)
"""Files and (whole) folders the guest takes from the packages; libraries follow from the ELF
files' DT_NEEDED entries."""

_SHELLS = frozenset({"sh", "ash", "hush", "bash"})
"""Busybox applets not linked in the guest: /bin/sh is dash, since busybox's shells run
busybox's own ``ip`` and ``tc`` instead of the real ones."""

INIT = r"""#!/bin/sh
# /init of the tcdsl UML guest, run by dash as PID 1. $tcdsl_job, from the kernel's command
# line, is the job's folder relative to the hostfs root (the image folder).
PATH=/usr/sbin:/usr/bin
export PATH
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t hostfs -o ro,modules hostfs /usr/lib/modules
echo /usr/sbin/tcdsl-modprobe >/proc/sys/kernel/modprobe
echo >/proc/sys/kernel/hotplug
if mount -t hostfs -o "$tcdsl_job" hostfs /job; then
    # UML's own parameters reach this environment too: keep the cases' clean.
    unset tcdsl_job mem hostfs uml_dir
    uname -r >/job/results/booted
    for script in /job/cases/*.sh; do
        [ -e "$script" ] || continue
        n=${script##*/}
        n=${n%.sh}
        mkdir "/tmp/$n"
        (
            cd "/tmp/$n" &&
            exec unshare -n /bin/sh -c 'ip link set lo up && exec /bin/sh "$0"' "$script"
        ) </dev/null >"/job/results/$n.out" 2>"/job/results/$n.err"
        echo $? >"/job/results/$n.rc"
    done
fi
sync
poweroff -f
"""
"""The guest's /init. A case's exit status is its script's; ``.rc`` is written last."""

_STALE_JOB_SECONDS = 24 * 3600
"""Job folders left by a process that was killed are removed after this long."""


@dataclass(frozen=True)
class Case:
    """One job to run in the guest.

    ``script`` is POSIX sh, run by dash in a network namespace of its own whose ``lo`` is up,
    with the real ``ip``, ``tc`` and ``iptables`` (legacy) first in ``PATH`` and busybox for
    the rest, stdin from /dev/null, in an empty working folder of its own (tmpfs). Loaded
    modules and the rest of the kernel are shared by the cases of one run. Programs started
    without ``GLIBC_TUNABLES`` in their environment (``env -i``) crash on hosts with AVX-512
    (see the module's doc).
    """

    name: str
    script: str


@dataclass(frozen=True)
class CaseResult:
    """What a case did: its exit status and its output (UTF-8, undecodable bytes replaced)."""

    name: str
    exit_code: int
    stdout: str
    stderr: str


class UmlUnavailable(Exception):
    """UML cannot run here; the message says why."""


class UmlError(RuntimeError):
    """The guest booted but did not finish its cases (timeout, crash, a case powered off).

    ``results`` holds the cases that finished, in order; ``console`` the kernel's log.
    """

    def __init__(self, message: str, results: list[CaseResult], console: str) -> None:
        super().__init__(message)
        self.results = results
        self.console = console


# ==== the cache =================================================================================


def image_dir() -> Path:
    """Where the image is, or will be, cached: ``uml-r<RECIPE>`` in ``$TCDSL_CACHE`` if set,
    else in ``$XDG_CACHE_HOME/tcdsl`` (by default ``~/.cache/tcdsl``)."""
    base = os.environ.get("TCDSL_CACHE")
    if base:
        root = Path(base).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "tcdsl"
    return root.absolute() / f"uml-r{RECIPE}"


def _manifest(image: Path) -> dict[str, object] | None:
    """The manifest of a complete image in ``image``, else ``None``."""
    try:
        data = json.loads((image / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("recipe") != RECIPE:
        return None
    release = data.get("release")
    if not isinstance(release, str):
        return None
    for part in ("linux.uml", "initrd.cpio", f"modules/{release}/modules.dep"):
        if not (image / part).exists():
            return None
    return data


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepare(force: bool = False) -> Path:
    """Build the image unless it is cached, and return its folder (:func:`image_dir`).

    With the image cached this only reads its manifest. Otherwise it downloads about 45 MB
    of packages with ``apt-get download`` (no root needed: nothing is installed), unpacks
    them with ``dpkg-deb`` and writes the image (about 15 s); concurrent callers wait for one
    build. ``force`` rebuilds a cached image too. Raises :class:`UmlUnavailable` if the image
    cannot be built here (not x86-64 Linux, no apt, packages not found, disk trouble).
    """
    image = image_dir()
    if not force and _manifest(image) is not None:
        return image
    _check_host(image)
    try:
        image.parent.mkdir(parents=True, exist_ok=True)
        with _locked(image.parent / f".{image.name}.lock"):
            if not force and _manifest(image) is not None:
                return image
            work = Path(tempfile.mkdtemp(prefix=f".{image.name}.build-", dir=image.parent))
            try:
                new = work / "image"
                _build(new, work / "staging", work / "debs")
                if image.exists():
                    image.rename(work / "old")
                new.rename(image)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except OSError as exc:
        raise UmlUnavailable(f"building the UML image in {image} failed: {exc}") from exc
    return image


def _check_host(image: Path) -> None:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise UmlUnavailable(
            f"the UML kernel is an x86-64 Linux program; this is "
            f"{platform.system()} {platform.machine()}"
        )
    for tool, package in (("apt-get", "apt"), ("apt-cache", "apt"), ("dpkg-deb", "dpkg")):
        if shutil.which(tool) is None:
            raise UmlUnavailable(f"building the UML image needs {tool} (Debian's {package})")
    if "," in str(image):
        # hostfs=<folder>,<flags> cannot take one.
        raise UmlUnavailable(f"the UML image's folder has a comma: {image} (set TCDSL_CACHE)")


# ==== building the image ========================================================================


def _build(image: Path, staging: Path, debs: Path) -> None:
    """Download, unpack and assemble a complete image in ``image`` (which must not exist)."""
    started = time.monotonic()
    debs.mkdir(parents=True)
    staging.mkdir(parents=True)
    versions = _download(debs)
    for deb in sorted(debs.glob("*.deb")):
        _run(["dpkg-deb", "-x", str(deb), str(staging)], f"unpacking {deb.name}")

    module_root = staging / "usr/lib/uml/modules"
    releases = sorted(p.name for p in module_root.iterdir()) if module_root.is_dir() else []
    if len(releases) != 1 or not (module_root / releases[0] / "modules.dep").is_file():
        raise UmlUnavailable(f"{UML_PACKAGE} has no single module tree with a modules.dep")
    release = releases[0]
    kernel = staging / "usr/bin/linux.uml"
    if _run([str(kernel), "--version"], "asking the kernel its version").strip() != release:
        raise UmlUnavailable(f"{UML_PACKAGE}: linux.uml is not the kernel of modules/{release}")

    image.mkdir(parents=True)
    _guest(staging).write(image / "initrd.cpio")
    kernel.rename(image / "linux.uml")
    (image / "modules").mkdir()
    (module_root / release).rename(image / "modules" / release)
    manifest = {
        "recipe": RECIPE,
        "release": release,
        "packages": versions,
        "build_seconds": round(time.monotonic() - started, 1),
    }
    (image / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _run(argv: list[str], what: str, cwd: Path | None = None) -> str:
    """Run a build command and return its stdout; failing is :class:`UmlUnavailable`."""
    try:
        done = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, check=False, timeout=600
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UmlUnavailable(f"{what}: {exc}") from exc
    if done.returncode != 0:
        detail = " / ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise UmlUnavailable(f"{what} failed ({' '.join(argv[:3])} ...): {detail}")
    return done.stdout


def _apt_fields(names: Sequence[str]) -> dict[str, dict[str, str]]:
    """The fields of the candidate versions of the packages apt has (virtual ones left out)."""
    done = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", *names],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    packages: dict[str, dict[str, str]] = {}
    for stanza in done.stdout.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t"):
                if key:
                    fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Package" in fields:
            packages.setdefault(fields["Package"], fields)
    return packages


def _depends(fields: dict[str, str]) -> set[str]:
    """The packages a package depends on (the first of alternatives)."""
    names = set()
    for field in ("Pre-Depends", "Depends"):
        for item in fields.get(field, "").split(","):
            first = item.split("|")[0].strip()
            if first:
                names.add(re.split(r"[\s(:]", first, maxsplit=1)[0])
    return names


def _download(debs: Path) -> dict[str, str]:
    """Download the kernel, the guest packages and the shared-library packages (Debian
    section ``libs``) they need into ``debs``; return ``{package: version}``.

    Other dependencies (debconf, dpkg, ...) are for installing a package, not for running it.
    """
    roots = [UML_PACKAGE, *GUEST_PACKAGES]
    # apt-cache takes a second to start: every package the roots may reach in one call, all
    # their fields in another, and the walk here.
    no = ("recommends", "suggests", "conflicts", "breaks", "replaces", "enhances")
    listing = subprocess.run(
        ["apt-cache", "depends", "--recurse", *(f"--no-{kind}" for kind in no), *roots],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    ).stdout
    reachable = {line.strip() for line in listing.splitlines() if line[:1] not in (" ", "<")}
    known = _apt_fields(sorted(reachable | set(roots)))
    for name in roots:
        if name not in known:
            raise UmlUnavailable(
                f"apt has no package {name}: is apt set up for Debian 12 (bookworm), and "
                f"has 'apt-get update' been run?"
            )
    chosen = dict.fromkeys(roots)
    todo = set().union(*(_depends(known[name]) for name in GUEST_PACKAGES))
    while todo:
        name = todo.pop()
        fields = known.get(name, {})
        if name not in chosen and fields.get("Section", "").split("/")[-1] == "libs":
            chosen[name] = None
            todo |= _depends(fields) - set(chosen)
    argv = ["apt-get", "download", "-q"]
    if os.geteuid() == 0:
        # As root apt downloads as the _apt user, who cannot write to a private folder.
        argv += ["-o", "APT::Sandbox::User=root"]
    _run([*argv, *chosen], "downloading the packages", cwd=debs)
    return {name: known[name].get("Version", "?") for name in chosen}


def _normalize(path: str) -> str:
    """A package's path as the guest has it: relative, /bin, /sbin, /lib, /lib64 in /usr."""
    path = posixpath.normpath(path.lstrip("/"))
    return f"usr/{path}" if path.split("/", 1)[0] in _MERGED else path


def _elf_dependencies(data: bytes) -> list[str]:
    """The program interpreter and DT_NEEDED names of a 64-bit little-endian ELF file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads: list[tuple[int, int, int]] = []
    dynamic: tuple[int, int] | None = None
    found: list[str] = []
    for i in range(phnum):
        kind, _, offset, vaddr, _, filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize
        )
        if kind == 1:  # PT_LOAD
            loads.append((vaddr, offset, filesz))
        elif kind == 2:  # PT_DYNAMIC
            dynamic = (offset, filesz)
        elif kind == 3:  # PT_INTERP
            found.append(data[offset : offset + filesz].split(b"\0")[0].decode())
    if dynamic is None:
        return found
    needed: list[int] = []
    strtab = -1
    for at in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, at)
        if tag == 0:  # DT_NULL
            break
        if tag == 1:  # DT_NEEDED: an offset in the string table
            needed.append(value)
        elif tag == 5:  # DT_STRTAB: the string table's address
            strtab = value
    for vaddr, offset, size in loads:
        if vaddr <= strtab < vaddr + size:
            base = strtab - vaddr + offset
            break
    else:
        return found
    for value in needed:
        end = data.index(b"\0", base + value)
        found.append(data[base + value : end].decode())
    return found


def _exec_program(path: str, argv0: str, env: Sequence[str]) -> bytes:
    """A static x86-64 ELF program that does ``execve(path, [argv0, its arguments...], env)``
    (or exits 127), assembled here so that no libc code runs before ``env`` is in force."""
    base = 0x400000
    code_at = 64 + 56  # after the ELF header and the one program header
    code_size = 42
    table_at = (code_at + code_size + 7) & ~7
    strings_at = table_at + 8 * (len(env) + 1)
    strings = b""
    pointers: list[int] = []
    for text in (path, argv0, *env):
        pointers.append(base + strings_at + len(strings))
        strings += text.encode() + b"\0"
    path_at, argv0_at, *env_at = pointers
    code = b"".join(
        (
            b"\xbf" + struct.pack("<I", path_at),  # mov edi, path
            b"\x48\x8d\x74\x24\x08",  # lea rsi, [rsp+8]: argv, as the kernel passed it
            b"\xb8" + struct.pack("<I", argv0_at),  # mov eax, argv0
            b"\x48\x89\x06",  # mov [rsi], rax: argv[0] = argv0
            b"\xba" + struct.pack("<I", base + table_at),  # mov edx, envp
            b"\xb8\x3b\x00\x00\x00",  # mov eax, 59: execve
            b"\x0f\x05",  # syscall
            b"\xbf\x7f\x00\x00\x00",  # mov edi, 127
            b"\xb8\x3c\x00\x00\x00",  # mov eax, 60: exit
            b"\x0f\x05",  # syscall
        )
    )
    assert len(code) == code_size
    size = strings_at + len(strings)
    ident = b"\x7fELF\x02\x01\x01" + b"\0" * 9  # 64-bit, little-endian, version 1
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH", 2, 0x3E, 1, base + code_at, 64, 0, 0, 64, 56, 1, 0, 0, 0
    )  # executable, x86-64, entry, program headers at 64, one of 56 bytes
    program_header = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)
    table = b"".join(struct.pack("<Q", p) for p in (*env_at, 0))
    padding = b"\0" * (table_at - code_at - code_size)
    return header + program_header + code + padding + table + strings


@dataclass
class _Entry:
    """A member of the guest's cpio archive."""

    mode: int
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


class _Guest:
    """The guest's root file system, assembled from unpacked packages, written as a cpio."""

    def __init__(self, staging: Path) -> None:
        self.staging = staging
        self.entries: dict[str, _Entry] = {}
        self.index: dict[str, Path] = {}
        for top, dirs, files in os.walk(staging):
            rel = os.path.relpath(top, staging)
            for name in (*files, *dirs):
                self.index[_normalize(posixpath.join(rel, name))] = Path(top) / name
        self.unresolved: list[str] = []

    def dir(self, path: str, mode: int = 0o755) -> None:
        if path not in ("", "."):
            self.dir(posixpath.dirname(path))
            self.entries.setdefault(path, _Entry(stat.S_IFDIR | mode))

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.dir(posixpath.dirname(path))
        self.entries[path] = _Entry(stat.S_IFREG | mode, data)

    def symlink(self, path: str, target: str) -> None:
        self.dir(posixpath.dirname(path))
        self.entries[path] = _Entry(stat.S_IFLNK | 0o777, target.encode())

    def node(self, path: str, mode: int, major: int, minor: int) -> None:
        self.dir(posixpath.dirname(path))
        self.entries[path] = _Entry(mode, rdev=(major, minor))

    def include(self, path: str) -> None:
        """Copy ``path`` from the packages: a symbolic link with its target, a folder whole,
        an ELF file with the libraries it needs."""
        if path in self.entries:
            return
        source = self.index.get(path)
        if source is None:
            raise UmlUnavailable(f"the guest needs /{path}, which no downloaded package has")
        if source.is_symlink():
            raw = os.readlink(source)
            origin = posixpath.dirname(os.path.relpath(source, self.staging))
            target = _normalize(raw if raw.startswith("/") else posixpath.join(origin, raw))
            self.symlink(path, "/" + target)
            self.include(target)
        elif source.is_dir():
            self.dir(path)
            for child in sorted(source.iterdir()):
                self.include(f"{path}/{child.name}")
        else:
            data = source.read_bytes()
            self.file(path, data, stat.S_IMODE(source.stat().st_mode))
            for needed in _elf_dependencies(data):
                self.library(needed)

    def library(self, name: str) -> None:
        if "/" in name:
            self.include(_normalize(name))
            return
        for folder in _LIBRARY_DIRS:
            if f"{folder}/{name}" in self.index:
                self.include(f"{folder}/{name}")
                return
        self.unresolved.append(name)

    def write(self, path: Path) -> None:
        with path.open("wb") as out:
            for ino, name in enumerate(sorted(self.entries), start=1):
                _cpio_member(out, ino, name, self.entries[name])
            _cpio_member(out, 0, "TRAILER!!!", _Entry(0))


def _cpio_member(out: BinaryIO, ino: int, name: str, entry: _Entry) -> None:
    """Write one member of a cpio archive in the "newc" format the kernel unpacks."""
    encoded = name.encode() + b"\0"
    nlink = 2 if stat.S_ISDIR(entry.mode) else 1
    fields = (ino, entry.mode, 0, 0, nlink, 0, len(entry.data), 0, 0, *entry.rdev)
    header = b"070701" + b"".join(b"%08X" % v for v in (*fields, len(encoded), 0))
    out.write(header + encoded + b"\0" * (-(len(header) + len(encoded)) % 4))
    out.write(entry.data + b"\0" * (-len(entry.data) % 4))


def _guest(staging: Path) -> _Guest:
    """Assemble the guest's root from the unpacked packages."""
    guest = _Guest(staging)
    for top in _MERGED:
        guest.symlink(top, f"usr/{top}")
    for folder in ("dev", "proc", "sys", "run", "tmp", "job", "usr/lib/modules"):
        guest.dir(folder)
    guest.dir("root", 0o700)
    guest.node("dev/console", stat.S_IFCHR | 0o600, 5, 1)
    guest.node("dev/null", stat.S_IFCHR | 0o666, 1, 3)
    for path in _GUEST_PATHS:
        guest.include(path)
    if guest.unresolved:
        missing = ", ".join(sorted(set(guest.unresolved)))
        raise UmlUnavailable(f"no downloaded package has the libraries {missing}")
    guest.symlink("usr/bin/sh", "dash")
    for name in _XTABLES_NAMES:
        guest.symlink(f"usr/sbin/{name}", "xtables-legacy-multi")
    guest.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    guest.file("etc/group", b"root:x:0:\n")
    guest.file("init", INIT.encode(), 0o755)
    # The kernel starts its module loader with an environment of its own, without
    # GLIBC_TUNABLES: a program of a few instructions adds it and runs busybox's modprobe.
    env = (f"GLIBC_TUNABLES={GLIBC_TUNABLES}", "PATH=/usr/sbin:/usr/bin", "HOME=/")
    loader = _exec_program("/usr/bin/busybox", "modprobe", env)
    guest.file("usr/sbin/tcdsl-modprobe", loader, 0o755)

    busybox = staging / "bin/busybox"
    guest.file("usr/bin/busybox", busybox.read_bytes(), 0o755)
    taken = {p.rsplit("/", 1)[1] for p in guest.entries if p.startswith(("usr/bin/", "usr/sbin/"))}
    for applet in _run([str(busybox), "--list"], "listing busybox's applets").split():
        if applet not in taken and applet not in _SHELLS and "/" not in applet:
            guest.symlink(f"usr/bin/{applet}", "busybox")
    return guest


# ==== running ===================================================================================


def run_cases(cases: Sequence[Case], timeout: float = 120) -> list[CaseResult]:
    """Boot the kernel once and run ``cases`` in order, each in a network namespace of its own.

    Returns one result per case, in order; builds the image first if needed
    (:func:`prepare`). Raises :class:`UmlUnavailable` if the kernel does not get as far as
    the guest's /init within :data:`BOOT_TIMEOUT` seconds, and :class:`UmlError` (holding the
    results that finished) if the guest stops before the last case is done or ``timeout``
    seconds pass after it started (a loaded host's slow boot does not eat the cases' time). With
    ``TCDSL_UML_KEEP=1`` in the environment the job's folder (cases, results, the kernel's
    log) is kept in ``jobs/`` of the image folder.
    """
    image = prepare()
    jobs = image / "jobs"
    jobs.mkdir(exist_ok=True)
    _remove_stale_jobs(jobs)
    job = Path(tempfile.mkdtemp(prefix="job-", dir=jobs))
    try:
        width = max(4, len(str(len(cases))))
        numbers = [f"{i:0{width}d}" for i in range(len(cases))]
        (job / "cases").mkdir()
        results_dir = job / "results"
        results_dir.mkdir()
        for number, case in zip(numbers, cases, strict=True):
            (job / "cases" / f"{number}.sh").write_text(case.script)
        argv = [
            str(image / "linux.uml"),
            f"mem={MEMORY}",
            f"initrd={image / 'initrd.cpio'}",
            f"hostfs={image}",
            f"uml_dir={job}",
            "umid=tcdsl",
            *KERNEL_ARGS,
            f"tcdsl_job=jobs/{job.name}",
        ]
        status = _boot(argv, job / "console.log", job, timeout, results_dir / "booted")
        timed_out = status is None
        console = (job / "console.log").read_text(errors="replace")
        tail = "\n".join(console.strip().splitlines()[-15:])
        if not (results_dir / "booted").exists():
            how = f"within {BOOT_TIMEOUT:g} s" if timed_out else f"(it exited with status {status})"
            raise UmlUnavailable(
                f"the UML kernel did not start its guest {how}; its log ends:\n{tail}"
            )
        results: list[CaseResult] = []
        for number, case in zip(numbers, cases, strict=True):
            rc = results_dir / f"{number}.rc"
            if not rc.exists():
                why = f"timed out after {timeout:g} s" if timed_out else "stopped"
                raise UmlError(
                    f"the guest {why} in case {case.name!r} ({len(results)} of {len(cases)} "
                    f"done); its log ends:\n{tail}",
                    results,
                    console,
                )
            results.append(
                CaseResult(
                    case.name,
                    int(rc.read_text().strip() or "-1"),
                    (results_dir / f"{number}.out").read_text(errors="replace"),
                    (results_dir / f"{number}.err").read_text(errors="replace"),
                )
            )
        return results
    finally:
        if not os.environ.get("TCDSL_UML_KEEP"):
            shutil.rmtree(job, ignore_errors=True)


def _remove_stale_jobs(jobs: Path) -> None:
    cutoff = time.time() - _STALE_JOB_SECONDS
    for old in jobs.glob("job-*"):
        with contextlib.suppress(OSError):
            if old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)


# The seccomp filter of the module's doc: the host answers UML's PTRACE_GETREGSET for
# NT_X86_XSTATE with EIO, which UML 6.1 takes as "no XSAVE", and it then saves and restores
# guest processes' registers with PTRACE_GETFPREGS/SETFPREGS, which every x86-64 host takes.
# Used on every host, so that every machine runs the guest the same way.
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_SECCOMP_FILTER = (
    # (code, jump if true, jump if false, k), over struct seccomp_data
    (0x20, 0, 0, 4),  # 0: A = arch
    (0x15, 0, 7, 0xC000003E),  # 1: AUDIT_ARCH_X86_64? else to 9
    (0x20, 0, 0, 0),  # 2: A = syscall number
    (0x15, 0, 5, 101),  # 3: ptrace? else to 9
    (0x20, 0, 0, 16),  # 4: A = low half of the request
    (0x15, 0, 3, 0x4204),  # 5: PTRACE_GETREGSET? else to 9
    (0x20, 0, 0, 32),  # 6: A = low half of addr, the register set
    (0x15, 0, 1, 0x202),  # 7: NT_X86_XSTATE? else to 9
    (0x06, 0, 0, 0x00050000 | errno.EIO),  # 8: SECCOMP_RET_ERRNO: fail with EIO
    (0x06, 0, 0, 0x7FFF0000),  # 9: SECCOMP_RET_ALLOW
)


class _SockFilter(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    )


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter)))


def _child_setup() -> Callable[[], None]:
    """What the kernel's process does before it starts: no core dumps (a crashing UML would
    write one the size of its RAM; the log says more), and the seccomp filter above."""
    libc = ctypes.CDLL(None, use_errno=True)
    program = (_SockFilter * len(_SECCOMP_FILTER))(*(_SockFilter(*i) for i in _SECCOMP_FILTER))
    fprog = _SockFprog(len(_SECCOMP_FILTER), program)

    def setup() -> None:
        # Runs between fork and exec (``fprog`` keeps ``program`` alive); an exception here
        # makes Popen raise it in the parent.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")

    return setup


def _boot(argv: list[str], console: Path, cwd: Path, timeout: float, booted: Path) -> int | None:
    """Run the kernel until it exits, or time out; return its exit status, ``None`` if it timed
    out. It has :data:`BOOT_TIMEOUT` seconds to create ``booted`` (the guest's /init does), then
    ``timeout`` seconds more. Its stdout and stderr (the kernel's log) go to ``console``."""
    with console.open("wb") as log:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_child_setup(),
            )
        except OSError as exc:
            raise UmlUnavailable(f"cannot run {argv[0]}: {exc}") from exc
        exited = False
        try:
            exited = _wait(proc, timeout, booted)
        finally:
            # UML's helpers and guest processes are host processes of its session.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            status = proc.wait()
        return status if exited else None


def _wait(proc: subprocess.Popen[bytes], timeout: float, booted: Path) -> bool:
    """Wait for ``proc`` to exit: at most :data:`BOOT_TIMEOUT` seconds until ``booted``
    exists, then at most ``timeout`` seconds more; return whether it exited."""
    deadline = time.monotonic() + BOOT_TIMEOUT
    started = False
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
    except OSError:  # before Linux 5.3: Popen.wait polls, up to 50 ms late
        pidfd = None
    try:
        while True:
            if not started and booted.exists():
                started = True
                deadline = time.monotonic() + timeout
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # Until the guest has started, look for its mark every 50 ms.
            step = left if started else min(left, _BOOT_POLL)
            if pidfd is None:
                try:
                    proc.wait(timeout=step)
                except subprocess.TimeoutExpired:
                    continue
                return True
            if select.select([pidfd], [], [], step)[0]:
                return True
    finally:
        if pidfd is not None:
            os.close(pidfd)


@functools.cache
def available() -> str | None:
    """``None`` if UML works here, else the reason it does not (for ``pytest.skip``).

    The first call builds the image if needed (:func:`prepare`) and boots it with no cases
    (under a second once the image is cached); the answer is kept for the process. An
    :class:`UmlError` (the guest booted but misbehaved) is raised, not returned.
    """
    try:
        run_cases([], timeout=60)
    except UmlUnavailable as exc:
        return str(exc)
    return None
