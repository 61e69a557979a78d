#!/usr/bin/env bash
# Runs the reference safetensors package's own Python tests against fst's
# reference API (fst.compat.safetensors), or against the reference itself.
#
#   scripts/peer-tests-safetensors.sh fst [pytest args...]
#   scripts/peer-tests-safetensors.sh reference [pytest args...]
#
# The tests come from the safetensors mirror (MIRROR, a bare git repository;
# REV, default HEAD), unpacked into a temporary folder and never into this
# repository. For "fst", a package named `safetensors` is put first on the
# path whose modules (safetensors, safetensors.torch, safetensors.numpy) only
# rename fst.compat.safetensors and its submodules; nothing else changes.
# For "reference" the tests import the safetensors that PYTHON has installed.
# The framework comparisons for flax, mlx, paddle and tensorflow are left
# out (TESTS overrides the list). PYTHON runs pytest (default python3); fst
# and pytest must be importable by it (PYTHONPATH is kept). The exit status
# is pytest's.
set -uo pipefail
MODE=${1:-fst}
shift || true
MIRROR=${MIRROR:-/work/.mirror/huggingface+safetensors/repo}
REV=${REV:-HEAD}
PYTHON=${PYTHON:-python3}
TESTS=${TESTS:-"test_simple.py test_pt_comparison.py test_pt_model.py test_handle.py
	test_pread_backend.py test_multithreaded.py test_threadable.py"}
case "$MODE" in
fst | reference) ;;
*)
	echo "usage: $0 fst|reference [pytest args...]" >&2
	exit 2
	;;
esac
tmp=$(mktemp -d /tmp/peer-safetensors.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
git --git-dir="$MIRROR" archive "$REV" bindings/python/tests | tar -x -C "$tmp" || exit 2
if [ "$MODE" = fst ]; then
	mkdir -p "$tmp/shim/safetensors"
	for m in __init__ torch numpy; do
		target=fst.compat.safetensors
		[ "$m" = __init__ ] || target="$target.$m"
		cat >"$tmp/shim/safetensors/$m.py" <<-EOF
			# $target under the reference's name: every name, nothing added
			import $target as _impl
			globals().update({k: v for k, v in vars(_impl).items()
			                  if not k.startswith("__") or k in ("__all__", "__version__")})
			del _impl
		EOF
	done
	export PYTHONPATH="$tmp/shim${PYTHONPATH:+:$PYTHONPATH}"
	# the tests must see the shim, not an installed safetensors
	"$PYTHON" -c 'import safetensors, sys; assert "shim" in safetensors.__file__, safetensors.__file__' || exit 2
fi
# the tests write their files under ./tests/data and ., from bindings/python
cd "$tmp/bindings/python" || exit 2
paths=()
for t in $TESTS; do paths+=("tests/$t"); done
"$PYTHON" -m pytest -p no:cacheprovider -q -rfEs "${paths[@]}" "$@" 2>&1
