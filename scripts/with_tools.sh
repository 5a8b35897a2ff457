#!/usr/bin/env bash
# Runs a command (the test suite) with the real tier's tools: builds them with scripts/tools.sh when
# Go is present and $ICHORD_TOOLS_BIN is not already set (cached per pin set: a no-op when built),
# then exports ICHORD_TOOLS_BIN, or ICHORD_TOOLS_ERROR when the build failed so the tests that need
# a missing binary skip with the build's reason instead of a generic one.
#
#   scripts/with_tools.sh COMMAND [ARG...]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [[ -z ${ICHORD_TOOLS_BIN:-} ]]; then
    if command -v go >/dev/null; then
        echo "with_tools.sh: building the real tier's tools if they are not cached (scripts/tools.sh; a cold build takes 20-25 min on 2 cores, Prometheus and Alertmanager the longest)" >&2
        log=$(mktemp)
        if "$root/scripts/tools.sh" 2>&1 | tee "$log" >&2; then
            ICHORD_TOOLS_BIN=$(tail -1 "$log")
            export ICHORD_TOOLS_BIN
        else
            ICHORD_TOOLS_ERROR="scripts/tools.sh failed: $(grep -v '^\s*$' "$log" | tail -1)"
            export ICHORD_TOOLS_ERROR
            echo "with_tools.sh: $ICHORD_TOOLS_ERROR; the real-tier tests whose binary is missing will skip" >&2
        fi
        rm -f "$log"
    else
        echo "with_tools.sh: go is not installed, so the real tier's tools cannot be built; its tests skip" >&2
    fi
fi
exec "$@"
