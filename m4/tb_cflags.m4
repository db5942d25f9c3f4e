# TB_CHECK_CFLAG(FLAG, ACTION-IF-ACCEPTED)
# Runs ACTION-IF-ACCEPTED when the C compiler accepts FLAG without a warning.
AC_DEFUN([TB_CHECK_CFLAG], [
    AC_MSG_CHECKING([whether $CC accepts $1])
    tb_save_CFLAGS=$CFLAGS
    CFLAGS="$CFLAGS -Werror $1"
    AC_COMPILE_IFELSE([AC_LANG_PROGRAM([], [])],
                      [AC_MSG_RESULT([yes])
                       $2],
                      [AC_MSG_RESULT([no])])
    CFLAGS=$tb_save_CFLAGS
])
