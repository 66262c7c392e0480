"""Reading and writing placer's JSON documents safely.

Files are written atomically (a temporary file in the same folder, then a
rename) so that an interrupted run never leaves a half-written plan behind.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from .errors import FormatError, PlacerError

__all__ = ["read_json", "write_atomic", "write_json_atomic", "write_text_atomic", "json_text", "check_output", "shown_bytes", "WriteError",
           "check_format", "check_finite", "Field", "shown"]


class WriteError(PlacerError, OSError):
    """An output file or folder cannot be written; the message names it (not the temporary file)."""


def read_json(path: str | os.PathLike, what: str) -> Any:
    """Parse the JSON document at ``path``; ``what`` names it in errors ("graph file")."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")     # a byte-order mark (some Windows editors) is no error
    except FileNotFoundError:
        raise FormatError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise FormatError(f"{what} {path}: is a directory, not a file") from None
    except UnicodeDecodeError:
        raise FormatError(f"{what} {path}: not a JSON text file (not UTF-8)") from None
    except OSError as exc:
        raise FormatError(f"{what} {path}: cannot read: {exc}") from None
    if not text.strip():
        raise FormatError(f"{what} {path}: the file is empty")
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{what} {path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise FormatError(f"{what} {path}: invalid JSON: nested too deeply") from None
    except ValueError as exc:
        raise FormatError(f"{what} {path}: {exc}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid number in placer files")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):      # json would keep the last silently; another reader may keep the first
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        named = next((f" (the object with {k} {obj[k]!r})" for k in ("id", "name") if isinstance(obj.get(k), str)), "")
        raise ValueError(f"field {key!r} appears twice in one object{named}")
    return obj


def check_output(path: str | os.PathLike, what: str = "file", folder: bool = False,
                 inputs: Sequence[str | os.PathLike | None] = ()) -> Path:
    """Raise WriteError unless ``path`` can be written as a file (``folder``: a folder); return it.

    Missing folders above it are fine (they are made); the nearest existing one
    must be a writable folder, a file must not be an existing folder, and the
    path must not be one of the command's ``inputs`` (read after it is made).
    """
    if not os.fspath(path):
        raise WriteError(f"cannot write {what} '': the path is empty")
    path = Path(path)
    if path.is_dir() and not folder:
        raise WriteError(f"cannot write {what} {path}: is a directory")
    if path.exists() and folder and not path.is_dir():
        raise WriteError(f"cannot write {what} {path}: it is a file, not a folder")
    above = path if folder else path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise WriteError(f"cannot write {what} {path}: {above} is a file, not a folder")
    if not os.access(above, os.W_OK | os.X_OK):
        raise WriteError(f"cannot write {what} {path}: folder {above} is not writable")
    for source in inputs:
        if source and os.path.exists(source) and path.exists() and os.path.samefile(path, source):
            raise WriteError(f"{what} {path} is the input file {source}; pick another output")
    return path


def write_atomic(path: str | os.PathLike, write: Callable[[Path], None], what: str = "file") -> None:
    """Make ``path`` with ``write(tmp)``, a temporary file beside it, then rename that into place, so
    that readers see the old file or the whole new one; an error or Ctrl-C part way leaves no temporary file.

    Raises WriteError, naming ``path`` as ``what``, where it cannot be written.
    """
    path = check_output(path, what)
    folder = path.parent if str(path.parent) else Path(".")
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the permissions open() would
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            reason = exc.strerror or str(exc)
            raise WriteError(f"cannot write {what} {path}: {reason[:1].lower()}{reason[1:]}") from None
        raise


def write_text_atomic(path: str | os.PathLike, text: str, what: str = "file") -> None:
    """Write ``text`` to ``path`` atomically (:func:`write_atomic`)."""
    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())

    write_atomic(path, write, what)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def json_text(doc: Any) -> str:
    """``doc`` as the indented JSON text placer writes."""
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def write_json_atomic(path: str | os.PathLike, doc: Any, what: str = "file") -> None:
    """Write ``doc`` as indented JSON, atomically."""
    write_text_atomic(path, json_text(doc), what)


def check_format(doc: Any, expected: str, where: str) -> None:
    """Check that ``doc`` is an object tagged ``"format": expected``."""
    if not isinstance(doc, dict):
        raise FormatError(f"{where}: expected a JSON object with \"format\": \"{expected}\"")
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

    def number(self, key: str, required: bool = False, default: float | None = None,
               minimum: float | None = 0.0, positive: bool = False,
               maximum: float | None = None) -> float | None:
        value = self._get(key, required)
        if value is None:
            return default
        return check_number(value, f"{self.where}: field '{key}'", minimum=minimum, positive=positive,
                            maximum=maximum)

    def integer(self, key: str, required: bool = False, default: int | None = None,
                minimum: int | None = 0) -> int | None:
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
    stack = [value]     # not recursive: the JSON may nest as deeply as the parser allows
    while stack:
        value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise FormatError(f"{where} must be finite, got {shown(value)}")
        stack.extend(value.values() if isinstance(value, dict) else value if isinstance(value, list) else ())


def check_number(value: Any, where: str, minimum: float | None = 0.0, positive: bool = False,
                 maximum: float | None = None) -> float:
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
