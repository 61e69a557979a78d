# Cross-compiling for aarch64 Linux with Debian's cross toolchain
# (gcc-aarch64-linux-gnu) and its multiarch arm64 libraries (libjansson-dev:arm64
# and the rest, in /usr/lib/aarch64-linux-gnu and /usr/include/aarch64-linux-gnu);
# scripts/install-deps.sh installs them. The tests run through qemu-user:
# ctest puts CMAKE_CROSSCOMPILING_EMULATOR before every test program it built.
#   cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# or `make test-aarch64`.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(FST_CROSS_TRIPLE aarch64-linux-gnu)

set(CMAKE_C_COMPILER ${FST_CROSS_TRIPLE}-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE ${FST_CROSS_TRIPLE})

# Libraries and headers: the cross toolchain's own root (its libc) and the
# system's multiarch directories, where the :arm64 packages install; never
# the build machine's x86-64 ones. Programs (python3 for the module check)
# are the build machine's.
set(CMAKE_FIND_ROOT_PATH /usr/${FST_CROSS_TRIPLE} /)
set(CMAKE_LIBRARY_PATH /usr/lib/${FST_CROSS_TRIPLE})
set(CMAKE_INCLUDE_PATH /usr/include/${FST_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${FST_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig)

# The tests run on the arm64 libc that the :arm64 packages bring along
# (libc6:arm64, in /lib/aarch64-linux-gnu, its loader /lib/ld-linux-aarch64.so.1),
# so qemu needs no -L. Not `-L /usr/aarch64-linux-gnu`: that takes the cross
# toolchain's loader, a different build of glibc than the libc.so.6 it then
# finds in /lib/aarch64-linux-gnu, and the pair hangs in the first
# pthread_create.
find_program(FST_QEMU_AARCH64 qemu-aarch64)
if(FST_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${FST_QEMU_AARCH64})
endif()
