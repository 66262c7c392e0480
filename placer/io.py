"""Reading and writing placer's files safely.

Every JSON document placer reads goes through :func:`read_json`: at most
:data:`MAX_FILE_BYTES` bytes of a regular file or a pipe, nested at most
:data:`MAX_NESTING` deep, whatever the command. Every file placer writes goes
through :func:`write_atomic` (or :func:`write_files_atomic`, several files put
in place together), which

* writes a temporary file beside the output and renames it into place, so that
  a reader sees the previous file or the whole new one, never a part;
* replaces only a regular file: an output that exists and is a FIFO, a device
  or a socket is refused before any work (:func:`check_output`), except
  standard output (``-``, ``/dev/stdout``) and ``/dev/null``, which are written
  into, not replaced;
* never replaces one of the command's inputs: the files it names
  (``inputs``, the same file by device and inode, not by spelling) and, within
  a command (:func:`command_scope`), every file it has read;
* writes nothing once Ctrl-C has come (:func:`placer.terminate.raise_if_interrupted`),
  even where a library swallowed the interruption, and removes its temporary
  files on an error, Ctrl-C or SIGTERM.

docs/outputs.md says what this guarantees a user.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .errors import FormatError, PlacerError
from .terminate import raise_if_interrupted, signals_deferred, terminate_raises

__all__ = [
    "read_json",
    "read_bytes",
    "write_atomic",
    "write_files_atomic",
    "write_json_atomic",
    "write_text_atomic",
    "json_text",
    "check_output",
    "note_input",
    "command_scope",
    "same_file",
    "shown_bytes",
    "WriteError",
    "check_format",
    "check_finite",
    "Field",
    "shown",
    "MAX_FILE_BYTES",
    "MAX_NESTING",
]

#: The largest file placer reads, in bytes (512 MiB): a captured graph of 10^5 operations takes about
#: 50 MB, and a larger file would take more memory to parse than most machines have.
MAX_FILE_BYTES = 512 * 2**20
#: The deepest a JSON document may nest arrays and objects, for every command alike. Placer's own
#: files nest fewer than 10 deep; the limit leaves room for what other tools keep in a node's fields,
#: and is far below the depth at which Python's parser and writer run out of stack.
MAX_NESTING = 100


class WriteError(PlacerError, OSError):
    """An output file or folder cannot be written; the message names it (not the temporary file)."""


# ------------------------------------------------------------------ reading
def _kind(mode: int) -> str:
    """What a file that is not a regular file is, for a message."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path: str | os.PathLike, what: str, limit: int | None = None) -> bytes:
    """The bytes of the file at ``path``, a regular file or a pipe of at most ``limit`` bytes
    (default :data:`MAX_FILE_BYTES`); ``what`` names it in errors ("graph file").

    Within a command (:func:`command_scope`) the file counts as one of its inputs, which no output replaces.

    Raises
    ------
    FormatError
        No such file, a directory, a device or a socket (``/dev/zero`` would never end), a file
        larger than the limit, or one that cannot be read.
    """
    limit = MAX_FILE_BYTES if limit is None else limit
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise FormatError(f"{what} {path}: no such file") from None
    except OSError as exc:
        raise FormatError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise FormatError(f"{what} {path}: is a directory, not a file")
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISFIFO(info.st_mode)):
        raise FormatError(f"{what} {path}: is {_kind(info.st_mode)}, not a file")
    too_large = f"{what} {path}: larger than the {shown_bytes(limit)} placer reads (MAX_FILE_BYTES)"
    if info.st_size > limit:
        raise FormatError(too_large)
    try:
        with open(path, "rb") as handle:
            note_input(handle.fileno(), path)
            data = handle.read(limit + 1)
    except OSError as exc:
        raise FormatError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise FormatError(too_large)
    return data


