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
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# A clean slate: no user or site settings of tbrdma's parameters.
unset OMPI_MCA_btl OMPI_MCA_btl_tbrdma_verbs_library OMPI_MCA_btl_tbrdma_if_include
export OMPI_MCA_btl_tcp_if_include=lo
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
