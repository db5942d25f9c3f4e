# TB_CHECK_HWLOC: optional hwloc, used to report which cores sit near each device.
AC_DEFUN([TB_CHECK_HWLOC], [
    AC_ARG_WITH([hwloc],
        [AS_HELP_STRING([--with-hwloc(=DIR)],
            [use hwloc to report each device's locality (default: if found)])])
    tb_have_hwloc=no
    HWLOC_CFLAGS=
    HWLOC_LIBS=
    AS_CASE(["$with_hwloc"],
        [no], [],
        [yes|""], [PKG_CHECK_MODULES([HWLOC], [hwloc >= 1.11], [tb_have_hwloc=yes],
                      [AS_IF([test "$with_hwloc" = yes],
                             [AC_MSG_ERROR([hwloc not found (Debian: apt-get install libhwloc-dev; Homebrew: brew install hwloc), or pass --with-hwloc=DIR])])])],
        [HWLOC_CFLAGS="-I$with_hwloc/include"
         HWLOC_LIBS="-L$with_hwloc/lib -lhwloc"
         tb_save_CPPFLAGS=$CPPFLAGS
         CPPFLAGS="$CPPFLAGS $HWLOC_CFLAGS"
         AC_CHECK_HEADER([hwloc.h], [tb_have_hwloc=yes],
             [AC_MSG_ERROR([hwloc.h not found under $with_hwloc/include])])
         CPPFLAGS=$tb_save_CPPFLAGS])
    AS_IF([test "$tb_have_hwloc" = yes],
          [AC_DEFINE([TB_HAVE_HWLOC], [1], [hwloc is available for device locality])])
    AC_SUBST([HWLOC_CFLAGS])
    AC_SUBST([HWLOC_LIBS])
])
