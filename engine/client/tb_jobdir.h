/*
 * tbrdma host engine: the job's private directory on a host.
 *
 * Every process of one job on one host meets there: the engine listens on
 * its socket, the job's key is a file only the user can read, the lock
 * decides which rank starts the engine, and the pid file names the engine
 * that owns the directory.  Ranks (tb_eclient) and the engine (daemon) both
 * use it.
 */
#ifndef TB_JOBDIR_H
#define TB_JOBDIR_H

#include <sys/types.h>

/* File names in the job's directory. */
#define TB_ENGINE_SOCKET "engine.sock"
#define TB_ENGINE_KEY "key"
#define TB_ENGINE_LOCK "lock"
#define TB_ENGINE_PIDFILE "engine.pid"

/* The engine that owns dir (from its pid file), or 0. */
pid_t tb_jobdir_engine_pid(const char *dir);

#endif /* TB_JOBDIR_H */
