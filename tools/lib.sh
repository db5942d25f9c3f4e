# shellcheck shell=bash
# Shared by tools/test-all and tools/run-job (sourced): set-up of a Debian
# machine, the build, and reporting.
set -euo pipefail

TB_TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TB_BUILD=${TBRDMA_BUILD_DIR:-$TB_TOP/build/host}

# What the build, the tests and the virtual cluster need from Debian (clang,
# its sanitizer and libFuzzer runtimes and llvm-symbolizer: the sanitized
# unit tests and the fuzz targets).
TB_DEBIAN_PACKAGES=(
    build-essential autoconf automake libtool pkg-config
    libopenmpi-dev openmpi-bin libibverbs-dev check libhwloc-dev
    qemu-system-x86 qemu-utils debootstrap e2fsprogs iproute2 util-linux
    ca-certificates curl file python3 debian-archive-keyring
    clang libclang-rt-14-dev llvm
)

tb_log() {
    printf '\n==> %s\n' "$*"
}

tb_die() {
    printf 'tbrdma: %s\n' "$*" >&2
    exit 1
}

# Install whatever is missing (Debian/Ubuntu, as root); elsewhere say what
# is needed rather than guess a package manager.
tb_install_deps() {
    local missing=() p
    command -v dpkg-query > /dev/null ||
        tb_die "not a Debian-like system: install by hand ${TB_DEBIAN_PACKAGES[*]} (see README.md)"
    for p in "${TB_DEBIAN_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] ||
        tb_die "missing Debian packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})"
    tb_log "installing ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# Configure (once) and build this checkout out of tree in $TB_BUILD.
tb_build() {
    tb_build_in "$TB_BUILD" "$@"
}

# The same in another build directory: tb_build_in DIR [CONFIGURE-ARGUMENTS].
tb_build_in() {
    local dir=$1
    shift
    if [ ! -x "$TB_TOP/configure" ] || [ "$TB_TOP/configure.ac" -nt "$TB_TOP/configure" ]; then
        (cd "$TB_TOP" && ./autogen.sh)
    fi
    mkdir -p "$dir"
    if [ ! -f "$dir/Makefile" ]; then
        (cd "$dir" && "$TB_TOP/configure" "$@")
    fi
    make -C "$dir" -j"$(nproc)"
}

# tb_debian_orig PACKAGE VERSION DIR: the upstream tarball of Debian's source
# package PACKAGE at VERSION, downloaded into DIR from Debian's archive
# (TB_DEBIAN_MIRROR, else apt's mirror) with its description (.dsc), checked against the SHA-256
# the description gives, and kept there for the next run; prints its path.
tb_debian_orig() {
    local pkg=$1 ver=${2#*:} dir=$3 pool sum tarball
    case $pkg in
        lib*) pool=${pkg:0:4} ;;
        *) pool=${pkg:0:1} ;;
    esac
    # The mirror apt uses (deb822 or one-line sources), else Debian's own.
    local mirror=${TB_DEBIAN_MIRROR:-}
    [ -n "$mirror" ] || mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2> /dev/null |
        sed -n -e 's|^URIs:[[:space:]]*\([^[:space:]]*/debian\)/*$|\1|p' \
            -e 's|^deb[[:space:]]\{1,\}\([a-z]*://[^[:space:]]*/debian\)/*[[:space:]].*|\1|p' | head -1) || true
    pool=${mirror:-http://deb.debian.org/debian}/pool/main/$pool/$pkg
    mkdir -p "$dir" || return 1
    tb_fetch() {
        curl -fsSL --retry 3 -o "$dir/$1.part" "$pool/$1" && mv "$dir/$1.part" "$dir/$1"
    }
    [ -s "$dir/${pkg}_$ver.dsc" ] || tb_fetch "${pkg}_$ver.dsc" ||
        tb_die "cannot download $pool/${pkg}_$ver.dsc (Debian's archive keeps only current versions)"
    read -r sum tarball < <(awk '/^Checksums-Sha256:/ { on = 1; next } /^[^ ]/ { on = 0 }
        on && $3 ~ /\.orig\.tar\./ { print $1, $3; exit }' "$dir/${pkg}_$ver.dsc")
    [ -n "${tarball:-}" ] || tb_die "${pkg}_$ver.dsc names no upstream tarball"
    if ! (cd "$dir" && echo "$sum  $tarball" | sha256sum -c --quiet > /dev/null 2>&1); then
        tb_fetch "$tarball" || tb_die "cannot download $pool/$tarball"
        (cd "$dir" && echo "$sum  $tarball" | sha256sum -c --quiet > /dev/null 2>&1) ||
            { rm -f "$dir/$tarball"; tb_die "$tarball does not match the SHA-256 in ${pkg}_$ver.dsc"; }
    fi
    printf '%s\n' "$dir/$tarball"
}
