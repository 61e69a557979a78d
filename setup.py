"""Builds the fst extension, fst._fst, over libfst's one build, and the fst command.

libfst is CMake's: setup.py configures BUILD/python-lib (-DFST_TESTS=OFF),
builds its fst_static target with Ninja (position-independent objects,
hidden symbols, the project's warnings as errors; CMakeLists.txt's
FST_SOURCES is the one list of libfst's sources) and links the extension
against that archive. With the command (FST_CLI, below) it builds fst_cli
too, and ships it as the distribution's script: pip puts the binary itself
on the PATH (bin/fst), so it runs with its own arguments, exit codes and
signal dispositions (a Python launcher would start with SIGPIPE ignored).
cmake and ninja must be on the PATH; ninja's parallelism is its own unless
CMAKE_BUILD_PARALLEL_LEVEL or `build_ext -j` says otherwise.

The extension links what CMakeLists.txt links libfst.so with, taken from the
CMake cache: liburing statically (URING_STATIC), so it runs where liburing is
not installed, and jansson as JANSSON_SHARED says: a shared library (Debian's
libjansson.a is not position-independent), or the wheel's archive. Only
PyInit__fst is exported (python/fst/_fst.map); everything else, libfst's,
jansson's and liburing's symbols included, stays inside the extension.

Environment:
  FST_BUILD_DIR    where to build (default build/): BUILD/python-lib is
                   libfst's CMake tree, BUILD/python setuptools' build base
  FST_CMAKE_ARGS   more CMake configure options (shell words), after setup.py's
  FST_CLI          1: build and ship the fst command (its OpenSSL libcrypto.a
                   and xxhash.h must be found), 0: not; unset: when they are
                   found (without FST_DEPS_PREFIX)
  FST_DEPS_PREFIX  an unpacked copy of the jansson and liburing -dev packages
                   for a machine that has no headers (scripts/gpu-engines.sh):
                   its headers and archives are handed to CMake, and jansson is
                   linked as `-l:libjansson.so.4`, the runtime library installed
                   on that machine (the prefix's libjansson.so points at a file
                   it lacks)
scripts/build-wheel.sh (`make wheel`) sets these, CC and LDSHARED to build
the binary wheel with zig for glibc 2.28 (docs/design.md, "Distribution").

Where something is missing, the build stops at once naming it (cmake, ninja,
a C compiler, the jansson and liburing headers and libraries) and the
package that provides it.
"""
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from distutils.command.build_scripts import build_scripts  # setuptools' own distutils

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, os.environ.get("FST_BUILD_DIR") or "build")
LIB_BUILD = os.path.join(BUILD, "python-lib")
LIBFST = os.path.join(LIB_BUILD, "libfst.a")
CLI = os.path.join(LIB_BUILD, "fst")
DEPS_PREFIX = os.environ.get("FST_DEPS_PREFIX", "")
EXTRA_CMAKE_ARGS = shlex.split(os.environ.get("FST_CMAKE_ARGS", ""))

# What the build needs, as the compiler finds it: (kind, name, what provides it).
LIB_NEEDS = [
    ("header", "jansson.h", "jansson (Debian/Ubuntu: libjansson-dev; Fedora: jansson-devel)"),
    ("library", "libjansson.so", "jansson (Debian/Ubuntu: libjansson-dev; Fedora: jansson-devel)"),
    ("header", "liburing.h", "liburing (Debian/Ubuntu: liburing-dev; Fedora: liburing-devel)"),
    ("library", "liburing.a", "liburing (Debian/Ubuntu: liburing-dev; Fedora: liburing-devel)"),
]
CLI_NEEDS = [
    ("header", "openssl/evp.h", "OpenSSL (Debian/Ubuntu: libssl-dev)"),
    ("library", "libcrypto.a", "OpenSSL's static libcrypto (Debian/Ubuntu: libssl-dev)"),
    ("header", "xxhash.h", "xxHash (Debian/Ubuntu: libxxhash-dev)"),
]


def compiler():
    """The C compiler setuptools will use, as argv."""
    return shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")


def missing(needs):
    """The entries of needs the C compiler does not find (all of them when
    there is no compiler)."""
    cc = compiler()
    if not shutil.which(cc[0]):
        return list(needs)
    out = []
    for kind, name, hint in needs:
        if kind == "header":
            r = subprocess.run(cc + ["-E", "-x", "c", "-", "-o", os.devnull],
                               input=f"#include <{name}>\n", capture_output=True, text=True)
            ok = r.returncode == 0
        else:
            r = subprocess.run(cc + [f"-print-file-name={name}"], capture_output=True, text=True)
            ok = r.returncode == 0 and os.path.isabs(r.stdout.strip())
        if not ok:
            out.append((kind, name, hint))
    return out


