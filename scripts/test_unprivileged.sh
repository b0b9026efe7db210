#!/usr/bin/env bash
# The sandbox's isolation and adversarial suites as an unprivileged user (uid 65534), from a root shell (CI runs
# as root). The user sees the host as it is, except the homes: a tmpfs, with the Python install bound back
# read-only, and a checkout in a private directory, opened the same way (the host's permissions stay as they are).
# RETOOL_HIDE_BWRAP=1 also hides bubblewrap (/dev/null bound over it): the sandbox must not need it.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    exec .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_sandbox_isolation.py tests/test_sandbox_adversarial.py "$@"
fi
base=$(.venv/bin/python -c 'import sys; print(sys.base_prefix)')
home=$(mktemp -d /tmp/retool-unprivileged-home.XXXXXX)
chown 65534:65534 "$home"
trap 'rm -rf "$home"; rmdir /run/retool-python /run/retool-checkout 2>/dev/null || true' EXIT
# A private mount namespace (not bubblewrap: its partly covered /proc would stop the sandbox from mounting its own),
# the Python install held aside, the homes covered, the install bound back.
unshare --mount --propagation private -- bash -euc '
    base=$1 home=$2; shift 2
    if [ "${RETOOL_HIDE_BWRAP:-0}" = 1 ] && bwrap=$(command -v bwrap); then mount --bind /dev/null "$bwrap"; fi
    mkdir -p /run/retool-python && mount --bind "$base" /run/retool-python
    for dir in /root /home; do [ -d "$dir" ] && mount -t tmpfs -o mode=0755 tmpfs "$dir"; done
    mkdir -p "$base" && mount --bind /run/retool-python "$base" && mount -o remount,bind,ro "$base"
    checkout=$PWD
    if ! setpriv --reuid 65534 --regid 65534 --clear-groups test -x "$checkout"; then
        # A private checkout (mktemp -d makes it 0700): a 0755 tmpfs over it, its entries bound back.
        mkdir -p /run/retool-checkout && mount --bind "$checkout" /run/retool-checkout
        mount -t tmpfs -o mode=0755 tmpfs "$checkout"
        for entry in /run/retool-checkout/* /run/retool-checkout/.[!.]*; do
            [ -e "$entry" ] || continue
            target=$checkout/${entry##*/}
            if [ -d "$entry" ]; then mkdir "$target"; else touch "$target"; fi
            mount --bind "$entry" "$target"
        done
        cd "$checkout"
    fi
    exec env HOME="$home" setpriv --reuid 65534 --regid 65534 --clear-groups --inh-caps=-all --bounding-set=-all -- \
        .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_sandbox_isolation.py \
        tests/test_sandbox_adversarial.py "$@"
' _ "$base" "$home" "$@"
