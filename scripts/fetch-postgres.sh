#!/usr/bin/env bash
# Fetches a PostgreSQL 16 with pgvector for the tests and demos of the shared store (`--db
# postgres://...`): the PyPI wheel pgserver==0.1.4 (manylinux x86-64) ships `postgres`, `initdb`,
# `pg_ctl`, `psql` and pgvector 0.6's `vector.so` + extension SQL. Debian bookworm has PostgreSQL
# but no pgvector package, so the wheel is the one offline-installable source with both.
#
#   pgserver/pginstall/ and pgserver.libs/ of the wheel -> .postgres/   ($FORGE_POSTGRES_DIR moves it;
#   git-ignored; the binaries find their libraries through an rpath relative to that layout)
#   -> the binaries in .postgres/pgserver/pginstall/bin
#
# The wheel is fetched with `pip download` (sha256-checked) and unpacked; nothing is installed into
# any Python. Idempotent: prints "postgres present" when the folder is already there.
# scripts/fetch-test-clients.sh calls it, so README's test command fetches it too.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${FORGE_POSTGRES_DIR:-$ROOT/.postgres}"
PYTHON="${PYTHON:-python3}"
SPEC="pgserver==0.1.4"
WHEEL="pgserver-0.1.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
WHEEL_SHA256="d595789b47624a3d963aa9aa6359da9be31beb7e61f1a45541953242068b8813"
STAMP_WANT="$WHEEL_SHA256"

log() { echo "fetch-postgres: $*"; }
die() { echo "fetch-postgres: error: $*" >&2; exit 1; }

if [[ -f "$DEST/stamp" && "$(cat "$DEST/stamp")" == "$STAMP_WANT" && -x "$DEST/pgserver/pginstall/bin/postgres" ]]; then
  log "postgres present in $DEST"
  exit 0
fi
[[ "$(uname -m)" == x86_64 ]] || die "the pgserver wheel is x86-64 only; on $(uname -m) point FORGE_POSTGRES_DIR at a PostgreSQL 16 install with pgvector"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip (Debian: apt-get install python3-pip)"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
log "downloading $SPEC (pip download, the manylinux wheel; its binaries do not depend on Python's version)"
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
  --platform manylinux2014_x86_64 --disable-pip-version-check --progress-bar off -q -d "$WORK" "$SPEC" \
  || die "pip download $SPEC failed (is PyPI reachable?)"
"$PYTHON" - "$WORK/$WHEEL" "$WHEEL_SHA256" "$DEST.new" <<'PY'
import hashlib, os, stat, sys, zipfile
path, want, dest = sys.argv[1:4]
got = hashlib.sha256(open(path, "rb").read()).hexdigest()
if got != want:
    sys.exit("fetch-postgres: error: %s has sha256 %s, expected %s" % (os.path.basename(path), got, want))
prefixes = ("pgserver/pginstall/", "pgserver.libs/")
with zipfile.ZipFile(path) as z:
    n = 0
    for info in z.infolist():
        if not info.filename.startswith(prefixes) or info.filename.endswith("/"):
            continue
        out = os.path.join(dest, info.filename)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as src, open(out, "wb") as dst:
            dst.write(src.read())
        mode = (info.external_attr >> 16) & 0o777
        os.chmod(out, mode or 0o644)
        n += 1
print("fetch-postgres: unpacked %d files" % n)
PY
chmod -R a+rX "$DEST.new"
BIN="$DEST.new/pgserver/pginstall/bin"
for b in postgres initdb pg_ctl psql; do chmod a+rx "$BIN/$b"; done
[[ -f "$DEST.new/pgserver/pginstall/lib/postgresql/vector.so" ]] || die "the wheel has no pgvector (lib/postgresql/vector.so)"
echo "$STAMP_WANT" > "$DEST.new/stamp"
rm -rf "$DEST"
mv "$DEST.new" "$DEST"
log "postgres $("$DEST/pgserver/pginstall/bin/postgres" --version | awk '{print $3}') with pgvector in $DEST"
