#include "common/status.h"

#include <stdarg.h>
#include <stdio.h>

int accelsim_abi_version(void) { return ACCELSIM_ABI_VERSION; }

#if defined(__GNUC__)
int accel_stop_flag = 0;

void accelsim_request_stop(void) { __atomic_store_n(&accel_stop_flag, 1, __ATOMIC_SEQ_CST); }
void accelsim_clear_stop(void) { __atomic_store_n(&accel_stop_flag, 0, __ATOMIC_SEQ_CST); }
#else
volatile int accel_stop_flag = 0;

void accelsim_request_stop(void) { accel_stop_flag = 1; }
void accelsim_clear_stop(void) { accel_stop_flag = 0; }
#endif

int accelsim_stop_requested(void) { return accel_should_stop(); }

int accel_interrupted(accel_err *e, const char *what, uint64_t index, const char *name, uint64_t cycle)
{
    return accel_fail(e, ACCEL_ERR_INTERRUPTED, "interrupted at %s %llu (%s), cycle %llu", what,
                      (unsigned long long)index, name ? name : "?", (unsigned long long)cycle);
}

const char *accel_status_name(int code)
{
    switch (code) {
    case ACCEL_OK: return "ok";
    case ACCEL_ERR_ARG: return "argument";
    case ACCEL_ERR_CONFIG: return "config";
    case ACCEL_ERR_DECODE: return "decode";
    case ACCEL_ERR_BOUNDS: return "bounds";
    case ACCEL_ERR_PROTOCOL: return "protocol";
    case ACCEL_ERR_BUDGET: return "budget";
    case ACCEL_ERR_IO: return "io";
    case ACCEL_ERR_NOMEM: return "nomem";
    case ACCEL_ERR_INTERRUPTED: return "interrupted";
    default: return "unknown";
    }
}

void accel_err_init(accel_err *e, char *buf, uint64_t len)
{
    e->buf = buf;
    e->len = (buf && len > 0) ? (len > (uint64_t)SIZE_MAX ? SIZE_MAX : (size_t)len) : 0;
    e->code = ACCEL_OK;
    if (e->len)
        e->buf[0] = '\0';
}

int accel_fail(accel_err *e, int code, const char *fmt, ...)
{
    if (e->code != ACCEL_OK)
        return e->code;
    e->code = code;
    if (e->len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->buf, e->len, fmt, ap);
        va_end(ap);
        /* keep the message on one line */
        for (char *p = e->buf; *p; p++)
            if (*p == '\n' || *p == '\r')
                *p = ' ';
    }
    return code;
}