def check_tools_and_libraries(needs):
    """Stop, naming every missing tool, header and library, before CMake runs."""
    problems = [f"{tool} (on the PATH; Debian/Ubuntu: apt-get install {pkg}, or pip install {tool})"
                for tool, pkg in (("cmake", "cmake"), ("ninja", "ninja-build"))
                if not shutil.which(tool)]
    cc = compiler()
    if not shutil.which(cc[0]):
        problems.append(f"a C compiler ({cc[0]}: Debian/Ubuntu: build-essential)")
    elif not DEPS_PREFIX and not EXTRA_CMAKE_ARGS:
        problems += [f"{name} ({hint})" for kind, name, hint in missing(needs)]
    elif DEPS_PREFIX:
        for rel in ("usr/include/jansson.h", "usr/include/liburing.h",
                    "usr/lib/x86_64-linux-gnu/liburing.a"):
            if not os.path.exists(os.path.join(DEPS_PREFIX, rel)):
                problems.append(f"{rel} in FST_DEPS_PREFIX={DEPS_PREFIX}")
    if problems:
        sys.exit("fst-loader cannot be built from source here; missing:\n  - "
                 + "\n  - ".join(problems)
                 + "\n(scripts/install-deps.sh installs everything on Debian and Ubuntu; "
                 "the binary wheel, pip install fst-loader, needs none of it)")


def want_cli():
    """Whether to build and ship the fst command (FST_CLI)."""
    v = os.environ.get("FST_CLI", "")
    if v in ("0", "1"):
        return v == "1"
    if "sdist" in sys.argv or DEPS_PREFIX:
        return False
    if EXTRA_CMAKE_ARGS:  # the caller chose the dependencies: CMake finds them or says so
        return True
    absent = missing(CLI_NEEDS)
    if absent:
        print("fst-loader: building without the fst command, which needs "
              + ", ".join(f"{n} ({h})" for _, n, h in absent), file=sys.stderr)
    return not absent


WITH_CLI = want_cli()


def cmake_options():
    """The cache options (-D, -U) of libfst's configuration for the extension."""
    options = ["-DFST_TESTS=OFF", f"-DFST_CLI={'ON' if WITH_CLI else 'OFF'}"]
    if DEPS_PREFIX:
        include = os.path.join(DEPS_PREFIX, "usr/include")
        lib = os.path.join(DEPS_PREFIX, "usr/lib/x86_64-linux-gnu")
        options += [f"-DJANSSON_INCLUDE:PATH={include}", f"-DURING_INCLUDE:PATH={include}",
                    f"-DJANSSON_STATIC:FILEPATH={lib}/libjansson.a",
                    f"-DURING_STATIC:FILEPATH={lib}/liburing.a",
                    # a library name for the linker, not a path (so typed STRING)
                    "-DJANSSON_SHARED:STRING=:libjansson.so.4"]
    else:  # found again: none stays in the cache from a build with FST_DEPS_PREFIX
        options += ["-U", "JANSSON_*", "-U", "URING_*"]
    return options + EXTRA_CMAKE_ARGS


def cmake_cache(name):
    """A variable of LIB_BUILD's CMake cache (NAME:TYPE=VALUE lines)."""
    with open(os.path.join(LIB_BUILD, "CMakeCache.txt")) as f:
        for line in f:
            key, sep, value = line.rstrip("\n").partition("=")
            if sep and key.split(":")[0] == name:
                return value
    raise RuntimeError(f"{name} is not in {LIB_BUILD}/CMakeCache.txt")


def build_libfst(jobs=None):
    """Configure (again: it is cheap, and picks up changes) and build libfst.a
    (and the fst command)."""
    check_tools_and_libraries(LIB_NEEDS + (CLI_NEEDS if WITH_CLI else []))
    subprocess.check_call(["cmake", "-S", HERE, "-B", LIB_BUILD, "-G", "Ninja"]
                          + cmake_options())
    targets = ["fst_static"] + (["fst_cli"] if WITH_CLI else [])
    subprocess.check_call(["cmake", "--build", LIB_BUILD, "--target", *targets]
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


class BuildScriptsBinary(build_scripts):
    """build_scripts for the one script, the fst command: a binary, copied as
    it is (distutils would read it as a Python script for its #! line)."""

    def copy_scripts(self):
        self.mkpath(self.build_dir)
        outfiles = []
        for script in self.scripts:
            outfile = os.path.join(self.build_dir, os.path.basename(script))
            self.copy_file(script, outfile)  # its mode kept
            outfiles.append(outfile)
        return outfiles, outfiles


setup(
    options={"build": {"build_base": os.path.relpath(os.path.join(BUILD, "python"), HERE)}},
    cmdclass={"build_ext": BuildExtOverLibfst, "build_scripts": BuildScriptsBinary},
    # The binary, built by build_ext (which runs before build_scripts); the
    # path is relative, as distutils wants it.
    scripts=[os.path.relpath(CLI, HERE)] if WITH_CLI else [],
    ext_modules=[Extension(
        "fst._fst",
        sources=["python/fst/_fst.c", "python/fst/_fst_checkpoint.c",
                 "python/fst/_fst_tensor.c", "python/fst/_fst_load.c",
                 "python/fst/_fst_comm.c", "python/fst/_fst_writer.c"],
        depends=["python/fst/_fst.h", "include/fst.h", "python/fst/_fst.map"],
        include_dirs=[os.path.join(HERE, "include")],
        libraries=["dl", "pthread"],
        define_macros=[("_GNU_SOURCE", None)],
        extra_compile_args=["-std=c11", "-fvisibility=hidden", "-O2", "-Wall", "-Wextra",
                            "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
        extra_link_args=[f"-Wl,--version-script={os.path.join(HERE, 'python/fst/_fst.map')}"],
    )],
)
