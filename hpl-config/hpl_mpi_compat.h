/*
 * MPI-3.0 removed MPI_Address and MPI_Type_struct, and Open MPI 4.1/5.0
 * no longer declare them; the HPL inside HPCC 1.5.0 still calls them
 * (netlib's HPL 2.3 does not). build-hpl force-includes this header
 * (-include) when compiling HPCC's HPL: the MPI-2 replacements take the
 * same arguments.
 */
#ifndef HPL_MPI_COMPAT_H
#define HPL_MPI_COMPAT_H
#include <mpi.h>
#undef MPI_Address
#define MPI_Address MPI_Get_address
#undef MPI_Type_struct
#define MPI_Type_struct MPI_Type_create_struct
#endif
