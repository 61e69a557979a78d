"""Builds the fst extension, fst._fst, over libfst's one build.

libfst is CMake's: setup.py configures build/python-lib (-DFST_TESTS=OFF
-DFST_CLI=OFF: the libraries alone), builds its fst_static target with Ninja
(position-independent objects, hidden symbols, the project's warnings as
errors; CMakeLists.txt's FST_SOURCES is the one list of libfst's sources) and
links the extension against that archive. cmake and ninja must be on the
PATH; ninja's parallelism is its own unless CMAKE_BUILD_PARALLEL_LEVEL or
`build_ext -j` says otherwise.

The extension links what CMakeLists.txt links libfst.so with, taken from the
CMake cache: liburing statically (URING_STATIC), so it runs where liburing is
not installed, and jansson as a shared library (JANSSON_SHARED: Debian's
libjansson.a is not position-independent). libfst's and liburing's symbols
stay inside the extension (-Wl,--exclude-libs,ALL); its own are hidden
(-fvisibility=hidden) but for PyInit__fst.

The dependencies come from the system (scripts/install-deps.sh installs
them), or from FST_DEPS_PREFIX, an unpacked copy of the jansson and liburing
-dev packages for a machine that has no headers (scripts/gpu-engines.sh): its
headers and archives are handed to CMake, and jansson is linked as
`-l:libjansson.so.4`, the runtime library installed on that machine (the
prefix's libjansson.so points at a file it lacks).
"""
import os
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
LIB_BUILD = os.path.join(HERE, "build", "python-lib")
LIBFST = os.path.join(LIB_BUILD, "libfst.a")


def cmake_options():
    """The cache options (-D, -U) of libfst's configuration for the extension."""
    options = ["-DFST_TESTS=OFF", "-DFST_CLI=OFF"]
    prefix = os.environ.get("FST_DEPS_PREFIX", "")
    if prefix:
        include = os.path.join(prefix, "usr/include")
        lib = os.path.join(prefix, "usr/lib/x86_64-linux-gnu")
        options += [f"-DJANSSON_INCLUDE:PATH={include}", f"-DURING_INCLUDE:PATH={include}",
                    f"-DJANSSON_STATIC:FILEPATH={lib}/libjansson.a",
                    f"-DURING_STATIC:FILEPATH={lib}/liburing.a",
                    # a library name for the linker, not a path (so typed STRING)
                    "-DJANSSON_SHARED:STRING=:libjansson.so.4"]
    else:  # found again: none stays in the cache from a build with FST_DEPS_PREFIX
        options += ["-U", "JANSSON_*", "-U", "URING_*"]
    return options


def cmake_cache(name):
    """A variable of build/python-lib's CMake cache (NAME:TYPE=VALUE lines)."""
    with open(os.path.join(LIB_BUILD, "CMakeCache.txt")) as f:
        for line in f:
            key, sep, value = line.rstrip("\n").partition("=")
            if sep and key.split(":")[0] == name:
                return value
    raise RuntimeError(f"{name} is not in {LIB_BUILD}/CMakeCache.txt")


def build_libfst(jobs=None):
    """Configure (again: it is cheap, and picks up changes) and build libfst.a."""
    for tool in ("cmake", "ninja"):
        if not shutil.which(tool):
            raise RuntimeError(f"building fst's extension needs {tool} on the PATH "
                               "(scripts/install-deps.sh installs it)")
    subprocess.check_call(["cmake", "-S", HERE, "-B", LIB_BUILD, "-G", "Ninja"]
                          + cmake_options())
    subprocess.check_call(["cmake", "--build", LIB_BUILD, "--target", "fst_static"]
                          + (["-j", str(int(jobs))] if jobs else []))


class BuildExtOverLibfst(build_ext):
    """build_ext that first builds libfst, then links the extension to it."""

    def run(self):
        build_libfst(self.parallel)
        jansson = cmake_cache("JANSSON_SHARED")  # a path, or ":libjansson.so.4"
        for ext in self.extensions:
            ext.extra_objects = [LIBFST, cmake_cache("URING_STATIC")]
            if jansson.startswith(":"):
                ext.libraries = [jansson] + ext.libraries
            else:
                ext.extra_objects.append(jansson)
            ext.depends = ext.depends + [LIBFST]  # relinked when libfst changes
        super().run()


setup(
    options={"build": {"build_base": "build/python"}},
    cmdclass={"build_ext": BuildExtOverLibfst},
    ext_modules=[Extension(
        "fst._fst",
        sources=["python/fst/_fst.c", "python/fst/_fst_checkpoint.c",
                 "python/fst/_fst_tensor.c", "python/fst/_fst_load.c",
                 "python/fst/_fst_comm.c", "python/fst/_fst_writer.c"],
        depends=["python/fst/_fst.h", "include/fst.h"],
        include_dirs=[os.path.join(HERE, "include")],
        libraries=["dl", "pthread"],
        define_macros=[("_GNU_SOURCE", None)],
        extra_compile_args=["-std=c11", "-fvisibility=hidden", "-O2", "-Wall", "-Wextra",
                            "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
        extra_link_args=["-Wl,--exclude-libs,ALL"],
    )],
)
