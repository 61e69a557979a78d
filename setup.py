"""Builds the fst extension from libfst's sources.

Needs jansson and liburing headers (scripts/install-deps.sh installs them;
FST_DEPS_PREFIX points at an unpacked copy elsewhere). liburing is linked
statically when its archive is there, so the extension runs where liburing
is not installed.
"""
import glob
import os

from setuptools import Extension, setup

here = os.path.dirname(os.path.abspath(__file__))
prefix = os.environ.get("FST_DEPS_PREFIX", "")
MODULES = ["base", "format", "plan", "io", "gpu", "load"]
include_dirs = [os.path.join(here, "include")] + [os.path.join(here, "src", m) for m in MODULES]
library_dirs = []
if prefix:
    include_dirs.append(os.path.join(prefix, "usr/include"))
    library_dirs.append(os.path.join(prefix, "usr/lib/x86_64-linux-gnu"))

extra_objects, libraries = [], ["jansson", "dl", "pthread"]
for d in library_dirs + ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"]:
    a = os.path.join(d, "liburing.a")
    if os.path.exists(a):
        extra_objects.append(a)
        break
else:
    libraries.append("uring")
if prefix and not os.path.exists(os.path.join(prefix, "usr/lib/x86_64-linux-gnu/libjansson.so")):
    libraries[0] = ":libjansson.so.4"  # only the runtime library is there

sources = ["python/fst/_fst.c"] + sorted(
    os.path.relpath(p, here) for p in glob.glob(os.path.join(here, "src", "*", "*.c")))

setup(options={"build": {"build_base": "build/python"}}, ext_modules=[Extension(
    "fst._fst",
    sources=sources,
    include_dirs=include_dirs,
    library_dirs=library_dirs,
    libraries=libraries,
    extra_objects=extra_objects,
    define_macros=[("_GNU_SOURCE", None)],
    extra_compile_args=["-std=c11", "-fvisibility=hidden", "-O2", "-Wall", "-Wextra",
                        "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
)])
