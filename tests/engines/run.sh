#!/usr/bin/env bash
# The engines tier: fst's package, built for the engines venv that
# scripts/install-deps.sh makes, then tests/engines run there (vLLM's and
# transformers' own classes). Exit 77 (skip) when the venv is not there.
# Usage: tests/engines/run.sh BUILD_DIR [pytest args...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
shift
venv=${FST_ENGINES_VENV:-/opt/fst-engines}
if [ ! -f "$venv/.fst-engines" ]; then
	echo "engines: no finished venv at $venv (scripts/install-deps.sh makes it; FST_ENGINES=0 skips it): skipped"
	exit 77
fi
site="$build/engines-site"
# The package is rebuilt for the venv's Python; pip only recompiles when
# the sources changed.
rm -rf "$site"
PIP_ROOT_USER_ACTION=ignore "$venv/bin/python" -m pip install -q --disable-pip-version-check \
	--no-deps --no-build-isolation --target "$site" "$repo"
cd "$build"
export PYTHONPATH="$site" FST_BIN="${FST_BIN:-$build/fst}" PYTHONUNBUFFERED=1
# With torch there, the package's torch tests run too (the main tier
# skips them: its Python has no torch).
torch_tests=()
for t in test_package_torch.py test_compat_fastsafetensors.py test_package_fastsafe.py \
	test_reference_api.py; do
	[ -f "$repo/tests/python/$t" ] && torch_tests+=("$repo/tests/python/$t")
done
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here" "${torch_tests[@]}" "$@"
