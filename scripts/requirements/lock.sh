#!/usr/bin/env bash
# Writes the hash-pinned requirement files beside this script from the top-level pins
# below: pip downloads each set with its dependencies (for this machine's Python and
# platform) and every file's sha256 is recorded. Run it after changing a pin, review the
# diff, commit the .txt files.
#
#   scripts/requirements/lock.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
declare -A sets=(
    [deploy-tools]="kubernetes-validate==1.37.0 check-jsonschema==0.39.0"
    [fleet-test]="schemathesis==3.39.16 hypothesis==6.127.0"
    [componentize-py]="componentize-py==0.25.1"
)
declare -A what=(
    [deploy-tools]="The manifest validators scripts/check-deploy.sh runs (scripts/setup.sh --test)."
    [fleet-test]="schemathesis for the fleet test (scripts/fleet-test.sh)."
    [componentize-py]="componentize-py, which builds Python plugins (scripts/build-python-plugin.sh)."
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
for name in "${!sets[@]}"; do
    # shellcheck disable=SC2086 # the set is a list of requirements
    "$tmp/venv/bin/pip" download -q -d "$tmp/$name" ${sets[$name]}
    {
        printf '# %s\n' "${what[$name]}"
        cat <<'HEAD'
# Every package, dependencies included, at one version with the sha256 of the file pip
# picks on Debian 12's CPython 3.11 (x86_64), installed with --require-hashes: a file that
# changes on the index is refused. Made by scripts/requirements/lock.sh; see
# docs/security.md, "Pinned artefacts".
HEAD
        "$tmp/venv/bin/python" - "$tmp/$name" <<'PY'
import hashlib, os, sys
from pip._vendor.packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
d = sys.argv[1]
pins = {}
for f in sorted(os.listdir(d)):
    n, v = parse_wheel_filename(f)[:2] if f.endswith(".whl") else parse_sdist_filename(f)
    with open(os.path.join(d, f), "rb") as fh:
        pins.setdefault((canonicalize_name(n), str(v)), []).append(hashlib.sha256(fh.read()).hexdigest())
for (n, v), hashes in sorted(pins.items()):
    print(f"{n}=={v} \\")
    print(" \\\n".join(f"    --hash=sha256:{h}" for h in hashes))
PY
    } >"$here/$name.txt"
    echo "lock: $here/$name.txt" >&2
done
