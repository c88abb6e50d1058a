#!/bin/sh
# Build-time libraries from .deb files, for a machine where apt cannot
# install (a lent GPU machine with no network): unpack the packages into a
# prefix and print the environment that makes the meson build find them.
#
#   tools/scripts/gpu_debs.sh download DEB_DIR      # where apt works: fetch the .debs
#   tools/scripts/gpu_debs.sh unpack DEB_DIR PREFIX # on the target: unpack, print exports
#   eval "$(tools/scripts/gpu_debs.sh unpack .debs /tmp/hkv-deps)"
#
# The packages: hwloc, oneDNN (dnnl), libnuma and what they load at run time
# (OpenCL ICD loader for dnnl, libudev for hwloc). pkg-config files are
# rewritten to point into PREFIX. The top meson.build finds hwloc and numa
# through pkg-config and dnnl through cc.find_library, which searches
# LIBRARY_PATH and CPATH: all four variables are printed.
set -eu

PKGS="libhwloc15 libhwloc-dev libdnnl2 libdnnl-dev libnuma1 libnuma-dev ocl-icd-libopencl1 libudev1"

usage() {
    echo "usage: $0 download DEB_DIR | $0 unpack DEB_DIR PREFIX" >&2
    exit 2
}

[ $# -ge 2 ] || usage
cmd=$1
debs=$2

case "$cmd" in
download)
    mkdir -p "$debs"
    # apt-get download writes into the current directory; PKGS splits on purpose
    # shellcheck disable=SC2086
    (cd "$debs" && apt-get download $PKGS) >&2
    echo "downloaded into $debs:" >&2
    ls "$debs"/*.deb >&2
    ;;
unpack)
    [ $# -eq 3 ] || usage
    prefix=$3
    command -v dpkg >/dev/null 2>&1 || { echo "$0: dpkg not found" >&2; exit 1; }
    [ -d "$debs" ] || { echo "$0: no folder $debs" >&2; exit 1; }
    mkdir -p "$prefix"
    prefix=$(cd "$prefix" && pwd)
    n=0
    for f in "$debs"/*.deb; do
        [ -e "$f" ] || { echo "$0: no .deb files in $debs" >&2; exit 1; }
        dpkg -x "$f" "$prefix"
        n=$((n + 1))
    done
    for pkg in $PKGS; do
        ls "$debs"/"${pkg}"_*.deb >/dev/null 2>&1 || echo "$0: warning: no ${pkg}_*.deb in $debs" >&2
    done
    # .pc files name /usr: point them into the prefix
    for pc in "$prefix"/usr/lib/*/pkgconfig/*.pc "$prefix"/usr/lib/pkgconfig/*.pc \
              "$prefix"/usr/share/pkgconfig/*.pc; do
        [ -f "$pc" ] || continue
        sed -i -E "s#^(prefix|exec_prefix|libdir|includedir)=/usr#\\1=$prefix/usr#" "$pc"
    done
    multi=
    for dir in "$prefix"/usr/lib/*-linux-gnu; do
        [ -d "$dir" ] && multi=$dir && break
    done
    libs="$prefix/usr/lib"
    [ -n "$multi" ] && libs="$multi:$libs"
    [ -d "$prefix/lib" ] && libs="$libs:$prefix/lib"
    [ -n "$multi" ] && [ -d "$prefix/lib/$(basename "$multi")" ] && libs="$libs:$prefix/lib/$(basename "$multi")"
    pcdirs="$prefix/usr/share/pkgconfig:$prefix/usr/lib/pkgconfig"
    [ -n "$multi" ] && pcdirs="$multi/pkgconfig:$pcdirs"
    echo "# $n packages unpacked into $prefix" >&2
    echo "export PKG_CONFIG_PATH=\"$pcdirs\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}\""
    echo "export LD_LIBRARY_PATH=\"$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
    echo "export LIBRARY_PATH=\"$libs\${LIBRARY_PATH:+:\$LIBRARY_PATH}\""
    echo "export CPATH=\"$prefix/usr/include\${CPATH:+:\$CPATH}\""
    ;;
*)
    usage
    ;;
esac
