"""The scrubber: the last line of defence between secret material and any message.

It removes from strings, exceptions and nested structures:
- every PEM block (certificates included: status, Events and logs name CAs by subject and
  fingerprint, never by their PEM);
- base64 of PEM text (the bundle and v1alpha1 encoding), recognised by its fixed prefix;
- the encodings of every secret it was told about (``register``): the value itself, its base64,
  the base64 body of a PEM key (joined, and line by line), DER/raw key bytes in hex and base64.
Every later status message, condition, Event and log line goes through it.
"""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from ichord.errors import IchordError
from ichord.pki import pem as _pem

REDACTED = "[REDACTED]"
_PEM_ANY = re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|\Z)", re.DOTALL)


def _b64_markers(marker: bytes) -> list[str]:
    """The base64 text that ``marker`` always encodes to, at each of the three byte alignments.

    A PEM block inside a larger base64 blob (a whole secrets.yaml in a Secret, say) starts at any
    offset, so its armour shows as one of three strings; the characters that also depend on the
    neighbouring bytes are left out.
    """
    out = []
    for shift in range(3):
        variants = [base64.b64encode(lead * shift + marker + tail).decode()
                    for lead in (b"\x00", b"\xff") for tail in (b"\x00\x00\x00", b"\xff\xff\xff")]
        first = variants[0]
        fixed = [all(v[i] == first[i] for v in variants) for i in range(len(first))]
        best, start = (0, 0), None
        for i, ok in enumerate([*fixed, False]):
            if ok and start is None:
                start = i
            elif not ok and start is not None:
                best = max(best, (start, i), key=lambda r: r[1] - r[0])
                start = None
        out.append(first[best[0]:best[1]])
    return out


# base64 of PEM armour ("LS0tLS1CRUdJTi" is base64("-----BEGIN")) at any alignment, and what follows.
_B64_PEM = re.compile(
    "(?:" + "|".join(re.escape(m) for m in _b64_markers(b"-----BEGIN ") + _b64_markers(b"-----END ")) + ")"
    + r"[A-Za-z0-9+/=]*"
)
# A PEM body line that survived without its armour (64 base64 chars).
_MIN_FRAGMENT = 16
# Every needle is at least this long; its first _GRAM characters index it.
_GRAM = 6


def _key_encodings(pem_text: bytes) -> set[str]:
    out: set[str] = set()
    for block in _pem.pem_blocks(pem_text):
        lines = [ln.strip() for ln in block.decode(errors="replace").splitlines() if ln and not ln.startswith("-----")]
        body = "".join(lines)
        out.add(body)
        out.update(ln for ln in lines if len(ln) >= _MIN_FRAGMENT)
        try:
            der = base64.b64decode(body)
            out.add(der.hex())
            out.add(base64.b64encode(der).decode())
        except ValueError:
            pass
    try:
        key = _pem.load_private_key(pem_text)
    except _pem.PEMError:
        return out
    raw: bytes | None = None
    if isinstance(key, ed25519.Ed25519PrivateKey):
        raw = key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
    elif isinstance(key, ec.EllipticCurvePrivateKey):
        raw = key.private_numbers().private_value.to_bytes(32, "big")
    elif isinstance(key, rsa.RSAPrivateKey):
        raw = key.private_numbers().d.to_bytes((key.key_size + 7) // 8, "big")
    if raw is not None:
        out.update({raw.hex(), base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode().rstrip("=")})
    return out


class Scrubber:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._needles: set[str] = set()
        # Needles by their first _GRAM characters, longest first. One regex of every needle was recompiled on each
        # register: a fleet of distinct bundles made that quadratic (the 41st bundle's registration took ~14 s).
        self._index: dict[str, tuple[str, ...]] = {}

    def register(self, secret: str | bytes) -> None:
        """Remember a secret (a PEM key, a token, a password) so every encoding of it is removed."""
        text = secret.decode(errors="replace") if isinstance(secret, bytes) else secret
        if len(text) < 6 or text in self._needles:
            # Too short to remove without destroying ordinary words, or known (a secret is its own needle): every
            # step of an operation registers the bundle's keys again, and deriving a key's encodings parses it.
            return
        needles = {text, base64.b64encode(text.encode()).decode()}
        if "-----BEGIN" in text:
            needles |= _key_encodings(text.encode())
        with self._lock:
            for needle in needles:
                if len(needle) >= _GRAM and needle not in self._needles:
                    self._needles.add(needle)
                    key = needle[:_GRAM]
                    self._index[key] = tuple(sorted((*self._index.get(key, ()), needle), key=len, reverse=True))

    def register_all(self, secrets: Iterable[str | bytes]) -> None:
        for s in secrets:
            self.register(s)

    def text(self, value: str) -> str:
        out = _PEM_ANY.sub(REDACTED, value)
        out = _B64_PEM.sub(REDACTED, out)
        return self._remove_needles(out)

    def _remove_needles(self, text: str) -> str:
        """Each registered needle, leftmost first and the longest at a position first (a regex alternation of
        them all, longest first, would do the same), at a cost that grows with the text, not the needle count."""
        index = self._index
        starts = [i for i in range(len(text) - _GRAM + 1) if text[i:i + _GRAM] in index] if index else []
        if not starts:
            return text
        parts: list[str] = []
        done = 0  # text[:done] is decided
        for i in starts:
            if i < done:
                continue  # inside a needle already removed
            for needle in index.get(text[i:i + _GRAM], ()):
                if text.startswith(needle, i):
                    parts += (text[done:i], REDACTED)
                    done = i + len(needle)
                    break
        parts.append(text[done:])
        return "".join(parts)

    def exception(self, exc: BaseException) -> str:
        """A safe one-line description for conditions and Events: the type and the scrubbed message.

        The causes follow only while no IchordError has been reached: a typed error's message already
        summarises what went wrong underneath (``chain`` keeps everything, for the debug log).
        """
        return self._describe(exc, whole=False)

    def chain(self, exc: BaseException) -> str:
        """Every exception under ``exc``, scrubbed, joined by "; caused by " (for the debug log)."""
        return self._describe(exc, whole=True)

    def _describe(self, exc: BaseException, *, whole: bool) -> str:
        parts = []
        seen: set[int] = set()
        cur: BaseException | None = exc
        while cur is not None and id(cur) not in seen:
            seen.add(id(cur))
            msg = str(cur)
            parts.append(f"{type(cur).__name__}: {self.text(msg)}" if msg else type(cur).__name__)
            if not whole and isinstance(cur, IchordError):
                break
            cur = cur.__cause__ or (None if cur.__suppress_context__ and not whole else cur.__context__)
        return "; caused by ".join(parts)

    def value(self, obj: Any) -> Any:
        """Scrub a nested structure (dicts, lists, tuples, sets, dataclasses, exceptions, bytes)."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, bytes | bytearray):
            return self.text(bytes(obj).decode(errors="replace"))
        if isinstance(obj, BaseException):
            return self.exception(obj)
        if isinstance(obj, Mapping):
            return {self.value(k): self.value(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple | set | frozenset):
            items = [self.value(v) for v in obj]
            return items if isinstance(obj, list) else type(obj)(items)
        if is_dataclass(obj) and not isinstance(obj, type):
            return {f.name: self.value(getattr(obj, f.name)) for f in fields(obj)}
        return obj


#: The process-wide scrubber every log line, status message and Event goes through.
SCRUBBER = Scrubber()


def scrub(value: Any) -> Any:
    return SCRUBBER.value(value)


def scrub_text(value: str) -> str:
    return SCRUBBER.text(value)
