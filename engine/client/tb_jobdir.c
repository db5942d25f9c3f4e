/*
 * tbrdma host engine: the job's private directory on a host (tb_jobdir.h).
 */
#include "tb_jobdir.h"

#include <stdio.h>

pid_t tb_jobdir_engine_pid(const char *dir)
{
    char path[600];
    FILE *f;
    int pid = 0;

    snprintf(path, sizeof(path), "%s/%s", dir, TB_ENGINE_PIDFILE);
    f = fopen(path, "r");
    if (NULL == f) {
        return 0;
    }
    if (1 != fscanf(f, "%d", &pid) || pid <= 0) {
        pid = 0;
    }
    fclose(f);
    return (pid_t) pid;
}
