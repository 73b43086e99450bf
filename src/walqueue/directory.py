"""The queue directory, reached once as a descriptor and judged on what that descriptor holds.

`Directory` is the open directory every file of the queue is opened in
(walqueue.fs); `open_queue_directory` reaches it.

A directory judged by its path and then opened by its path can be two
directories: whoever can change an entry on the way (a symbolic link, a
parent they may write) swaps one for the other in between. So the path is
walked one component at a time from `/`, each component opened relative to
the one before with O_NOFOLLOW, and every symbolic link met on the way is
read and followed by this walk itself. The descriptors the walk holds are
what is judged, and the last one is what the queue uses from then on:
nothing is looked up by path again.

What is judged (`OpenedDirectory.findings`, one sentence each, saying what
to chown or chmod):
  1. the queue directory is owned by the effective user and writable by no
     one else;
  2. its parents, up to and including the first one owned by root, belong to
     root or that user, and are writable by no one else, except that a
     root-owned parent with the sticky bit may be (like /tmp: others cannot
     rename or remove what is not theirs);
  3. every directory that holds a symbolic link the walk followed is judged
     as a parent is (rule 2, with its own parents), and a link in a sticky
     directory must belong to root or that user: whoever may replace the link
     decides where the path leads.
Write access for a group is no one else's when that group is the owner's
private group (umask 002 systems: the owner's primary group, named like the
owner, with no other members).

Linux only (O_PATH): a parent that may be searched but not read, like a
home directory of mode 0711, is still walked and judged.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

MAX_LINKS = 40   # as the kernel's own path walk: more is a loop
# Intermediate directories need only search permission; the queue directory itself is
# reopened for reading (listing, fsync) once reached.
_WALK_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

NEVER, LAST, PARENTS = "never", "last", "parents"   # what open_queue_directory may create
DIRECTORY_MODE = 0o750


@dataclass(frozen=True)
class Directory:
    """An open queue directory: its path (for messages) and the descriptor files are opened by.

    `owner`, when known, is the uid every file opened in it must belong to
    (the directory's own owner): a file of another user's there may be
    theirs to read or change still.
    """

    path: str
    fd: int
    owner: int | None = None


@dataclass(frozen=True)
class OpenedDirectory:
    """The queue directory as a descriptor, what lets others change it, and whether it is new.

    `directory` is None when it was to be created and the way to it was
    found unsafe: then nothing was created.
    """

    directory: Directory | None   # its path is the real one the walk reached
    findings: tuple[str, ...]
    created: bool


@dataclass(frozen=True)
class _Step:
    path: str
    info: os.stat_result


def open_queue_directory(path: str | os.PathLike, *, create: str = NEVER) -> OpenedDirectory:
    """Walk to the directory at `path`, open it, and judge it (see the module docstring).

    `create`: NEVER; LAST, the last component only, when its parent exists
    and nothing is found against the way there; PARENTS, every missing
    component (the library's Queue, which only warns). A created directory
    has mode 0750 and its name is fsynced. Raises FileNotFoundError naming
    the first missing component, NotADirectoryError, or the OSError of a
    component that cannot be searched. The caller closes the descriptor.
    """
    given = os.fspath(path)
    absolute = given if given.startswith("/") else os.path.join(os.getcwd(), given)
    pending = _components(absolute)
    root = os.open("/", _WALK_FLAGS)
    chain: list[tuple[int, _Step]] = [(root, _Step("/", os.fstat(root)))]
    findings: list[str] = []
    created = False
    links = 0
    try:
        while pending:
            name = pending.pop()
            if name == "..":
                if len(chain) > 1:
                    os.close(chain.pop()[0])
                continue
            holder_fd, holder = chain[-1]
            try:
                fd = os.open(name, _WALK_FLAGS, dir_fd=holder_fd)
            except FileNotFoundError:
                if create == NEVER or (create == LAST and pending):
                    raise FileNotFoundError(errno.ENOENT, f"{_join(holder.path, name)} does not "
                                            f"exist", given) from None
                if create == LAST:
                    _extend(findings, _judge_parents(chain, _join(holder.path, name)))
                    if findings:  # nothing is created on an unsafe way
                        return OpenedDirectory(None, tuple(findings), False)
                try:
                    os.mkdir(name, DIRECTORY_MODE, dir_fd=holder_fd)
                except FileExistsError:
                    pass  # made meanwhile by another process: judged below like any other
                else:
                    _fsync_directory(holder_fd)  # the new name must survive a power cut
                    created = True
                fd = os.open(name, _WALK_FLAGS, dir_fd=holder_fd)
            except OSError as error:
                if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                entry = os.stat(name, dir_fd=holder_fd, follow_symlinks=False)
                if not stat.S_ISLNK(entry.st_mode):
                    raise NotADirectoryError(errno.ENOTDIR, f"{_join(holder.path, name)} is not a "
                                             f"directory", given) from None
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, f"more than {MAX_LINKS} symbolic links", given) from None
                _extend(findings, _judge_link(chain, name, entry))
                target = os.readlink(name, dir_fd=holder_fd)
                if target.startswith("/"):
                    while len(chain) > 1:
                        os.close(chain.pop()[0])
                pending.extend(_components(target))
                continue
            chain.append((fd, _Step(_join(holder.path, name), os.fstat(fd))))
        final_fd, final = chain[-1]
        opened = os.open(".", _OPEN_FLAGS, dir_fd=final_fd)
    finally:
        for fd, _ in chain:
            os.close(fd)
    info = os.fstat(opened)
    _extend(findings, _judge_directory(final.path, info))
    _extend(findings, _judge_parents(chain[:-1], final.path))
    return OpenedDirectory(Directory(final.path, opened, owner=info.st_uid), tuple(findings), created)


def check_directory_safety(path: str | os.PathLike) -> list[str]:
    """What would let another user change the queue directory at `path`; [] if nothing.

    The judgment of open_queue_directory (module docstring), without keeping
    the descriptor. Raises OSError if `path` cannot be walked.
    """
    opened = open_queue_directory(path)
    os.close(opened.directory.fd)
    return list(opened.findings)


def foreign_entries(directory: Directory) -> list[str]:
    """A finding for every entry of the open `directory` its owner does not own.

    walqueued refuses such a directory (docs/security.md): a file another
    user owns and can still open (a planted WAL segment) would carry the
    queue's writes to that user, or its records into the queue.
    """
    user = os.geteuid()
    findings = []
    for name in sorted(os.listdir(directory.fd)):
        try:
            owner = os.stat(name, dir_fd=directory.fd, follow_symlinks=False).st_uid
        except FileNotFoundError:
            continue
        if owner != user:
            findings.append(f"{_join(directory.path, name)} is owned by {_user_name(owner)}, not "
                            f"by {_user_name(user)} who serves the queue, so its owner may still "
                            f"read or change it: remove it, or chown {_login(user)} it if it is "
                            f"the queue's own")
    return findings


def _components(path: str) -> list[str]:
    """The names of `path` as a stack: the next one last."""
    return [part for part in reversed(path.split("/")) if part not in ("", ".")]


def _join(parent: str, name: str) -> str:
    return parent.rstrip("/") + "/" + name


def _extend(findings: list[str], more: list[str]) -> None:
    findings.extend(finding for finding in more if finding not in findings)


def _fsync_directory(path_fd: int) -> None:
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=path_fd)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _judge_directory(directory: str, info: os.stat_result) -> list[str]:
    user = os.geteuid()
    findings = []
    if info.st_uid != user:
        findings.append(f"{directory} is owned by {_user_name(info.st_uid)}, not by "
                        f"{_user_name(user)} who opens it, so its owner can plant files and links "
                        f"in it: chown {_login(user)} {directory}")
    if _writable_by_others(info):
        findings.append(f"{directory} is writable by {_writers(info.st_mode)} (mode "
                        f"{stat.S_IMODE(info.st_mode):04o}), who can plant files and links in it: "
                        f"chmod go-w {directory}")
    return findings


def _judge_parents(chain: list[tuple[int, _Step]], below: str) -> list[str]:
    """Rule 2 for the directories of `chain`, nearest first, up to the first one root owns;
    `below` is the path they lead to."""
    user = os.geteuid()
    findings = []
    for _, step in reversed(chain):
        info = step.info
        if info.st_uid not in (0, user):
            findings.append(f"{step.path}, a parent of {below}, is owned by "
                            f"{_user_name(info.st_uid)}, who could move the queue directory "
                            f"away and put another in its place: use a directory whose parents "
                            f"belong to root or {_user_name(user)}")
        elif _writable_by_others(info) and not (info.st_uid == 0 and info.st_mode & stat.S_ISVTX):
            findings.append(f"{step.path}, a parent of {below}, is writable by "
                            f"{_writers(info.st_mode)} (mode {stat.S_IMODE(info.st_mode):04o}), "
                            f"who could move the queue directory away and put another in its "
                            f"place: chmod go-w {step.path}")
        if info.st_uid == 0:
            break
    return findings


def _judge_link(chain: list[tuple[int, _Step]], name: str, link: os.stat_result) -> list[str]:
    """Rule 3: who may replace the link `name` in the last directory of `chain`."""
    user = os.geteuid()
    holder = chain[-1][1]
    info = holder.info
    path = _join(holder.path, name)
    if info.st_uid not in (0, user):
        return [f"{holder.path}, which holds the symbolic link {path} on the way to the queue "
                f"directory, is owned by {_user_name(info.st_uid)}, who could point the link "
                f"elsewhere: give walqueue the path the link leads to"]
    if _writable_by_others(info):
        if not (info.st_uid == 0 and info.st_mode & stat.S_ISVTX):
            return [f"{holder.path}, which holds the symbolic link {path} on the way to the queue "
                    f"directory, is writable by {_writers(info.st_mode)} (mode "
                    f"{stat.S_IMODE(info.st_mode):04o}), who could point the link elsewhere: "
                    f"chmod go-w {holder.path}, or give walqueue the path the link leads to"]
        if link.st_uid not in (0, user):
            return [f"the symbolic link {path} on the way to the queue directory is owned by "
                    f"{_user_name(link.st_uid)}, who could point it elsewhere: give walqueue the "
                    f"path the link leads to"]
    if info.st_uid == 0:
        return []
    return _judge_parents(chain[:-1], f"the symbolic link {path}")


def _writable_by_others(info: os.stat_result) -> bool:
    """Writable by a user other than the owner: by others, or by a group that is not private."""
    if info.st_mode & stat.S_IWOTH:
        return True
    return bool(info.st_mode & stat.S_IWGRP) and not _private_group(info.st_uid, info.st_gid)


def _private_group(uid: int, gid: int) -> bool:
    """True if `gid` is the user private group of `uid` (its primary group, its name, no members)."""
    import grp  # Unix only, as below
    import pwd
    try:
        user, group = pwd.getpwuid(uid), grp.getgrgid(gid)
    except KeyError:
        return False
    return user.pw_gid == gid and group.gr_name == user.pw_name and not set(group.gr_mem) - {user.pw_name}


def _writers(mode: int) -> str:
    both = mode & stat.S_IWGRP and mode & stat.S_IWOTH
    return "its group and others" if both else "its group" if mode & stat.S_IWGRP else "others"


def _user_name(uid: int) -> str:
    login = _login(uid)
    return f"uid {uid}" if login == str(uid) else f"{login} (uid {uid})"


def _login(uid: int) -> str:
    """The user's login name, or the uid as text when it has none."""
    import pwd  # Unix only, like the rest of the library (fcntl, O_NOFOLLOW)
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
