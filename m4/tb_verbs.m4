# TB_CHECK_VERBS: the verbs API header, and which library to load at run time.
#
# tbrdma never links the verbs library: it dlopen()s it, so one build runs on
# machines without RDMA (the component then disqualifies itself).  Only the
# header is needed at build time.
AC_DEFUN([TB_CHECK_VERBS], [
    AC_ARG_WITH([verbs],
        [AS_HELP_STRING([--with-verbs=DIR],
            [verbs installation (DIR/include/infiniband/verbs.h); default: the system's])])
    AC_ARG_WITH([verbs-library],
        [AS_HELP_STRING([--with-verbs-library=NAME],
            [library dlopen()ed at run time (default: /usr/lib/librdma.dylib on macOS,
             libibverbs.so.1 elsewhere); overridable at run time too])])

    AS_IF([test -n "$with_verbs" && test "$with_verbs" != yes && test "$with_verbs" != no],
          [CPPFLAGS="$CPPFLAGS -I$with_verbs/include"])
    AS_IF([test "$with_verbs" = no],
          [AC_MSG_ERROR([tbrdma needs the verbs API; --without-verbs is not possible])])

    AC_CHECK_HEADER([infiniband/verbs.h], [],
        [AC_MSG_ERROR([infiniband/verbs.h not found. Install the verbs headers
  (Debian/Ubuntu: apt-get install libibverbs-dev; Fedora: dnf install rdma-core-devel;
  macOS 26.2+: the SDK's infiniband/verbs.h, Xcode command line tools) or pass --with-verbs=DIR.])])

    AC_MSG_CHECKING([for the verbs library to load at run time])
    AS_IF([test -n "$with_verbs_library" && test "$with_verbs_library" != yes],
          [TB_VERBS_LIBRARY=$with_verbs_library],
          [case "$host_os" in
               darwin*) TB_VERBS_LIBRARY=/usr/lib/librdma.dylib ;;
               *) AS_IF([test -n "$with_verbs" && test -e "$with_verbs/lib/libibverbs.so.1"],
                        [TB_VERBS_LIBRARY=$with_verbs/lib/libibverbs.so.1],
                        [TB_VERBS_LIBRARY=libibverbs.so.1]) ;;
           esac])
    AC_MSG_RESULT([$TB_VERBS_LIBRARY])
    AC_DEFINE_UNQUOTED([TB_VERBS_LIBRARY], ["$TB_VERBS_LIBRARY"],
                       [verbs library dlopen()ed by default])
    AC_SUBST([TB_VERBS_LIBRARY])
])
