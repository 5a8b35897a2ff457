"""The scrubber on strings, nested structures and exceptions."""

from __future__ import annotations

import base64
import random
import re
from dataclasses import dataclass

import pytest
from cryptography.hazmat.primitives import serialization

from ichord.pki import scrub
from ichord.pki.bundle import generate_bundle
from ichord.pki.scrub import REDACTED, Scrubber


def _material(bundle_secret_pem: bytes) -> list[str]:
    text = bundle_secret_pem.decode()
    body_lines = [ln for ln in text.splitlines() if ln and not ln.startswith("-----")]
    return [text, base64.b64encode(bundle_secret_pem).decode(), "".join(body_lines), *body_lines]


def test_pem_and_base64_pem_removed_without_registration() -> None:
    s = Scrubber()
    b = generate_bundle()
    cert = b.k8s.cert_pem.decode()
    msg = f"x509: bad cert {cert} and blob {base64.b64encode(b.k8s.cert_pem).decode()} end"
    out = s.text(msg)
    assert "BEGIN" not in out and "LS0tLS1" not in out
    assert out.startswith("x509: bad cert ") and out.endswith(" end")
    assert out.count(REDACTED) == 2


def test_registered_key_encodings_removed() -> None:
    s = Scrubber()
    b = generate_bundle()
    s.register_all(b.secret_values())
    key = b.os.private_key
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())  # type: ignore[call-arg, arg-type]
    candidates = [
        *_material(b.os.key_pem or b""),
        *_material(b.k8s.key_pem or b""),
        raw.hex(),
        base64.b64encode(raw).decode(),
        b.bootstrap_token,
        b.trustd_token,
        b.cluster_secret,
        b.secretbox_encryption_secret or "",
    ]
    for c in candidates:
        out = s.text(f"error near <{c}> here")
        assert c not in out, c
        assert REDACTED in out


def test_nested_structures_and_exceptions() -> None:
    s = Scrubber()
    b = generate_bundle()
    s.register(b.trustd_token)
    s.register(b.k8s.key_pem or b"")

    @dataclass
    class Status:
        message: str
        items: tuple[str, ...]

    data = {"a": [b.trustd_token, {"deep": (b.k8s.key_pem, "fine")}], "st": Status(f"t={b.trustd_token}", ("ok",))}
    out = s.value(data)
    flat = repr(out)
    assert b.trustd_token not in flat and "BEGIN" not in flat
    assert out["st"]["items"] == ("ok",)
    assert out["a"][1]["deep"][1] == "fine"

    try:
        try:
            raise ValueError(f"cannot load {(b.k8s.key_pem or b'').decode()}")
        except ValueError as inner:
            raise RuntimeError(f"dial with token {b.trustd_token}") from inner
    except RuntimeError as exc:
        text = s.exception(exc)
    assert text.startswith("RuntimeError: dial with token [REDACTED]; caused by ValueError: cannot load [REDACTED]")
    assert b.trustd_token not in text


def test_short_or_ordinary_text_untouched() -> None:
    s = Scrubber()
    s.register("abc")  # too short to redact safely
    s.register("s3cr3t-value")
    assert s.text("abc def") == "abc def"
    assert s.text("the s3cr3t-value leaked") == f"the {REDACTED} leaked"
    assert s.text("node 10.0.0.1 unreachable: connection refused") == "node 10.0.0.1 unreachable: connection refused"


def test_pem_inside_a_larger_base64_blob_is_removed_at_any_alignment() -> None:
    s = Scrubber()
    b = generate_bundle()
    for lead in (b"", b"x", b"xy"):
        blob = base64.b64encode(lead + b"secrets:\n  key: |\n" + (b.k8s.key_pem or b"")).decode()
        out = s.text(f"secret data {blob}")
        body = (b.k8s.key_pem or b"").decode().splitlines()[1]
        assert REDACTED in out, lead
        # nothing of the key's base64 (as it appears in this blob) is left
        tail = blob[len(blob) // 2:]
        assert tail not in out, lead
        assert body not in out


def _alternation(needles: set[str], text: str) -> str:
    """The reference: one regex of every needle, longest first (what the scrubber compiled before issue 19)."""
    ordered = sorted(needles, key=len, reverse=True)
    return re.sub("|".join(re.escape(n) for n in ordered), REDACTED, text)


def test_needles_are_removed_as_a_longest_first_alternation_would() -> None:
    """Overlapping, nested and adjacent needles, at random places: leftmost first, the longest at a position."""
    rng = random.Random(19)
    alphabet = "abcAB+/=.-_ 0123"
    needles = {"abcabc", "abcabcabc", "bcabca", "AB+/=.AB", "AB+/=.", "0123abc", "c0123a", "......", "REDACTED"}
    s = Scrubber()
    s.register_all(needles)
    assert s._needles >= needles  # plus their base64 forms, also needles
    for _ in range(2000):
        parts = [rng.choice([*needles, "".join(rng.choices(alphabet, k=rng.randint(0, 9)))]) for _ in range(6)]
        text = "".join(parts)
        assert s.text(text) == _alternation(s._needles, text), text


def test_a_fleet_of_distinct_bundles_registers_without_recompiling_a_pattern(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each cluster's bundle joins the process-wide scrubber: one regex of every needle, recompiled per register,
    cost the 41st bundle ~14 s. Registration builds no pattern now, and every bundle's keys are still removed."""
    s = Scrubber()
    keys = [generate_bundle().os.key_pem for _ in range(3)]

    def no_compile(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("registering a secret compiled a regex")

    monkeypatch.setattr(scrub.re, "compile", no_compile)
    for key in keys:
        s.register(key)
    monkeypatch.undo()
    for key in keys:
        for m in _material(key):
            out = s.text(f"before {m} after")
            assert m.strip() not in out and out.startswith(f"before {REDACTED}") and out.endswith(" after"), m[:20]


def test_a_known_secret_is_not_derived_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step of an operation registers the bundle's keys again: a known key costs a lookup, not a parse."""
    s = Scrubber()
    key = generate_bundle().os.key_pem
    derived: list[bytes] = []
    real = scrub._key_encodings

    def counting(pem: bytes) -> set[str]:
        derived.append(pem)
        return real(pem)

    monkeypatch.setattr(scrub, "_key_encodings", counting)
    for _ in range(3):
        s.register(key)
    assert len(derived) == 1
    leaked = s.text(f"leaked {key.decode()}")
    assert REDACTED in leaked and "PRIVATE" not in leaked