def read_json(path: str | os.PathLike, what: str) -> Any:
    """Parse the JSON document at ``path``; ``what`` names it in errors ("graph file").

    The file is read by :func:`read_bytes` (its size limit), and its arrays and objects may nest at most
    :data:`MAX_NESTING` deep: the same limit for every command, however deep its call stack.
    """
    data = read_bytes(path, what)
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark (some Windows editors) is no error
    except UnicodeDecodeError:
        raise FormatError(f"{what} {path}: not a JSON text file (not UTF-8)") from None
    if not text.strip():
        raise FormatError(f"{what} {path}: the file is empty")
    if nesting(text) > MAX_NESTING:
        raise FormatError(
            f"{what} {path}: invalid JSON: nested too deeply (more than {MAX_NESTING} levels of arrays and objects)"
        )
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{what} {path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise FormatError(f"{what} {path}: invalid JSON: nested too deeply") from None
    except ValueError as exc:
        raise FormatError(f"{what} {path}: {exc}") from None


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def nesting(text: str) -> int:
    """How deep the arrays and objects of the JSON ``text`` nest (brackets within strings do not count).

    Counted without recursion, before the text is parsed, so that the limit does not depend on how
    much of Python's stack the caller has used.

    >>> nesting('{"a": [1, [2]], "b": "[[["}'), nesting("3")
    (3, 0)
    """

    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    codes = np.frombuffer(brackets.encode("ascii"), dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid number in placer files")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # json would keep the last silently; another reader may keep the first
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        named = next(
            (f" (the object with {k} {shown(obj[k])})" for k in ("id", "name") if isinstance(obj.get(k), str)), ""
        )
        raise ValueError(f"field {shown(key)} appears twice in one object{named}")
    return obj


# ------------------------------------------------------------- one command
@dataclass
class _Command:
    """What one command has read (device and inode -> path as given), and where its standard output went."""

    inputs: dict[tuple[int, int], str] = field(default_factory=dict)
    stdout: Any = None  # the standard output an output file took over; None while none has


_commands: list[_Command] = []


@contextlib.contextmanager
def command_scope() -> Iterator[None]:
    """Within it, every file read counts as an input of one command, which none of its outputs may replace,
    and an output to standard output takes it over: what the command prints goes to stderr meanwhile.

    The ``placer`` command runs each command in one; library calls outside any are unaffected (a
    program may read a plan, change it and save it over itself).
    """
    command = _Command()
    _commands.append(command)
    try:
        yield
    finally:
        _commands.remove(command)
        if command.stdout is not None:
            sys.stdout.flush()
            sys.stdout = command.stdout


def note_input(file: str | os.PathLike | int, name: str | os.PathLike | None = None) -> None:
    """Count ``file`` (a path, or an open file descriptor) as an input of the command running, if one is
    (:func:`command_scope`); ``name`` names it in messages (default: ``file``)."""
    if not _commands:
        return
    try:
        info = os.fstat(file) if isinstance(file, int) else os.stat(file)
    except OSError:
        return
    if stat.S_ISREG(info.st_mode):
        _commands[-1].inputs.setdefault((info.st_dev, info.st_ino), os.fspath(name if name is not None else file))


def _input_path(source: str | os.PathLike) -> str:
    """The file a command's input argument reads: the file of a model spec ``path/file.py:FACTORY``."""
    text = os.fspath(source)
    if not os.path.exists(text):
        path, sep, factory = text.rpartition(":")
        if sep and path.endswith(".py") and factory.isidentifier():
            return path
    return text


def _same_input(info: os.stat_result, inputs: Iterable[str | os.PathLike | None]) -> str | None:
    """The input (as given) that is the file ``info`` describes, by device and inode, if any."""
    for source in inputs:
        if not source:
            continue
        try:
            other = os.stat(_input_path(source))
        except (OSError, ValueError):
            continue
        if (other.st_dev, other.st_ino) == (info.st_dev, info.st_ino):
            return os.fspath(source)
    if _commands:
        return _commands[-1].inputs.get((info.st_dev, info.st_ino))
    return None


def _stdout_info() -> os.stat_result | None:
    try:
        return os.fstat(sys.__stdout__.fileno()) if sys.__stdout__ is not None else None
    except (OSError, ValueError):
        return None


def _sink(path: Path, info: os.stat_result | None) -> str | None:
    """``"stdout"`` where ``path`` is standard output (``-``, ``/dev/stdout``, the file it is redirected to),
    ``"null"`` for ``/dev/null``: outputs written into, not replaced. None for any other."""
    if os.fspath(path) == "-":
        return "stdout"
    if info is None:
        return None
    out = _stdout_info()
    if out is not None and (out.st_dev, out.st_ino) == (info.st_dev, info.st_ino):
        return "stdout"
    if stat.S_ISCHR(info.st_mode):
        null = os.stat(os.devnull)
        if (null.st_dev, null.st_ino) == (info.st_dev, info.st_ino):
            return "null"
    return None


def _take_stdout() -> None:
    """An output goes to standard output: within a command, what it prints goes to stderr from now on."""
    if _commands and _commands[-1].stdout is None and sys.stdout is not sys.stderr:
        sys.stdout.flush()
        _commands[-1].stdout = sys.stdout
        sys.stdout = sys.stderr


def check_output(
    path: str | os.PathLike, what: str = "file", folder: bool = False, inputs: Sequence[str | os.PathLike | None] = ()
) -> Path:
    """Raise WriteError unless ``path`` can be written as a file (``folder``: a folder); return it.

    Missing folders above it are fine (they are made); the nearest existing one
    must be a writable folder, a file must not be an existing folder, an
    existing file must be a regular file (or standard output, ``-``, or
    ``/dev/null``, written into), and it must not be one of the command's
    ``inputs`` (a model spec ``path/file.py:FACTORY`` names its file) nor,
    within a command, a file it has read: the same file by device and inode.
    """
    if not os.fspath(path):
        raise WriteError(f"cannot write {what} '': the path is empty")
    path = Path(path)
    try:
        info = None if os.fspath(path) == "-" else os.stat(path)
    except (OSError, ValueError):
        info = None
    if folder:
        if info is not None and not stat.S_ISDIR(info.st_mode):
            raise WriteError(f"cannot write {what} {path}: it is a file, not a folder")
    elif info is not None or os.fspath(path) == "-":
        if info is not None and stat.S_ISDIR(info.st_mode):
            raise WriteError(f"cannot write {what} {path}: is a directory")
        sink = _sink(path, info)
        if sink == "stdout":
            _take_stdout()
            return path
        if sink == "null":
            return path
        if not stat.S_ISREG(info.st_mode):
            raise WriteError(
                f"cannot write {what} {path}: it is {_kind(info.st_mode)}, not a regular file: placer "
                f"replaces only regular files (-o - writes to standard output)"
            )
        _refuse_input(path, info, what, inputs)
    above = path if folder else path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise WriteError(f"cannot write {what} {path}: {above} is a file, not a folder")
    if not os.access(above, os.W_OK | os.X_OK):
        raise WriteError(f"cannot write {what} {path}: folder {above} is not writable")
    return path


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether the paths ``a`` and ``b`` name one file: the same device and inode where both exist, else the
    same path once symbolic links and ``..`` are resolved.

    >>> same_file("/tmp/../tmp/x.json", "/tmp/x.json")
    True
    """
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _refuse_input(path: Path, info: os.stat_result, what: str, inputs: Iterable[str | os.PathLike | None] = ()) -> None:
    source = _same_input(info, inputs)
    if source is not None:
        raise WriteError(f"{what} {path} is the input file {source}; pick another output")


# ------------------------------------------------------------------ writing
def write_atomic(path: str | os.PathLike, write: Callable[[Path], None], what: str = "file") -> None:
    """Make ``path`` with ``write(tmp)``, a temporary file beside it, then rename that into place, so
    that readers see the old file or the whole new one; an error, Ctrl-C or SIGTERM part way leaves no
    temporary file, and the old file as it was.

    Standard output (``-``, ``/dev/stdout``) and ``/dev/null`` are written into instead, once the
    whole output is made.

    Raises
    ------
    WriteError
        Naming ``path`` as ``what``, where it cannot be written (:func:`check_output`).
    KeyboardInterrupt
        Ctrl-C came during the command, even where a library swallowed it: nothing is written.
    """
    write_files_atomic({path: write}, what)


def write_files_atomic(
    outputs: Mapping[str | os.PathLike, Callable[[Path], None]],
    what: str = "file",
    remove: Iterable[str | os.PathLike] = (),
) -> None:
    """Make every output of ``outputs`` (path -> ``write(tmp)``), each in a temporary file beside it, then
    put them all in place together and remove the files ``remove`` names, with Ctrl-C and SIGTERM held
    back meanwhile: a stopped command leaves either every previous file or every new one.

    Each path is checked as :func:`write_atomic` checks its one; ``what`` names them in errors.
    """
    paths = {Path(path): write for path, write in outputs.items()}
    for path in paths:
        check_output(path, what)
    made: dict[Path, Path] = {}
    at = next(iter(paths), Path())  # the output being written, for a message
    with terminate_raises():
        try:
            for at, write in paths.items():
                if _sink(at, _stat(at)) is None:
                    made[at] = _make(at, write)
            with signals_deferred():
                raise_if_interrupted()
                for at in made:
                    check_output(at, what)  # it may have become a FIFO, or been read, meanwhile
                for at, write in paths.items():
                    if at not in made:
                        _write_into(at, write)
                for at, tmp in made.items():
                    os.replace(tmp, at)
                for gone in remove:
                    Path(gone).unlink(missing_ok=True)
        except BaseException as exc:
            for tmp in made.values():
                tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError) and not isinstance(exc, WriteError):
                reason = exc.strerror or str(exc)
                raise WriteError(f"cannot write {what} {at}: {reason[:1].lower()}{reason[1:]}") from None
            raise


def _stat(path: Path) -> os.stat_result | None:
    try:
        return None if os.fspath(path) == "-" else os.stat(path)
    except (OSError, ValueError):
        return None


def _make(path: Path, write: Callable[[Path], None]) -> Path:
    """``write(tmp)`` into a new temporary file beside ``path``, with the permissions open() would give."""
    folder = path.parent if str(path.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    tmp = Path(name)
    try:
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the permissions open() would
        write(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _write_into(path: Path, write: Callable[[Path], None]) -> None:
    """Write standard output or /dev/null: the output made whole first in a temporary file, then copied."""
    with tempfile.TemporaryDirectory(prefix="placer-output-") as scratch:
        tmp = Path(scratch) / (path.name if path.name not in ("", "-") else "output")
        write(tmp)
        if _sink(path, _stat(path)) == "null":
            return
        out = _commands[-1].stdout if _commands and _commands[-1].stdout is not None else sys.stdout
        out.flush()
        with open(tmp, "rb") as source:
            target = getattr(out, "buffer", None)
            if target is not None:
                shutil.copyfileobj(source, target)
                target.flush()
            else:
                out.write(source.read().decode("utf-8", errors="replace"))
                out.flush()


def write_text_atomic(path: str | os.PathLike, text: str, what: str = "file") -> None:
    """Write ``text`` to ``path`` atomically (:func:`write_atomic`)."""
    write_atomic(path, text_writer(text), what)


def text_writer(text: str) -> Callable[[Path], None]:
    """A ``write(tmp)`` for :func:`write_atomic` that writes ``text`` in UTF-8 and syncs it to disk."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())

    return write


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def json_text(doc: Any) -> str:
    """``doc`` as the indented JSON text placer writes.

    Raises
    ------
    FormatError
        ``doc`` nests deeper than :data:`MAX_NESTING`: placer could not read the file back.
    """
    try:
        text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    except RecursionError:
        text = None
    if text is None or nesting(text) > MAX_NESTING:
        raise FormatError(
            f"the document nests more than {MAX_NESTING} levels of arrays and objects, which "
            f"placer does not read back; not written"
        )
    return text


def write_json_atomic(path: str | os.PathLike, doc: Any, what: str = "file") -> None:
    """Write ``doc`` as indented JSON, atomically."""
    write_text_atomic(path, json_text(doc), what)


def check_format(doc: Any, expected: str, where: str) -> None:
    """Check that ``doc`` is an object tagged ``"format": expected``."""
    if not isinstance(doc, dict):
        raise FormatError(f'{where}: expected a JSON object with "format": "{expected}"')
    tag = doc.get("format")
    if tag is None:
        raise FormatError(f"{where}: missing field 'format' (expected \"{expected}\")")
    if tag != expected:
        raise FormatError(f"{where}: field 'format' is {tag!r}, expected \"{expected}\"")


class Field:
    """Typed access to the fields of one JSON object, with errors that say where.

    ``where`` is the location used in messages, e.g. ``"graph g.json: node 'conv1'"``.
    """

    def __init__(self, obj: Any, where: str):
        if not isinstance(obj, dict):
            raise FormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        self.obj = obj
        self.where = where

    def _get(self, key: str, required: bool) -> Any:
        if key not in self.obj or self.obj[key] is None:
            if required:
                raise FormatError(f"{self.where}: missing required field '{key}'")
            return None
        return self.obj[key]

    def string(self, key: str, required: bool = False, default: str | None = None) -> str | None:
        value = self._get(key, required)
        if value is None:
            return default
        if not isinstance(value, str):
            raise FormatError(f"{self.where}: field '{key}' must be a string, got {shown(value)}")
        return value

    def number(
        self,
        key: str,
        required: bool = False,
        default: float | None = None,
        minimum: float | None = 0.0,
        positive: bool = False,
        maximum: float | None = None,
    ) -> float | None:
        value = self._get(key, required)
        if value is None:
            return default
        return check_number(value, f"{self.where}: field '{key}'", minimum=minimum, positive=positive, maximum=maximum)

    def integer(
        self, key: str, required: bool = False, default: int | None = None, minimum: int | None = 0
    ) -> int | None:
        value = self._get(key, required)
        if value is None:
            return default
        return check_integer(value, f"{self.where}: field '{key}'", minimum=minimum)

    def array(self, key: str, required: bool = False) -> list | None:
        value = self._get(key, required)
        if value is None:
            return None
        if not isinstance(value, list):
            raise FormatError(f"{self.where}: field '{key}' must be a list, got {type(value).__name__}")
        return value

    def mapping(self, key: str, required: bool = False) -> dict | None:
        value = self._get(key, required)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise FormatError(f"{self.where}: field '{key}' must be an object, got {type(value).__name__}")
        return value

    def extra(self, known: set[str]) -> dict:
        """Fields this version does not know; kept so that they survive a round trip."""
        extra = {k: v for k, v in self.obj.items() if k not in known}
        for key, value in extra.items():
            check_finite(value, f"{self.where}: field '{key}'")
        return extra


#: The longest a value is quoted in an error message: a file's junk (a long list, a nested object)
#: would make the one-line message of the command line run on for pages.
SHOWN_CHARS = 80


def shown(value: Any) -> str:
    """``repr(value)``, cut to :data:`SHOWN_CHARS` characters with the full length said where it is longer.

    >>> shown("x" * 200)
    "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... (202 characters)"
    """
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"


def shown_bytes(nbytes: float) -> str:
    """A memory size for a message: GiB with three decimals from 1 GiB, else MiB or KiB with one
    (a megabyte device read "0.000 GiB"), bytes below 1 KiB (100 bytes read "0.1 KiB").

    >>> shown_bytes(16 * 2**30), shown_bytes(3 * 2**20), shown_bytes(196_608), shown_bytes(100)
    ('16.000 GiB', '3.0 MiB', '192.0 KiB', '100 bytes')
    """
    for unit, size, digits in (("GiB", 2**30, 3), ("MiB", 2**20, 1), ("KiB", 2**10, 1)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.{digits}f} {unit}"
    return f"{round(nbytes):,} bytes"


def shown_sizes(need: float, have: float) -> tuple[str, str]:
    """Two memory sizes a message compares, by :func:`shown_bytes`; in bytes where they would read the
    same yet differ ("needs 59.0 MiB of 59.0 MiB").

    >>> shown_sizes(3 * 2**20 + 1, 3 * 2**20)
    ('3,145,729 bytes', '3,145,728 bytes')
    """
    shown = shown_bytes(need), shown_bytes(have)
    if need != have and shown[0] == shown[1]:
        return f"{round(need):,} bytes", f"{round(have):,} bytes"
    return shown


def check_finite(value: Any, where: str) -> None:
    """Raise FormatError if the JSON ``value`` holds a float that is not finite.

    A file's 1e400 reads as inf, which no JSON file can hold: a document keeping it could not be saved.
    """
    stack = [value]  # not recursive: the JSON may nest as deeply as the parser allows
    while stack:
        value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise FormatError(f"{where} must be finite, got {shown(value)}")
        stack.extend(value.values() if isinstance(value, dict) else value if isinstance(value, list) else ())


def check_number(
    value: Any, where: str, minimum: float | None = 0.0, positive: bool = False, maximum: float | None = None
) -> float:
    """A finite real number (not a bool), at least ``minimum``, at most ``maximum``, and > 0 if ``positive``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FormatError(f"{where} must be a number, got {shown(value)}")
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise FormatError(f"{where} must be finite, got {shown(value)}")
    if positive and value <= 0:
        raise FormatError(f"{where} must be > 0, got {shown(value)}")
    if minimum is not None and value < minimum:
        raise FormatError(f"{where} must be >= {minimum:g}, got {shown(value)}")
    if maximum is not None and value > maximum:
        raise FormatError(f"{where} is too large ({value!r} > {maximum:g})")
    return value


MAX_INTEGER = 2**62  # sizes are held as int64; sums of many must not overflow


def check_integer(value: Any, where: str, minimum: int | None = 0) -> int:
    """An integer (an integral float such as 1.2e10 is accepted), at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FormatError(f"{where} must be an integer, got {shown(value)}")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise FormatError(f"{where} must be an integer, got {shown(value)}")
        value = int(value)
    if minimum is not None and value < minimum:
        raise FormatError(f"{where} must be >= {minimum}, got {shown(value)}")
    if abs(value) > MAX_INTEGER:
        digits = len(str(abs(value)))
        raise FormatError(f"{where} is too large (a number of {digits} digits, more than 2**62)")
    return value
