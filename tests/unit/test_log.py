"""Every log line goes through the scrubber, stdlib logging included."""

from __future__ import annotations

import io
import json
import logging

import structlog

from ichord import log
from ichord.pki.bundle import generate_bundle
from ichord.pki.scrub import SCRUBBER


def test_log_lines_are_json_and_scrubbed() -> None:
    bundle = generate_bundle()
    SCRUBBER.register_all(bundle.secret_values())
    buf = io.StringIO()
    log.configure("debug", stream=buf)
    try:
        logger = log.get_logger("test", cluster="demo")
        key = (bundle.os.key_pem or b"").decode()
        logger.info(
            "dial failed", error=f"bad key {key}", token=bundle.trustd_token, nested={"k": [bundle.cluster_secret]}
        )
        try:
            raise RuntimeError(f"apply failed with {bundle.bootstrap_token}")
        except RuntimeError:
            logger.exception("step crashed")
        logging.getLogger("some.library").warning("stdlib says %s", bundle.secretbox_encryption_secret)
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers.clear()
    text = buf.getvalue()
    lines = [json.loads(line) for line in text.splitlines()]
    assert [line["event"] for line in lines][:2] == ["dial failed", "step crashed"]
    assert lines[0]["cluster"] == "demo"
    assert "RuntimeError" in lines[1]["exception"]
    assert lines[2]["logger"] == "some.library"
    for secret in [*bundle.secret_values(), "BEGIN ED25519"]:
        assert secret not in text
    assert text.count("[REDACTED]") >= 5
