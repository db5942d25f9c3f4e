# TB_CHECK_OMPI: the Open MPI whose BTL interface tbrdma is built against.
#
# Sets OMPI_CPPFLAGS, OMPI_LDFLAGS, OMPI_LIBS, TB_OMPI_VERSION,
# TB_OMPI_BTL_VERSION, TB_MCA_COMPONENT_DIR and TB_MCA_HELP_DIR.
m4_define([TB_BTL_PROG], [AC_LANG_PROGRAM([[#include "opal_config.h"
#include "opal/mca/btl/btl.h"
#include "opal/mca/btl/base/base.h"]], [[return BTL_VERSION;]])])

AC_DEFUN([TB_CHECK_OMPI], [
    AC_ARG_WITH([ompi],
        [AS_HELP_STRING([--with-ompi=PREFIX],
            [Open MPI installed with its devel headers (default: found through
             pkg-config ompi, then mpicc in PATH)])])
    AC_ARG_WITH([ompi-source],
        [AS_HELP_STRING([--with-ompi-source=DIR],
            [source tree of the same Open MPI version, for the few headers some
             distributions' devel packages lack (Debian's Open MPI 5.0)])])
    AC_ARG_WITH([ompi-headers],
        [AS_HELP_STRING([--with-ompi-headers=DIR],
            [Open MPI's headers prepared by tools/ompi-headers from the source
             tarball of the installed version (Homebrew's Open MPI ships none);
             the libraries and ompi_info stay the installed ones])])
    AC_ARG_WITH([mca-component-dir],
        [AS_HELP_STRING([--with-mca-component-dir=DIR],
            [where mca_btl_tbrdma.so is installed (default: Open MPI's pkglibdir,
             from ompi_info); elsewhere, add DIR to mca_base_component_path])])
    AC_ARG_WITH([mca-help-dir],
        [AS_HELP_STRING([--with-mca-help-dir=DIR],
            [where tbrdma's help messages are installed (default: Open MPI's
             pkgdatadir, from ompi_info)])])

    AS_IF([test "$with_ompi" = no],
          [AC_MSG_ERROR([tbrdma is an Open MPI component; --without-ompi is not possible])])

    TB_DISTCHECK_EXTRA_FLAGS=
    AS_IF([test -n "$with_ompi" && test "$with_ompi" != yes],
          [TB_DISTCHECK_EXTRA_FLAGS="--with-ompi=$with_ompi"])
    tb_ompi_path=$PATH
    AS_IF([test -n "$with_ompi" && test "$with_ompi" != yes],
          [AS_IF([test -d "$with_ompi"], [],
                 [AC_MSG_ERROR([--with-ompi=$with_ompi: no such directory])])
           tb_ompi_path=$with_ompi/bin])
    AC_PATH_PROG([OMPI_INFO], [ompi_info], [], [$tb_ompi_path])
    AC_PATH_PROG([OMPI_MPICC], [mpicc], [], [$tb_ompi_path])

    # Where the headers are: mpicc knows best; pkg-config and the prefix are
    # fallbacks for installations without the wrapper compilers.
    tb_ompi_incdirs=
    tb_ompi_libdirs=
    AS_IF([test -n "$OMPI_MPICC"],
          [tb_ompi_incdirs=`$OMPI_MPICC --showme:incdirs 2>/dev/null`
           tb_ompi_libdirs=`$OMPI_MPICC --showme:libdirs 2>/dev/null`])
    AS_IF([test -z "$tb_ompi_incdirs" && test -n "$with_ompi" && test "$with_ompi" != yes],
          [tb_ompi_incdirs="$with_ompi/include $with_ompi/include/openmpi"
           tb_ompi_libdirs="$with_ompi/lib"])
    AS_IF([test -z "$tb_ompi_incdirs" && test -n "$PKG_CONFIG"],
          [tb_ompi_incdirs=`$PKG_CONFIG --cflags-only-I ompi 2>/dev/null | sed 's/-I//g'`
           tb_ompi_libdirs=`$PKG_CONFIG --libs-only-L ompi 2>/dev/null | sed 's/-L//g'`])

    AS_IF([test -n "$with_ompi_headers" && test "$with_ompi_headers" != yes && test "$with_ompi_headers" != no],
          [AS_IF([test -f "$with_ompi_headers/include/openmpi/opal_config.h"], [],
                 [AC_MSG_ERROR([--with-ompi-headers=$with_ompi_headers has no include/openmpi/opal_config.h:
  prepare it with tools/ompi-headers from the installed Open MPI's source tarball])])
           with_ompi_headers=`cd "$with_ompi_headers" && pwd`
           tb_ompi_incdirs="$with_ompi_headers/include $with_ompi_headers/include/openmpi"
           # The bundled packages' directories, as the wrapper compiler names them.
           AS_IF([test -f "$with_ompi_headers/include-dirs"],
                 [for tb_dir in `cat "$with_ompi_headers/include-dirs"`; do
                      tb_ompi_incdirs="$tb_ompi_incdirs $with_ompi_headers/$tb_dir"
                  done])
           TB_DISTCHECK_EXTRA_FLAGS="$TB_DISTCHECK_EXTRA_FLAGS --with-ompi-headers=$with_ompi_headers"])

    AC_MSG_CHECKING([for Open MPI's opal_config.h])
    tb_ompi_confdir=
    for tb_dir in $tb_ompi_incdirs; do
        AS_IF([test -z "$tb_ompi_confdir" && test -f "$tb_dir/opal_config.h"],
              [tb_ompi_confdir=$tb_dir])
    done
    AS_IF([test -z "$tb_ompi_confdir"],
          [AC_MSG_RESULT([not found])
           AC_MSG_ERROR([Open MPI with its devel headers was not found.
  Install it (Debian/Ubuntu: apt-get install libopenmpi-dev openmpi-bin) and make sure
  mpicc is in PATH, or pass --with-ompi=PREFIX.  Homebrew's Open MPI ships no devel
  headers: configure an Open MPI source tree of the same version and pass --with-ompi=
  that install prefix.])])
    AC_MSG_RESULT([$tb_ompi_confdir/opal_config.h])
    AS_IF([test -f "$tb_ompi_confdir/opal/mca/btl/btl.h"], [],
          [AC_MSG_ERROR([$tb_ompi_confdir has opal_config.h but not opal/mca/btl/btl.h: this
  Open MPI was installed without --with-devel-headers. Rebuild it with that option.])])

    OMPI_CPPFLAGS=
    for tb_dir in $tb_ompi_incdirs; do
        OMPI_CPPFLAGS="$OMPI_CPPFLAGS -I$tb_dir"
    done

    # btl.h must compile.  Some packagings need PMIx's headers (Open MPI 5)
    # or headers only found in the source tree (Debian's 5.0 packages).
    tb_save_CPPFLAGS=$CPPFLAGS
    tb_btl_ok=no
    AC_MSG_CHECKING([whether opal/mca/btl/btl.h compiles])
    CPPFLAGS="$tb_save_CPPFLAGS $OMPI_CPPFLAGS"
    AC_COMPILE_IFELSE([TB_BTL_PROG], [tb_btl_ok=yes])
    # Each fallback keeps the flags of the ones before it: Debian's 5.0 needs
    # both PMIx's headers and the source tree's.
    tb_pmix_cflags=
    AS_IF([test "$tb_btl_ok" = no && test -n "$PKG_CONFIG"],
          [tb_pmix_cflags=`$PKG_CONFIG --cflags pmix 2>/dev/null`])
    AS_IF([test "$tb_btl_ok" = no && test -n "$tb_pmix_cflags"],
          [OMPI_CPPFLAGS="$OMPI_CPPFLAGS $tb_pmix_cflags"
           CPPFLAGS="$tb_save_CPPFLAGS $OMPI_CPPFLAGS"
           AC_COMPILE_IFELSE([TB_BTL_PROG], [tb_btl_ok=yes])])
    AS_IF([test "$tb_btl_ok" = no && test -n "$with_ompi_source" && test "$with_ompi_source" != yes],
          [AS_IF([test -d "$with_ompi_source/opal"], [],
                 [AC_MSG_ERROR([--with-ompi-source=$with_ompi_source has no opal/ directory])])
           # After the installed headers, so the source tree only fills gaps.
           OMPI_CPPFLAGS="$OMPI_CPPFLAGS -idirafter $with_ompi_source"
           TB_DISTCHECK_EXTRA_FLAGS="$TB_DISTCHECK_EXTRA_FLAGS --with-ompi-source=$with_ompi_source"
           CPPFLAGS="$tb_save_CPPFLAGS $OMPI_CPPFLAGS"
           AC_COMPILE_IFELSE([TB_BTL_PROG], [tb_btl_ok=yes])])
    AC_MSG_RESULT([$tb_btl_ok])
    AS_IF([test "$tb_btl_ok" = no],
          [AC_MSG_ERROR([opal/mca/btl/btl.h does not compile with $OMPI_CPPFLAGS (see config.log).
  If a header it includes is missing (Debian's libopenmpi-dev 5.0 lacks
  opal/mca/threads/pthreads/*.h and opal/mca/timer/linux/timer_linux.h), unpack the
  same version's source (Debian: apt-get source openmpi) and pass
  --with-ompi-source=DIR.  Open MPI 5 also needs PMIx's headers (libpmix-dev).])])

    AC_COMPUTE_INT([tb_opal_major], [OPAL_MAJOR_VERSION], [[#include "opal_config.h"]])
    AC_COMPUTE_INT([tb_opal_minor], [OPAL_MINOR_VERSION], [[#include "opal_config.h"]])
    AC_COMPUTE_INT([tb_opal_release], [OPAL_RELEASE_VERSION], [[#include "opal_config.h"]])
    AC_COMPUTE_INT([TB_OMPI_BTL_VERSION], [BTL_VERSION], [[#include "opal_config.h"
#include "opal/mca/btl/btl.h"]])
    TB_OMPI_VERSION=$tb_opal_major.$tb_opal_minor.$tb_opal_release
    AC_MSG_CHECKING([for a supported BTL interface])
    AS_CASE(["$TB_OMPI_BTL_VERSION"],
        [310|330], [AC_MSG_RESULT([$TB_OMPI_BTL_VERSION (Open MPI $TB_OMPI_VERSION)])],
        [AC_MSG_RESULT([$TB_OMPI_BTL_VERSION])
         AC_MSG_ERROR([Open MPI $TB_OMPI_VERSION has BTL interface $TB_OMPI_BTL_VERSION;
  tbrdma supports 3.1.0 (Open MPI 4.1) and 3.3.0 (Open MPI 5.0)])])
    CPPFLAGS=$tb_save_CPPFLAGS

    # libopen-pal: its soname (.40 for 4.1, .80 for 5.0) is what keeps a build
    # for one version from loading into the other.
    OMPI_LDFLAGS=
    for tb_dir in $tb_ompi_libdirs; do
        OMPI_LDFLAGS="$OMPI_LDFLAGS -L$tb_dir"
    done
    tb_save_LDFLAGS=$LDFLAGS
    tb_save_LIBS=$LIBS
    LDFLAGS="$LDFLAGS $OMPI_LDFLAGS"
    AC_CHECK_LIB([open-pal], [opal_show_help_add_dir], [OMPI_LIBS=-lopen-pal],
        [AC_MSG_ERROR([libopen-pal not found in $tb_ompi_libdirs (see config.log)])])
    LDFLAGS=$tb_save_LDFLAGS
    LIBS=$tb_save_LIBS

    # Open MPI's inline atomics use 16-byte compare-and-swap when Open MPI
    # was built for it (x86-64: -mcx16); without the same flag the compiler
    # calls a libatomic helper the component cannot load.
    OMPI_CFLAGS=
    tb_save_CPPFLAGS=$CPPFLAGS
    CPPFLAGS="$CPPFLAGS $OMPI_CPPFLAGS"
    AC_COMPUTE_INT([tb_opal_cas128], [OPAL_HAVE_SYNC_BUILTIN_CSWAP_INT128 + 0],
                   [[#include "opal_config.h"]], [tb_opal_cas128=0])
    CPPFLAGS=$tb_save_CPPFLAGS
    AS_IF([test "$tb_opal_cas128" = 1],
          [AC_MSG_CHECKING([for the flag 16-byte compare-and-swap needs])
           AC_LINK_IFELSE([AC_LANG_PROGRAM([[__int128 v;]],
                              [[return __sync_bool_compare_and_swap(&v, (__int128) 0, (__int128) 1);]])],
               [AC_MSG_RESULT([none])],
               [tb_save_CFLAGS=$CFLAGS
                CFLAGS="$CFLAGS -mcx16"
                AC_LINK_IFELSE([AC_LANG_PROGRAM([[__int128 v;]],
                                   [[return __sync_bool_compare_and_swap(&v, (__int128) 0, (__int128) 1);]])],
                    [AC_MSG_RESULT([-mcx16])
                     OMPI_CFLAGS=-mcx16],
                    [AC_MSG_RESULT([unknown])
                     AC_MSG_ERROR([Open MPI uses 16-byte compare-and-swap but $CC cannot link it])])
                CFLAGS=$tb_save_CFLAGS])])

    AC_MSG_CHECKING([where to install the component])
    AS_IF([test -n "$with_mca_component_dir" && test "$with_mca_component_dir" != yes],
          [TB_MCA_COMPONENT_DIR=$with_mca_component_dir],
          [AS_IF([test -z "$OMPI_INFO"],
                 [AC_MSG_ERROR([ompi_info not found: pass --with-mca-component-dir=DIR])])
           TB_MCA_COMPONENT_DIR=`$OMPI_INFO --path pkglibdir --parsable | sed -n 's/^path:pkglibdir://p'`])
    AS_IF([test -z "$TB_MCA_COMPONENT_DIR"],
          [AC_MSG_ERROR([could not ask $OMPI_INFO for pkglibdir: pass --with-mca-component-dir=DIR])])
    AC_MSG_RESULT([$TB_MCA_COMPONENT_DIR])

    AC_MSG_CHECKING([where to install help messages])
    AS_IF([test -n "$with_mca_help_dir" && test "$with_mca_help_dir" != yes],
          [TB_MCA_HELP_DIR=$with_mca_help_dir],
          [AS_IF([test -n "$OMPI_INFO"],
                 [TB_MCA_HELP_DIR=`$OMPI_INFO --path pkgdatadir --parsable | sed -n 's/^path:pkgdatadir://p'`])])
    AS_IF([test -z "$TB_MCA_HELP_DIR"], [TB_MCA_HELP_DIR='${datadir}/tbrdma'])
    AC_MSG_RESULT([$TB_MCA_HELP_DIR])

    AC_SUBST([TB_DISTCHECK_EXTRA_FLAGS])
    AC_SUBST([OMPI_CFLAGS])
    AC_SUBST([OMPI_CPPFLAGS])
    AC_SUBST([OMPI_LDFLAGS])
    AC_SUBST([OMPI_LIBS])
    AC_SUBST([TB_OMPI_VERSION])
    AC_SUBST([TB_OMPI_BTL_VERSION])
    AC_SUBST([TB_MCA_COMPONENT_DIR])
    AC_SUBST([TB_MCA_HELP_DIR])
])
