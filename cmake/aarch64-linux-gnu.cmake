# Cross build for 64-bit ARM on Debian multiarch (scripts/build-arm64.sh): the compiler is
# g++-aarch64-linux-gnu, the libraries are the :arm64 packages in /usr/lib/aarch64-linux-gnu, the
# header-only ones (CLI11, nlohmann-json, toml++, Boost, doctest) come from the host. Tests and
# doctest's test discovery run the binaries under qemu-user.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# find_package/find_library look in /usr/lib/aarch64-linux-gnu (not the host's x86_64 directory).
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# pkg-config: the arm64 .pc files, and the architecture-independent ones.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
# -L: the arm64 dynamic loader and libc of the cross toolchain; the :arm64 libraries in
# /usr/lib/aarch64-linux-gnu are found through the host's multiarch paths.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
