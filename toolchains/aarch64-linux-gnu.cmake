# Cross toolchain for 64-bit Arm Linux boards with Debian's crossbuild-essential-arm64 (gcc 12 on
# bookworm): `apt-get install crossbuild-essential-arm64`. `bmoe-edge build --board X` passes this file
# as CMAKE_TOOLCHAIN_FILE when the profile's arch is aarch64 and this machine's is not.
#
# The target's C library, libstdc++ and kernel headers come with the cross compiler
# (/usr/aarch64-linux-gnu, glibc 2.36 on bookworm); the target's Python headers come from Debian's
# arm64 libpython3.X-dev, unpacked into the board sysroot by bmoe_edge/boards/sysroot.py and passed to
# CMake as Python_INCLUDE_DIR (the build also sets the extension suffix and wheel tag explicitly).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(_bmoe_triple aarch64-linux-gnu)
find_program(CMAKE_C_COMPILER NAMES ${_bmoe_triple}-gcc ${_bmoe_triple}-gcc-12 REQUIRED)
find_program(CMAKE_CXX_COMPILER NAMES ${_bmoe_triple}-g++ ${_bmoe_triple}-g++-12 REQUIRED)
set(CMAKE_C_COMPILER_TARGET ${_bmoe_triple})
set(CMAKE_CXX_COMPILER_TARGET ${_bmoe_triple})
find_program(CMAKE_AR NAMES ${_bmoe_triple}-gcc-ar ${_bmoe_triple}-ar)
find_program(CMAKE_RANLIB NAMES ${_bmoe_triple}-gcc-ranlib ${_bmoe_triple}-ranlib)
find_program(CMAKE_STRIP NAMES ${_bmoe_triple}-strip)

# Libraries and headers from the target's root only; programs (ccache, python, patch) from this
# machine. Packages (nanobind's CMake config lives in the host venv) from both.
set(CMAKE_FIND_ROOT_PATH /usr/${_bmoe_triple})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
