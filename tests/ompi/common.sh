# Shared by the tests of the component inside Open MPI (sourced).
# Runs Open MPI on the build tree's component, never an installed one.
set -u
pass=0
fail=0

ok() {
    pass=$((pass + 1))
    echo "ok: $*"
}

not_ok() {
    fail=$((fail + 1))
    echo "FAIL: $*"
}

finish() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}

[ -n "${TB_OMPI_INFO:-}" ] && [ -x "$TB_OMPI_INFO" ] || { echo "ompi_info not found: skipped"; exit 77; }
ompi_bindir=$(dirname "$TB_OMPI_INFO")
tb_component_dir="$TB_BUILDDIR/btl_tbrdma/.libs"
[ -f "$tb_component_dir/mca_btl_tbrdma.so" ] || { echo "component not built"; exit 99; }

# The variable replaces Open MPI's search path, so Open MPI's own directory
# comes too; a directory that does not exist would end the search.
ompi_pkglibdir=$("$TB_OMPI_INFO" --path pkglibdir --parsable | sed -n 's/^path:pkglibdir://p')
[ -d "$ompi_pkglibdir" ] || { echo "Open MPI's component directory '$ompi_pkglibdir' not found"; exit 99; }
OMPI_MCA_mca_base_component_path="$tb_component_dir:$ompi_pkglibdir"
export OMPI_MCA_mca_base_component_path

# A component built with AddressSanitizer (CFLAGS=-fsanitize=address, as in
# tools/test-all) needs the sanitizer's runtime loaded first into Open MPI's
# uninstrumented programs: preload it into ompi_info, mpirun and the ranks
# (mpirun passes the environment on).  Open MPI's own leaks are not ours.
if nm -D --undefined-only "$tb_component_dir/mca_btl_tbrdma.so" 2> /dev/null | grep -q ' __asan_init'; then
    tb_asan_rt=
    for tb_rt in "libclang_rt.asan-$(uname -m).so" libasan.so; do
        tb_rt=$(${TB_CC:-cc} -print-file-name="$tb_rt" 2> /dev/null) || continue
        case $tb_rt in /*) [ -f "$tb_rt" ] && { tb_asan_rt=$tb_rt; break; } ;; esac
    done
    [ -n "$tb_asan_rt" ] ||
        { echo "the component is built with ASan, and '${TB_CC:-cc}' names no ASan runtime to preload"; exit 99; }
    LD_PRELOAD="$tb_asan_rt${LD_PRELOAD:+:$LD_PRELOAD}"
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0:verify_asan_link_order=0"
    export LD_PRELOAD ASAN_OPTIONS
    echo "sanitized component: preloading $tb_asan_rt"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# A clean slate: no user or site settings of tbrdma's parameters.
unset OMPI_MCA_btl OMPI_MCA_btl_tbrdma_verbs_library OMPI_MCA_btl_tbrdma_if_include
export OMPI_MCA_btl_tcp_if_include=lo
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
